// zeroshard-nvme-step-bench: the optimizer step with the master weights and Adam states on NVMe,
// alternated round by round with its three stages run alone (read every sub-group, update with
// the states in host memory, write every sub-group) and with the drive reading and writing at
// once (every record, and the records the step moves), so that step / max(stage) and step /
// floor compare figures taken under the same load; the step is split into read waits, update,
// write waits and the rest.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench_median.h"
#include "command_line.h"
#include "engine/engine_internals.h"
#include "offload/nvme_swapper.h"
#include "zeroshard/quantity.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::bench::median;

using namespace zeroshard;

constexpr const char* kDescription =
    "The optimizer step with the master weights and Adam states on NVMe, alternated round by "
    "round with its stages alone (reads, the update with the states in host memory, writes); "
    "prints medians, step / max(stage) and the step split into read waits, update, write waits "
    "and the rest.";

struct Options {
  std::int64_t params = 64 << 20;
  std::int64_t sub_group = 4 << 20;
  std::int64_t buffers = 4;
  std::int64_t queue_depth = AioConfig{}.queue_depth;
  int rounds = 5;
  std::string dir = "nvme_step_bench_swap";
  bool check = false;
};

Config config_for(const Options& options, OffloadDevice device) {
  Config config;
  config.train_micro_batch_size_per_gpu = 1;
  config.steps_per_print = 0;
  config.gradient_clipping = 0.0;
  config.zero_optimization.stage = 1;
  config.zero_optimization.sub_group_size = options.sub_group;
  config.aio.queue_depth = options.queue_depth;
  OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  offload.device = device;
  if (device == OffloadDevice::kNvme) {
    offload.nvme_path = options.dir;
    offload.buffer_count = options.buffers;
    offload.pipeline_read = true;
    offload.pipeline_write = true;
  }
  return config;
}

/// The seconds of one pipelined step, split so that the parts add up to it.
struct StepSplit {
  double total = 0.0;  ///< the engine's update: gradient scan, the pass, the write-back
  double read_wait = 0.0;
  double update = 0.0;  ///< the rule on the acquired sub-groups
  double write_wait = 0.0;
  std::int64_t bytes_read = 0;  ///< swap records the step read, in bytes
  std::int64_t bytes_written = 0;
  double other() const { return total - read_wait - update - write_wait; }
};

/// One engine trained on 8 equal tensors of constant gradients.
class Trainer {
 public:
  Trainer(const Options& options, OffloadDevice device)
      : engine_(config_for(options, device), Communicator::from_environment(), make_adamw()) {
    const int tensors = 8;
    for (int t = 0; t < tensors; ++t) {
      params_.push_back(engine_.register_parameter("layer" + std::to_string(t) + ".weight",
                                                   {options.params / tensors}));
    }
    engine_.finalize();
  }

  /// One step; returns its update's seconds, split.
  StepSplit step() {
    detail::EngineState& state = detail::EngineInternals::state(engine_);
    for (const Parameter& p : params_) {
      float* grad = p.grad();
      std::fill(grad, grad + p.numel(), 1e-3f * static_cast<float>(++step_ % 7 + 1));
      engine_.grad_ready(p);
    }
    const double update_before = state.times().update;
    const detail::SwapTimes io_before = state.optimizer().swap_times();
    engine_.step();
    const detail::SwapTimes io = state.optimizer().swap_times();
    StepSplit split;
    split.total = state.times().update - update_before;
    split.read_wait = io.read_wait - io_before.read_wait;
    split.update = io.update - io_before.update;
    split.write_wait = io.write_wait - io_before.write_wait;
    split.bytes_read = io.bytes_read - io_before.bytes_read;
    split.bytes_written = io.bytes_written - io_before.bytes_written;
    // Resident, the whole update is the rule.
    if (!state.optimizer().swaps()) split.update = split.total;
    return split;
  }

  MemoryReport memory_report() const { return engine_.memory_report(); }
  /// The rank's shard, padding included: the elements its swap files hold.
  std::int64_t owned_elements() {
    const detail::EngineState& state = detail::EngineInternals::state(engine_);
    return state.optimizer().owned_end() - state.optimizer().owned_begin();
  }

 private:
  Engine engine_;
  std::vector<Parameter> params_;
  int step_ = 0;
};

/// Swap files shaped as the engine's (one of master tiles, one of Adam's two states per tile),
/// with the same buffers and aio settings, read or written alone: every file keeps up to
/// buffer_count records in flight and is polled without pause, so the figure is the drive's
/// (and the checksums') at this depth with nothing else to do.
class StageFiles {
 public:
  StageFiles(const Options& options, std::int64_t elements, const char* name) {
    tiles_ = (elements + options.sub_group - 1) / options.sub_group;
    buffers_ = static_cast<int>(options.buffers);
    for (const auto& [kind, arrays] : {std::pair{"master", 1}, std::pair{"states", 2}}) {
      detail::NvmeSwapperOptions swapper;
      swapper.directory = options.dir;
      swapper.kind = std::string(name) + "_" + kind;
      swapper.run_id = 1;
      swapper.slot_count = tiles_;
      swapper.slot_bytes = arrays * options.sub_group * static_cast<std::int64_t>(sizeof(float));
      swapper.buffer_count = buffers_;
      swapper.aio.queue_depth = options.queue_depth;
      files_.push_back(std::make_unique<detail::NvmeSwapper>(swapper));
    }
  }

