// Runs and measures each configuration on every rank: memory by category from the engine's
// allocator, the process peak RSS, the step time and the bytes sent per step, beside the
// estimator's figures for the same configuration.
#include "memory_bench_worker.h"

#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "memory_bench_model.h"
#include "memory_record.h"
#include "zeroshard/memory_estimator.h"
#include "zeroshard/quantity.h"
#include "zeroshard/zeroshard.h"

namespace zeroshard::bench {

namespace {

/// Starts the process's peak RSS afresh, so each configuration's peak is its own (Linux's
/// clear_refs "5" resets VmHWM to the current RSS). Freed heap is returned to the kernel first.
void reset_peak_rss() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

Record measure(const BenchOptions& options, const Configuration& configuration, int world_size) {
  Record record;
  record.world_size = world_size;
  record.values = configuration.values;
  const Config config =
      Config::from_json_string(engine_config(options, configuration).dump(), world_size);
  Engine engine(config, Communicator::from_environment());
  record.rank = engine.rank();
  const int checkpoint_every =
      static_cast<int>(parse_count(configuration.value("checkpoint_every"), "--checkpoint-every"));
  const std::unique_ptr<BenchModel> model = make_model(options, engine, checkpoint_every);
  engine.finalize();
  model->initialize();

  std::int64_t step = 0;
  for (int s = 0; s < options.warmup_steps; ++s, ++step) {
    model->micro_step(step);
    engine.step();
  }
  double seconds = 0.0;
  const double recompute_before = model->recompute_seconds();
  for (int s = 0; s < options.timed_steps; ++s, ++step) {
    const std::int64_t sent_before = engine.communicator().traffic().total_bytes();
    const auto start = std::chrono::steady_clock::now();
    model->micro_step(step);
    engine.step();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    record.sent_bytes_per_step = engine.communicator().traffic().total_bytes() - sent_before;
  }
  record.step_ms = 1000.0 * seconds / options.timed_steps;
  record.recompute_ms =
      1000.0 * (model->recompute_seconds() - recompute_before) / options.timed_steps;

  const MemoryReport report = engine.memory_report();
  // Memory is host and device; swap files on NVMe are checked on their own, below.
  const auto in_memory = [](int location) {
    return location != static_cast<int>(MemoryLocation::kNvme);
  };
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    for (int l = 0; l < kMemoryLocationCount; ++l) {
      if (!in_memory(l)) continue;
      record.measured[c].current += report.usage[l][c].current;
      record.measured[c].peak += report.usage[l][c].peak;
    }
  }
  for (int l = 0; l < kMemoryLocationCount; ++l) {
    if (in_memory(l)) record.measured_total_peak += report.total_peak[l];
  }
  record.process_peak_rss = report.process_peak_rss;
  record.params = engine.trainable_numel();
  record.padded_params = engine.padded_numel();

  // The theory: the estimator, fed the parsed config and the model's tensors, nothing measured.
  EstimateInput input = estimate_input_from_config(engine.config(), record.params, world_size);
  input.tensors = model->tensor_numels();
  // Activations: a chain of equal layers (the MLP with inputs = classes = width) is the
  // estimator's to predict; any other model's are taken as given, so that the peak bound still
  // covers the whole allocation.
  const EstimateInput chain = model->activation_input();
  if (chain.layers > 0) {
    input.activation_bytes = chain.activation_bytes;
    input.layer_activation_bytes = chain.layer_activation_bytes;
    input.layers = chain.layers;
    input.checkpoint_every = chain.checkpoint_every;
    input.cpu_checkpointing = chain.cpu_checkpointing;
  } else {
    input.activation_bytes = record.measured_peak(MemoryCategory::kActivations);
  }
  const MemoryEstimate estimate = zeroshard::estimate(input);
  // CPU ranks keep "device" buffers in host memory too, so offloaded bytes count alongside, as
  // the measured side sums both locations.
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    record.theory[c] = estimate.at(category) + estimate.at(category, MemoryTier::kHost);
  }
  record.theory_device_peak = estimate.device_peak() + estimate.total(MemoryTier::kHost);
  record.theory_sent_bytes_per_step = estimate.traffic_bytes_per_step;
  if (!estimate.valid) {
    record.status =
        "failed: the engine ran a configuration the estimator rejects: " + estimate.reason;
  } else if (const std::int64_t on_disk = report.total_current(MemoryLocation::kNvme);
             on_disk != estimate.total(MemoryTier::kNvme)) {
    record.status = "failed: the swap files hold " + std::to_string(on_disk) +
                    " bytes, the estimator says " +
                    std::to_string(estimate.total(MemoryTier::kNvme));
  }
  return record;
}

}  // namespace

std::string worker_results_path(const std::string& dir, int world_size, int rank) {
  return dir + "/np" + std::to_string(world_size) + "_rank" + std::to_string(rank) + ".jsonl";
}

int run_worker(const BenchOptions& options) {
  // A communicator of its own for the barriers between configurations, apart from the engines'.
  const std::unique_ptr<Communicator> world = Communicator::from_environment();
  const int rank = world->rank();
  const int size = world->size();
  std::ofstream out(worker_results_path(options.worker_dir, size, rank));
  const std::vector<Configuration> sweep = configurations(options);
  for (std::size_t k = 0; k < sweep.size(); ++k) {
    reset_peak_rss();
    Record record;
    try {
      record = measure(options, sweep[k], size);
    } catch (const ConfigError& error) {
      record.status = std::string("not supported yet: ") + error.what();
    } catch (const UsageError& error) {
      record.status = std::string("not supported yet: ") + error.what();
    } catch (const Error& error) {
      record.status = std::string("failed: ") + error.what();
    }
    record.world_size = size;
    record.rank = rank;
    record.values = sweep[k].values;
    out << to_json(record).dump() << "\n" << std::flush;
    world->barrier();
    if (rank == 0) {
      std::printf("progress %zu\n", k + 1);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace zeroshard::bench
