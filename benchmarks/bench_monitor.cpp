// What csv_monitor and tensorboard cost a step: TrainingMonitor::write_step on rank 0 with both
// monitors on, for a step shaped like the MLP example's (seven timed parts, six collective kinds,
// host memory), beside the same step with one monitor each. Set it against the step's time
// (benchmarks/run_monitor_overhead.sh runs the MLP example with the monitors on and off).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "monitor/training_monitor.h"

namespace {

namespace fs = std::filesystem;
using zeroshard::Config;
using zeroshard::detail::MonitoredStep;
using zeroshard::detail::TrainingMonitor;

MonitoredStep mlp_like_step() {
  MonitoredStep step;
  step.lr = 1e-3;
  step.grad_norm = 1.25;
  step.times_ms = {{"Time/step_ms", 2.5},  {"Time/reduce_ms", 0.4},    {"Time/update_ms", 0.3},
                   {"Time/scan_ms", 0.05}, {"Time/norm_wait_ms", 0.1}, {"Time/rule_ms", 0.15},
                   {"Time/gather_ms", 0.2}};
  for (int kind = 0; kind < zeroshard::kCollectiveCount; ++kind) step.traffic.bytes[kind] = 4096;
  step.memory.total_peak[0] = 1 << 20;
  for (auto& usage : step.memory.usage[0]) usage = {.current = 65536, .peak = 131072};
  return step;
}

void run(benchmark::State& state, bool csv, bool tensorboard) {
  const fs::path folder =
      fs::temp_directory_path() / ("zeroshard-bench-monitor-" + std::to_string(::getpid()));
  {
    Config config;
    config.csv_monitor = {.enabled = csv, .output_path = folder.string(), .job_name = "bench"};
    config.tensorboard = {
        .enabled = tensorboard, .output_path = folder.string(), .job_name = "bench"};
    TrainingMonitor monitor(config, 0);
    MonitoredStep step = mlp_like_step();
    for (auto _ : state) {
      ++step.step;
      step.samples = step.step * 32;
      monitor.write_step(step);
      monitor.write_loss(step.samples, 2.3);
    }
  }
  fs::remove_all(folder);
}

void BM_MonitorWriteStepBoth(benchmark::State& state) { run(state, true, true); }
void BM_MonitorWriteStepCsv(benchmark::State& state) { run(state, true, false); }
void BM_MonitorWriteStepTensorboard(benchmark::State& state) { run(state, false, true); }

BENCHMARK(BM_MonitorWriteStepBoth);
BENCHMARK(BM_MonitorWriteStepCsv);
BENCHMARK(BM_MonitorWriteStepTensorboard);

}  // namespace

BENCHMARK_MAIN();
