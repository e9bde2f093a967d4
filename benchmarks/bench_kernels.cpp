// Throughput of the fused AdamW kernel next to a device-to-device copy of the same byte count,
// the bound a memory-bound update can approach; ends with their ratio per size.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_selection.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "zeroshard/error.h"

namespace {

using zeroshard::cuda::CudaEvent;
using zeroshard::cuda::CudaStream;
using zeroshard::cuda::DeviceBuffer;

// AdamW reads p, g, m, v (16 bytes per parameter) and writes p, m, v (12 bytes).
constexpr std::int64_t kAdamWBytesPerParam = 28;

// GB/s each benchmark measured, by name, for the closing ratio lines; std::map keeps the
// addresses handed to the benchmarks stable.
using Throughputs = std::map<std::string, double>;

bool skip_without_device(benchmark::State& state) {
  if (zeroshard::cuda::cuda_device_available()) return false;
  state.SkipWithError(
      ("no usable CUDA device: " + zeroshard::cuda::cuda_unavailable_reason()).c_str());
  return true;
}

// Times each iteration's `launch` with CUDA events on `stream` and reports bytes per second.
template <class Launch>
void time_on_device(benchmark::State& state, cudaStream_t stream, std::int64_t bytes, Launch launch,
                    double& gigabytes_per_second) {
  CudaEvent start(CudaEvent::Timing::kEnabled);
  CudaEvent stop(CudaEvent::Timing::kEnabled);
  launch();  // warm-up: first-touch and lazy module loading stay out of the timings
  double total_seconds = 0.0;
  for (auto _ : state) {
    start.record(stream);
    launch();
    stop.record(stream);
    stop.synchronize();
    const double seconds = stop.elapsed_ms_since(start) / 1e3;
    state.SetIterationTime(seconds);
    total_seconds += seconds;
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  gigabytes_per_second = static_cast<double>(state.iterations() * bytes) / total_seconds / 1e9;
}

void bm_fused_adamw(benchmark::State& state, double* gigabytes_per_second, std::int64_t params) {
  if (skip_without_device(state)) return;
  try {
    const auto bytes = static_cast<std::size_t>(params) * sizeof(float);
    DeviceBuffer param(bytes, "parameters"), grad(bytes, "gradients"), exp_avg(bytes, "exp_avg"),
        exp_avg_sq(bytes, "exp_avg_sq");
    CudaStream stream;
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(param.data(), 0x3c, bytes, stream.get()));
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(grad.data(), 0x3b, bytes, stream.get()));
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(exp_avg.data(), 0, bytes, stream.get()));
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(exp_avg_sq.data(), 0, bytes, stream.get()));
    const zeroshard::AdamWOptions options;
    zeroshard::StepContext context;
    context.lr = options.lr;
    context.weight_decay = options.weight_decay;
    time_on_device(
        state, stream.get(), params * kAdamWBytesPerParam,
        [&] {
          zeroshard::kernels::adamw_step(param.as<float>(), grad.as<float>(), exp_avg.as<float>(),
                                         exp_avg_sq.as<float>(), nullptr, params, options, context,
                                         stream.get());
          ++context.step;
        },
        *gigabytes_per_second);
  } catch (const zeroshard::Error& error) {
    state.SkipWithError(error.what());
  }
}

void bm_device_copy(benchmark::State& state, double* gigabytes_per_second, std::int64_t params) {
  if (skip_without_device(state)) return;
  try {
    // Half the AdamW byte count read and half written, so both move the same bytes.
    const auto copy_bytes = static_cast<std::size_t>(params * kAdamWBytesPerParam / 2);
    DeviceBuffer source(copy_bytes, "copy source"), destination(copy_bytes, "copy destination");
    CudaStream stream;
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(source.data(), 0x3c, copy_bytes, stream.get()));
    time_on_device(
        state, stream.get(), params * kAdamWBytesPerParam,
        [&] {
          ZEROSHARD_CUDA_CHECK(cudaMemcpyAsync(destination.data(), source.data(), copy_bytes,
                                               cudaMemcpyDeviceToDevice, stream.get()));
        },
        *gigabytes_per_second);
  } catch (const zeroshard::Error& error) {
    state.SkipWithError(error.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Throughputs throughputs;
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"10M", 10'000'000}, {"100M", 100'000'000}, {"1B", 1'000'000'000}};
  for (const auto& [label, params] : sizes) {
    const std::string adamw = std::string("BM_FusedAdamW/") + label;
    benchmark::RegisterBenchmark(adamw.c_str(), bm_fused_adamw, &throughputs[adamw], params)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    const std::string copy = std::string("BM_DeviceCopy/") + label;
    benchmark::RegisterBenchmark(copy.c_str(), bm_device_copy, &throughputs[copy], params)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  // On stderr, so that --benchmark_format=json keeps stdout valid JSON.
  for (const auto& [label, params] : sizes) {
    const double adamw = throughputs[std::string("BM_FusedAdamW/") + label];
    const double copy = throughputs[std::string("BM_DeviceCopy/") + label];
    if (adamw <= 0.0 || copy <= 0.0) continue;  // skipped or filtered out
    std::fprintf(stderr, "ratio %s: adamw %.1f GB/s / copy %.1f GB/s = %.3f\n", label, adamw, copy,
                 adamw / copy);
  }
  benchmark::Shutdown();
  return 0;
}
