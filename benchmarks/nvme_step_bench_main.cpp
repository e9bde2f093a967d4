// zeroshard-nvme-step-bench: one optimizer step with the master weights and Adam states on NVMe,
// split into what the update waited for reads, what it computed and what it waited for writes,
// beside the same step with the states in host memory (the update alone) and with the pipeline
// off (reads and writes alone), all in one run.
#include <malloc.h>  // malloc_trim

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"
#include "engine/engine_internals.h"
#include "memory/memory_tracker.h"  // process_peak_rss_bytes
#include "zeroshard/quantity.h"
#include "zeroshard/zeroshard.h"

namespace {

using namespace zeroshard;

constexpr const char* kDescription =
    "One optimizer step with the master weights and Adam states on NVMe, split into read waits, "
    "update and write waits, beside the update with the states in host memory and the I/O with "
    "the pipeline off.";

struct Options {
  std::int64_t params = 64 << 20;
  std::int64_t sub_group = 4 << 20;
  std::int64_t buffers = 4;
  int steps = 3;
  std::string dir = "nvme_step_bench_swap";
  bool check = false;
};

enum class Mode { kHost, kNvmeSync, kNvmePipelined };

const char* name(Mode mode) {
  switch (mode) {
    case Mode::kHost:
      return "states in host memory";
    case Mode::kNvmeSync:
      return "NVMe, pipeline off";
    case Mode::kNvmePipelined:
      return "NVMe, read ahead + write behind";
  }
  return "";
}

struct Measured {
  double update = 0.0;  ///< seconds per step in the optimizer shard's update
  double read_wait = 0.0;
  double write_wait = 0.0;
  double write_start = 0.0;  ///< checksumming and queueing the writes
  double read_gbps = 0.0;
  double write_gbps = 0.0;
  std::int64_t host_state_bytes = 0;  ///< master + states in host memory, peak
  std::int64_t nvme_bytes = 0;
  std::int64_t peak_rss = 0;  ///< the process's, during this mode only
};

Config config_for(const Options& options, Mode mode) {
  Config config;
  config.train_micro_batch_size_per_gpu = 1;
  config.steps_per_print = 0;
  config.gradient_clipping = 0.0;
  config.zero_optimization.stage = 1;
  config.zero_optimization.sub_group_size = options.sub_group;
  OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  offload.device = mode == Mode::kHost ? OffloadDevice::kCpu : OffloadDevice::kNvme;
  if (mode != Mode::kHost) {
    offload.nvme_path = options.dir;
    offload.buffer_count = options.buffers;
    offload.pipeline_read = mode == Mode::kNvmePipelined;
    offload.pipeline_write = mode == Mode::kNvmePipelined;
  }
  return config;
}

Measured measure(const Options& options, Mode mode) {
  // The kernel's peak RSS counter restarts here, so each mode's peak is its own.
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  Engine engine(config_for(options, mode), Communicator::from_environment(), make_adamw());
  const int tensors = 8;
  std::vector<Parameter> params;
  for (int t = 0; t < tensors; ++t) {
    params.push_back(engine.register_parameter("layer" + std::to_string(t) + ".weight",
                                               {options.params / tensors}));
  }
  engine.finalize();
  detail::EngineState& state = detail::EngineInternals::state(engine);
  const auto one_step = [&](int step) {
    for (const Parameter& p : params) {
      float* grad = p.grad();
      const float g = 1e-3f * static_cast<float>(step + 1);
      std::fill(grad, grad + p.numel(), g);
      engine.grad_ready(p);
    }
    engine.step();
  };
  one_step(0);
  state.times_ = {};
  const detail::SwapTimes io_before = state.optimizer_->swap_times();
  for (int s = 1; s <= options.steps; ++s) one_step(s);
  const detail::SwapTimes io = state.optimizer_->swap_times();
  Measured m;
  const double steps = options.steps;
  m.update = state.times_.update / steps;
  m.read_wait = state.times_.swap_read_wait / steps;
  m.write_wait = state.times_.swap_write_wait / steps;
  m.write_start = (io.write_start - io_before.write_start) / steps;
  const double read_bytes = static_cast<double>(io.bytes_read - io_before.bytes_read) / steps;
  const double write_bytes =
      static_cast<double>(io.bytes_written - io_before.bytes_written) / steps;
  if (m.read_wait > 0) m.read_gbps = read_bytes / m.read_wait / 1e9;
  if (m.write_wait > 0) m.write_gbps = write_bytes / m.write_wait / 1e9;
  const MemoryReport report = engine.memory_report();
  m.host_state_bytes = report.at(MemoryCategory::kMasterWeights).peak +
                       report.at(MemoryCategory::kOptimizerStates).peak;
  m.nvme_bytes = report.total_current(MemoryLocation::kNvme);
  m.peak_rss = detail::process_peak_rss_bytes();
  return m;
}

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
  cli::add_integer(app, "--steps", options.steps, "timed steps per mode, after one untimed")
      ->capture_default_str();
  app.add_option("--dir", options.dir, "nvme_path, created if missing")
      ->type_name("PATH")
      ->capture_default_str();
  app.add_flag("--check", options.check,
               "exit 1 unless every figure is positive and finite (for the test suite)");
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, "zeroshard-nvme-step-bench");
  add_flags(app, options);
  if (const std::optional<int> exit_code = cli::parse(app, argc, argv)) return *exit_code;
  try {
    std::filesystem::create_directories(options.dir);
    std::printf(
        "zeroshard-nvme-step-bench: %s fp32 parameters, AdamW, stage 1 on 1 CPU rank, "
        "sub_group_size %s, buffer_count %lld, nvme_path %s\n",
        format_count(options.params).c_str(), format_count(options.sub_group).c_str(),
        static_cast<long long>(options.buffers), options.dir.c_str());
    std::printf("%-32s %8s %9s %10s %11s %9s %10s %12s %10s %10s\n", "mode", "update s",
                "read wait", "write wait", "write start", "read GB/s", "write GB/s", "host states",
                "NVMe", "peak RSS");
    Measured results[3];
    for (const Mode mode : {Mode::kHost, Mode::kNvmeSync, Mode::kNvmePipelined}) {
      const Measured m = measure(options, mode);
      results[static_cast<int>(mode)] = m;
      std::printf("%-32s %8.3f %9.3f %10.3f %11.3f %9.2f %10.2f %8.1f MiB %6.0f MiB %6.0f MiB\n",
                  name(mode), m.update, m.read_wait, m.write_wait, m.write_start, m.read_gbps,
                  m.write_gbps, mib(m.host_state_bytes), mib(m.nvme_bytes), mib(m.peak_rss));
    }
    const Measured& host = results[0];
    const Measured& sync = results[1];
    const Measured& piped = results[2];
    // The parts each on their own: the update from the host run, the reads and writes from the
    // run whose pipeline is off (there, every byte is waited for and nothing else runs; a read
    // includes checking its checksum, a write computing it).
    const double compute = host.update;
    const double reads = sync.read_wait;
    const double writes = sync.write_wait + sync.write_start;
    const double bound = std::max({compute, reads, writes});
    const double hidden = 1.0 - (piped.update - compute) / std::max(1e-12, reads + writes);
    std::printf("\nparts alone: reads %.3f s, update %.3f s, writes %.3f s; sum %.3f s\n", reads,
                compute, writes, reads + compute + writes);
    std::printf(
        "pipelined step / max(read, update, write) = %.3f / %.3f = %.2f (1.00 = every part "
        "hidden behind the slowest)\n",
        piped.update, bound, piped.update / bound);
    std::printf("pipeline off / sum of parts = %.2f\n", sync.update / (reads + compute + writes));
    std::printf(
        "I/O overlapped (with the update or with other I/O): %.0f%%; exposed: %.3f s of "
        "a %.3f s step, of which %.3f s read waits, %.3f s write waits, %.3f s starting "
        "writes\n",
        100.0 * std::clamp(hidden, 0.0, 1.0), std::max(0.0, piped.update - compute), piped.update,
        piped.read_wait, piped.write_wait, piped.write_start);
    std::printf(
        "host memory for master + states: %.1f MiB with NVMe vs %.1f MiB resident "
        "(%.1f%%); peak RSS %.0f MiB vs %.0f MiB\n",
        mib(piped.host_state_bytes), mib(host.host_state_bytes),
        100.0 * static_cast<double>(piped.host_state_bytes) /
            static_cast<double>(host.host_state_bytes),
        mib(piped.peak_rss), mib(host.peak_rss));
    if (options.check) {
      for (const double v : {compute, reads, writes, piped.update, sync.update}) {
        if (!(v > 0.0) || !std::isfinite(v)) {
          std::fprintf(stderr, "zeroshard-nvme-step-bench: a figure is not positive and finite\n");
          return 1;
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zeroshard-nvme-step-bench: %s\n", e.what());
    return 1;
  }
}