  /// The records (tiles) of every file, or the first `tiles` of each, read or written.
  struct Job {
    StageFiles* files = nullptr;
    bool write = false;
    std::int64_t tiles = -1;  ///< -1: all
  };

  /// Seconds to write (or read) every record of every file.
  double run(bool write) { return run_together({{this, write}}); }

  /// Seconds to run every job's reads or writes at the same time.
  static double run_together(const std::vector<Job>& jobs) {
    const auto start = std::chrono::steady_clock::now();
    struct Progress {
      detail::NvmeSwapper* file = nullptr;
      bool write = false;
      std::int64_t tiles = 0;
      int buffers = 1;
      std::int64_t started = 0;
      std::int64_t finished = 0;
      std::deque<detail::SwapTicket> tickets;
    };
    std::vector<Progress> progress;
    for (const Job& job : jobs) {
      for (const auto& file : job.files->files_) {
        Progress p;
        p.file = file.get();
        p.write = job.write;
        p.tiles = job.tiles < 0 ? job.files->tiles_ : job.tiles;
        p.buffers = job.files->buffers_;
        progress.push_back(std::move(p));
      }
    }
    for (bool busy = true; busy;) {
      busy = false;
      for (Progress& p : progress) {
        for (; p.started < p.tiles && p.started - p.finished < p.buffers; ++p.started) {
          const int buffer = static_cast<int>(p.started % p.buffers);
          p.tickets.push_back(p.write ? p.file->write(p.started, buffer)
                                      : p.file->read(p.started, buffer));
        }
        p.file->poll();
        for (; !p.tickets.empty() && p.file->done(p.tickets.front()); ++p.finished) {
          p.file->wait(p.tickets.front());  // a read checks its record's checksum here
          p.tickets.pop_front();
        }
        busy = busy || p.finished < p.tiles;
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  std::int64_t bytes() const { return tiles_ * tile_bytes(); }
  /// One record of each file: the bytes one sub-group moves.
  std::int64_t tile_bytes() const {
    std::int64_t total = 0;
    for (const auto& file : files_) total += file->record_bytes();
    return total;
  }
  std::int64_t tiles() const noexcept { return tiles_; }

 private:
  std::int64_t tiles_ = 0;
  int buffers_ = 1;
  std::vector<std::unique_ptr<detail::NvmeSwapper>> files_;
};

void add_flags(CLI::App& app, Options& options) {
  // A count such as 64M or 4e6, at least `low`.
  const auto count = [](std::int64_t& field, const char* flag, std::int64_t low) {
    return [&field, flag, low](const std::string& text) {
      field = parse_count(text, flag);
      if (field < low) {
        throw UsageError(std::string(flag) + ": got " + text + ", expected at least " +
                         std::to_string(low));
      }
    };
  };
  cli::add_read_option(app, "--params", count(options.params, "--params", 8),
                       "trainable fp32 parameters, in 8 tensors (default 64M)")
      ->type_name("P");
  cli::add_read_option(app, "--sub-group", count(options.sub_group, "--sub-group", 1),
                       "sub_group_size: elements per swap record (default 4M)")
      ->type_name("S");
  cli::add_read_option(app, "--buffers", count(options.buffers, "--buffers", 1),
                       "offload_optimizer.buffer_count (default 4)")
      ->type_name("B");
  cli::add_read_option(app, "--queue-depth", count(options.queue_depth, "--queue-depth", 1),
                       "aio.queue_depth, for the step and the stages alone (default 8)")
      ->type_name("Q");
  cli::add_integer(app, "--steps", options.rounds,
                   "timed rounds, each a pipelined step and each stage alone, after one untimed")
      ->capture_default_str();
  app.add_option("--dir", options.dir, "nvme_path, created if missing")
      ->type_name("PATH")
      ->capture_default_str();
  app.add_flag("--check", options.check,
               "exit 1 unless every figure is positive and finite and the split adds up (for the "
               "test suite)");
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, "zeroshard-nvme-step-bench");
  add_flags(app, options);
  if (const std::optional<int> exit_code = cli::parse(app, argc, argv)) return *exit_code;
  try {
    if (options.rounds < 1)
      throw UsageError("--steps: got " + std::to_string(options.rounds) + ", expected at least 1");
    std::filesystem::create_directories(options.dir);
    std::printf(
        "zeroshard-nvme-step-bench: %s fp32 parameters, AdamW, stage 1 on 1 CPU rank, "
        "sub_group_size %s, buffer_count %lld, nvme_path %s; %d rounds of: pipelined step, "
        "reads alone, update alone (states in host memory), writes alone\n",
        format_count(options.params).c_str(), format_count(options.sub_group).c_str(),
        static_cast<long long>(options.buffers), options.dir.c_str(), options.rounds);
    Trainer nvme(options, OffloadDevice::kNvme);
    Trainer host(options, OffloadDevice::kCpu);
    StageFiles stage(options, nvme.owned_elements(), "stage");
    // A second set, written while the first is read: the drive doing both of a step's transfers.
    StageFiles other(options, nvme.owned_elements(), "stage_other");
    // Untimed: the first step writes the engine's records, the first writes the stages'.
    nvme.step();
    host.step();
    stage.run(true);
    other.run(true);
    stage.run(false);

    std::vector<StepSplit> steps;
    std::vector<double> step_s, reads_s, update_s, writes_s, both_s, step_io_s;
    std::int64_t step_reads = 0;
    std::int64_t step_writes = 0;
    for (int r = 0; r < options.rounds; ++r) {
      steps.push_back(nvme.step());
      step_s.push_back(steps.back().total);
      reads_s.push_back(stage.run(false));
      update_s.push_back(host.step().total);
      writes_s.push_back(stage.run(true));
      both_s.push_back(StageFiles::run_together({{&stage, false}, {&other, true}}));
      // The records this step moved (a step need not read the sub-groups the one before left in
      // its buffers), read and written at once as above.
      step_reads = steps.back().bytes_read / stage.tile_bytes();
      step_writes = steps.back().bytes_written / stage.tile_bytes();
      step_io_s.push_back(
          StageFiles::run_together({{&stage, false, step_reads}, {&other, true, step_writes}}));
    }
    const double step = median(step_s);
    const double reads = median(reads_s);
    const double update = median(update_s);
    const double writes = median(writes_s);
    const double both = median(both_s);
    const double step_io = median(step_io_s);
    const double slowest = std::max({reads, update, writes});
    // The split of the round whose step is the median (or next above it): its parts add up.
    const auto middle = std::min_element(steps.begin(), steps.end(), [&](auto& a, auto& b) {
      const auto above = [&](const StepSplit& s) {
        return s.total >= step ? s.total - step : 1e30;
      };
      return above(a) < above(b);
    });
    const double gb = static_cast<double>(stage.bytes()) / 1e9;
    std::printf("medians of %d alternated rounds, seconds:\n", options.rounds);
    std::printf("  pipelined step      %8.3f\n", step);
    std::printf("  reads alone         %8.3f  (%.2f GB/s, checksums checked)\n", reads, gb / reads);
    std::printf("  update alone        %8.3f  (states in host memory)\n", update);
    std::printf("  writes alone        %8.3f  (%.2f GB/s, checksums computed)\n", writes,
                gb / writes);
    std::printf("  reads + writes at once %5.3f  (every record read while as many are written)\n",
                both);
    std::printf(
        "  the step's I/O at once %5.3f  (%lld of %lld sub-groups read while %lld are written, as "
        "the last step did)\n",
        step_io, static_cast<long long>(step_reads), static_cast<long long>(stage.tiles()),
        static_cast<long long>(step_writes));
    std::printf(
        "step / max(reads, update, writes) = %.3f / %.3f = %.2f (1.00: every stage hidden "
        "behind the slowest)\n",
        step, slowest, step / slowest);
    std::printf(
        "step / (reads + writes at once) = %.2f (the drive's floor when it does not read and "
        "write at full speed at once)\n",
        step / both);
    std::printf(
        "step / (the step's I/O at once) = %.2f (the same floor for the records the step "
        "moves)\n",
        step / step_io);
    std::printf(
        "split of the median step: %.3f s = read waits %.3f + update %.3f + write waits %.3f + "
        "other %.3f (gradient scan, write-back, pass set-up)\n",
        middle->total, middle->read_wait, middle->update, middle->write_wait, middle->other());
    const MemoryReport on_nvme = nvme.memory_report();
    const MemoryReport resident = host.memory_report();
    const auto host_states = [](const MemoryReport& report) {
      return report.at(MemoryCategory::kMasterWeights).peak +
             report.at(MemoryCategory::kOptimizerStates).peak;
    };
    std::printf(
        "host memory for master + states: %.1f MiB with NVMe (%.0f MiB on NVMe) vs %.1f MiB "
        "resident\n",
        mib(host_states(on_nvme)), mib(on_nvme.total_current(MemoryLocation::kNvme)),
        mib(host_states(resident)));
    if (options.check) {
      bool good = true;
      for (const double v : {step, reads, update, writes, both, step_io})
        good = good && v > 0 && std::isfinite(v);
      for (const StepSplit& s : steps) {
        good = good && s.read_wait >= 0 && s.update > 0 && s.write_wait >= 0 && s.other() >= 0;
      }
      if (!good) {
        std::fprintf(stderr,
                     "zeroshard-nvme-step-bench: a figure is not positive and finite, or a split "
                     "does not add up\n");
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zeroshard-nvme-step-bench: %s\n", e.what());
    return 1;
  }
}
