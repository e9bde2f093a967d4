// The memory benchmark's sweep: its options, the dimensions it crosses (one table row each, so a
// new dimension such as offload or activation checkpointing is one line) and the DeepSpeed-style
// config each point of the sweep runs with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_line.h"

namespace zeroshard::bench {

/// One axis of the sweep: its name (a CSV column), the option that lists its values, the values
/// swept by default, and how a value changes the engine's config.
struct Dimension {
  const char* name;
  const char* option;
  std::vector<std::string> defaults;
  /// Throws UsageError naming the option for a value it does not know.
  void (*apply)(nlohmann::json& config, const std::string& value);
};

/// stage, precision, offload_optimizer, offload_param, checkpoint_every.
const std::vector<Dimension>& dimensions();

/// Where the NVMe rows put their swap files: under the working directory (the build tree when run
/// by ctest), a local file system that takes O_DIRECT. The driver removes it after the sweep.
inline constexpr const char* kNvmeSwapFolder = "memory_bench_nvme_swap";

/// Everything the driver and its workers agree on; the worker gets it through the same command
/// line.
struct BenchOptions {
  // The model: the synthetic one (params in `tensors` equal tensors) unless `layers` > 0, which
  // selects the MLP example.
  std::int64_t params = 16'000'000;
  int tensors = 16;
  int layers = 0;
  int width = 1024;
  int inputs = 64;
  int classes = 10;
  int micro_batch = 32;
  /// gpt_layers > 0 selects the GPT example instead: that many blocks of gpt_channels channels
  /// and gpt_heads heads, context gpt_seq, a byte vocabulary, micro_batch sequences per step.
  int gpt_layers = 0;
  int gpt_channels = 128;
  int gpt_heads = 4;
  int gpt_seq = 64;

  std::vector<int> world_sizes = {1, 2, 3, 4};
  /// Values per dimension, parallel to dimensions().
  std::vector<std::vector<std::string>> values;

  // Engine knobs the sweep holds fixed. The defaults of the last two make the paper's formulas
  // apply as they stand: every tensor sharded at stage 3, and modules gathered again for
  // backward (3P communicated).
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t persistence_threshold = 0;
  std::int64_t max_reuse_distance = 0;

  int warmup_steps = 1;
  int timed_steps = 3;

  std::string out_dir = "memory_bench_results";
  std::string csv;   ///< default out_dir/memory_bench.csv
  std::string json;  ///< default out_dir/memory_bench.json
  bool plot = true;
  std::string mpirun = "mpirun";
  std::string mpirun_flags =
      "--allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader "
      "--mca btl_vader_single_copy_mechanism none";

  /// Set in a worker: the folder it writes its per-rank results to.
  std::string worker_dir;
  /// The command line as given, for the record.
  std::vector<std::string> arguments;

  bool mlp() const { return layers > 0; }
  bool gpt() const { return gpt_layers > 0; }
  /// "synthetic: 16.00M parameters in 16 tensors" or "MLP example: 64 -> 8 x 1024 -> 10".
  std::string model_description() const;
};

/// Adds the benchmark's flags to `app`, storing into `options`, which also keeps the command
/// line `argv` (the driver hands it on to its workers).
void add_flags(CLI::App& app, BenchOptions& options, int argc, char** argv);

/// One point of the sweep: a value of every dimension, in dimensions() order.
struct Configuration {
  std::vector<std::string> values;
  /// "stage=1 precision=bf16 offload_optimizer=none".
  std::string label() const;
  const std::string& value(const char* dimension) const;
};

/// Every combination of the swept values, the first dimension varying slowest.
std::vector<Configuration> configurations(const BenchOptions& options);

/// The DeepSpeed-style config of one configuration (micro batch, AdamW, the ZeRO knobs above and
/// every dimension applied).
nlohmann::json engine_config(const BenchOptions& options, const Configuration& configuration);

}  // namespace zeroshard::bench
