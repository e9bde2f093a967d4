// The CPU AdamW against the memory system's limit, in one run: the dispatched path (and the
// scalar reference) beside a streaming kernel that moves the same 28 bytes per parameter (reads
// p, g, m, v; writes p, m, v) with one add and no other arithmetic, at 1 and 2 OpenMP threads.
// The fused bf16 step (bf16 gradient in, scaled by a factor, bf16 copy of the weights out) also
// moves 28 bytes per parameter (reads p 4, g 2, m v 8; writes p m v 12, the copy 2) and is set
// beside a streaming kernel that moves those. Ratios go to stderr at the end.
// ZEROSHARD_BENCH_PARAMS sets the size (default 100M).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu_optimizer.h"

namespace {

namespace cpu = zeroshard::detail::cpu_optimizer;

// Both the fp32 step and the fused bf16 step: 4 + 4 + 8 read and 12 written, or 4 + 2 + 8 read
// and 12 + 2 written.
constexpr std::int64_t kAdamWBytesPerParam = 28;

// Page-aligned arrays, first touched by the OpenMP team so that their pages spread like the
// work does.
struct Arrays {
  explicit Arrays(std::int64_t n) : n(n) {
    for (auto* array : {&param, &grad, &exp_avg, &exp_avg_sq}) {
      array->reset(static_cast<float*>(std::aligned_alloc(4096, bytes(sizeof(float)))));
      float* data = array->get();
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) data[i] = 1e-3f * static_cast<float>(i % 1000);
    }
    for (auto* array : {&grad_bf16, &param_bf16}) {
      array->reset(
          static_cast<std::uint16_t*>(std::aligned_alloc(4096, bytes(sizeof(std::uint16_t)))));
      std::uint16_t* data = array->get();
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        data[i] = static_cast<std::uint16_t>(0x3A83 + i % 1000);  // 1e-3 and up, as bf16
      }
    }
  }
  std::size_t bytes(std::size_t element) const {
    return (static_cast<std::size_t>(n) * element + 4095) / 4096 * 4096;
  }

  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  std::int64_t n;
  std::unique_ptr<float, Free> param, grad, exp_avg, exp_avg_sq;
  std::unique_ptr<std::uint16_t, Free> grad_bf16, param_bf16;
};

Arrays& arrays_of(std::int64_t n) {
  static std::map<std::int64_t, std::unique_ptr<Arrays>> cache;
  auto& slot = cache[n];
  if (!slot) slot = std::make_unique<Arrays>(n);
  return *slot;
}

void count_bytes(benchmark::State& state, std::int64_t n) {
  state.SetBytesProcessed(state.iterations() * n * kAdamWBytesPerParam);
  state.counters["Gparam/s"] = benchmark::Counter(static_cast<double>(n) * 1e-9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

constexpr cpu::AdamScalars kAdamWScalars{.weight_factor = 1.0f - 1e-3f * 1e-2f,
                                         .l2 = 0.0f,
                                         .beta1 = 0.9f,
                                         .one_minus_beta1 = 0.1f,
                                         .beta2 = 0.999f,
                                         .one_minus_beta2 = 1.0f - 0.999f,
                                         .step_size = 1e-2f,
                                         .inv_bias_correction2_sqrt = 10.0f,
                                         .eps = 1e-8f};

void bm_adamw(benchmark::State& state, cpu::Isa isa, std::int64_t n, int threads) {
  Arrays& a = arrays_of(n);
  float* states[] = {a.exp_avg.get(), a.exp_avg_sq.get()};
  omp_set_num_threads(threads);
  for (auto _ : state) {
    cpu::adam(isa, {.param = a.param.get(), .grad = a.grad.get(), .states = states}, n,
              kAdamWScalars, false);
    benchmark::ClobberMemory();
  }
  count_bytes(state, n);
}

// The engine's mixed-precision step in one pass: bf16 gradient in (with a loss-scale and
// clipping factor), fp32 master and states updated, bf16 copy of the weights out.
void bm_adamw_fused_bf16(benchmark::State& state, cpu::Isa isa, std::int64_t n, int threads) {
  Arrays& a = arrays_of(n);
  float* states[] = {a.exp_avg.get(), a.exp_avg_sq.get()};
  omp_set_num_threads(threads);
  for (auto _ : state) {
    cpu::adam(isa,
              {.param = a.param.get(),
               .grad = a.grad_bf16.get(),
               .states = states,
               .grad_dtype = zeroshard::DType::kBFloat16,
               .grad_factor = 1.0f / 1024.0f * 0.37f,
               .param_copy = a.param_bf16.get(),
               .param_copy_dtype = zeroshard::DType::kBFloat16},
              n, kAdamWScalars, false);
    benchmark::ClobberMemory();
  }
  count_bytes(state, n);
}

void bm_stream(benchmark::State& state, std::int64_t n, int threads) {
  Arrays& a = arrays_of(n);
  float* __restrict p = a.param.get();
  const float* __restrict g = a.grad.get();
  float* __restrict m = a.exp_avg.get();
  float* __restrict v = a.exp_avg_sq.get();
  omp_set_num_threads(threads);
  for (auto _ : state) {
    // The optimizer's tiling, so that both split the work alike.
#pragma omp parallel for schedule(static)
    for (std::int64_t t = 0; t < (n + 65535) / 65536; ++t) {
      const std::int64_t end = (t + 1) * 65536 < n ? (t + 1) * 65536 : n;
#pragma omp simd
      for (std::int64_t i = t * 65536; i < end; ++i) {
        const float old_m = m[i];
        p[i] = p[i] + g[i];
        m[i] = v[i];
        v[i] = old_m;
      }
    }
    benchmark::ClobberMemory();
  }
  count_bytes(state, n);
}

// The bytes of the fused bf16 step: reads p, a bf16 g, m, v; writes p, m, v and a bf16 copy of p
// (truncated, the least arithmetic that writes it).
void bm_stream_bf16(benchmark::State& state, std::int64_t n, int threads) {
  Arrays& a = arrays_of(n);
  float* __restrict p = a.param.get();
  const std::uint16_t* __restrict g = a.grad_bf16.get();
  float* __restrict m = a.exp_avg.get();
  float* __restrict v = a.exp_avg_sq.get();
  std::uint16_t* __restrict copy = a.param_bf16.get();
  omp_set_num_threads(threads);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (std::int64_t t = 0; t < (n + 65535) / 65536; ++t) {
      const std::int64_t end = (t + 1) * 65536 < n ? (t + 1) * 65536 : n;
#pragma omp simd
      for (std::int64_t i = t * 65536; i < end; ++i) {
        const float old_m = m[i];
        const float updated = p[i] + std::bit_cast<float>(static_cast<std::uint32_t>(g[i]) << 16);
        p[i] = updated;
        copy[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(updated) >> 16);
        m[i] = v[i];
        v[i] = old_m;
      }
    }
    benchmark::ClobberMemory();
  }
  count_bytes(state, n);
}

// Google Benchmark 1.8 replaced Run::error_occurred (Debian's 1.7) with Run::skipped.
template <class BenchmarkRun>
bool failed(const BenchmarkRun& run) {
  if constexpr (requires { run.error_occurred; }) {
    return run.error_occurred;
  } else {
    return static_cast<int>(run.skipped) != 0;
  }
}

// Records each benchmark's bytes per second of real time as the console reporter prints it.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      const auto bytes = run.counters.find("bytes_per_second");
      if (failed(run) || bytes == run.counters.end()) continue;
      // Names come back with "/real_time" appended; the ratios look them up as registered.
      std::string name = run.benchmark_name();
      if (const auto suffix = name.rfind("/real_time"); suffix != std::string::npos) {
        name.erase(suffix);
      }
      gigabytes_per_second_[name] = bytes->second * 1e-9;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  double at(const std::string& name) const {
    const auto it = gigabytes_per_second_.find(name);
    return it == gigabytes_per_second_.end() ? 0.0 : it->second;
  }

 private:
  std::map<std::string, double> gigabytes_per_second_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const char* size_text = std::getenv("ZEROSHARD_BENCH_PARAMS");
  const std::int64_t n = size_text != nullptr ? std::atoll(size_text) : 100'000'000;
  const cpu::Isa active = cpu::active_isa();
  std::vector<cpu::Isa> isas = {active};
  if (active != cpu::Isa::kScalar) isas.push_back(cpu::Isa::kScalar);
  std::vector<std::pair<std::string, std::string>> pairs;  // (ours, streaming) per row
  for (int threads : {1, 2}) {
    const std::string suffix = "/" + std::to_string(n) + "/threads:" + std::to_string(threads);
    const std::string stream = "BM_StreamSameBytes" + suffix;
    benchmark::RegisterBenchmark(stream.c_str(), bm_stream, n, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (cpu::Isa isa : isas) {
      const std::string name = std::string("BM_CpuAdamW_") + cpu::to_string(isa) + suffix;
      benchmark::RegisterBenchmark(name.c_str(), bm_adamw, isa, n, threads)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      pairs.emplace_back(name, stream);
    }
    const std::string stream_bf16 = "BM_StreamSameBytesBf16" + suffix;
    benchmark::RegisterBenchmark(stream_bf16.c_str(), bm_stream_bf16, n, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    const std::string fused =
        std::string("BM_CpuAdamWFusedBf16_") + cpu::to_string(active) + suffix;
    benchmark::RegisterBenchmark(fused.c_str(), bm_adamw_fused_bf16, active, n, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    pairs.emplace_back(fused, stream_bf16);
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  for (const auto& [ours, stream] : pairs) {
    const double a = reporter.at(ours);
    const double b = reporter.at(stream);
    if (a <= 0.0 || b <= 0.0) continue;  // filtered out
    std::fprintf(stderr, "ratio %s: %.2f GB/s (%.3f Gparam/s) / streaming %.2f GB/s = %.3f\n",
                 ours.c_str(), a, a / kAdamWBytesPerParam, b, a / b);
  }
  benchmark::Shutdown();
  return 0;
}
