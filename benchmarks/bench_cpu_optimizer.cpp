// The CPU AdamW against the memory system's limit, in one run: every path the CPU has (AVX-512,
// AVX2, scalar) beside a streaming kernel that moves the same 28 bytes per parameter (reads p, g,
// m, v; writes p, m, v) with one add and no other arithmetic, at 1 and 2 OpenMP threads. The
// fused 16-bit steps (a bf16 or fp16 gradient in, scaled by a factor, a copy of the weights in
// the same type out) also move 28 bytes per parameter (reads p 4, g 2, m v 8; writes p m v 12,
// the copy 2) and are set beside a streaming kernel that moves those. Google Benchmark's rows come
// first; then each update and its stream run alternately, round after round, and the median ratio
// goes to stderr. ZEROSHARD_BENCH_PARAMS sets the size (default 100M), ZEROSHARD_BENCH_ROUNDS the
// alternated rounds (default 9; 0 skips them).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_median.h"
#include "kernels/cpu/cpu_optimizer.h"

namespace {

using zeroshard::bench::median;

namespace cpu = zeroshard::detail::cpu_optimizer;

// Both the fp32 step and the fused 16-bit steps: 4 + 4 + 8 read and 12 written, or 4 + 2 + 8
// read and 12 + 2 written.
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

// One pass of each kernel over `a`, on `threads` OpenMP threads.
void adamw_pass(cpu::Isa isa, Arrays& a, int threads) {
  float* states[] = {a.exp_avg.get(), a.exp_avg_sq.get()};
  omp_set_num_threads(threads);
  cpu::adam(isa, {.param = a.param.get(), .grad = a.grad.get(), .states = states}, a.n,
            kAdamWScalars, false);
}

// The engine's mixed-precision step in one pass: a 16-bit gradient in (with a loss-scale and
// clipping factor), fp32 master and states updated, a copy of the weights in the same 16-bit type
// out. The arrays hold bf16 bit patterns, which read as fp16 are finite values of the same order
// (0x3A83 and up: 0.75 and up).
void fused_16bit_pass(cpu::Isa isa, Arrays& a, int threads, zeroshard::DType dtype) {
  float* states[] = {a.exp_avg.get(), a.exp_avg_sq.get()};
  omp_set_num_threads(threads);
  cpu::adam(isa,
            {.param = a.param.get(),
             .grad = a.grad_bf16.get(),
             .states = states,
             .grad_dtype = dtype,
             .grad_factor = 1.0f / 1024.0f * 0.37f,
             .param_copy = a.param_bf16.get(),
             .param_copy_dtype = dtype},
            a.n, kAdamWScalars, false);
}

void stream_pass(Arrays& a, int threads) {
  const std::int64_t n = a.n;
  float* __restrict p = a.param.get();
  const float* __restrict g = a.grad.get();
  float* __restrict m = a.exp_avg.get();
  float* __restrict v = a.exp_avg_sq.get();
  omp_set_num_threads(threads);
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
}

// The bytes of the fused 16-bit steps: reads p, a 16-bit g, m, v; writes p, m, v and a 16-bit copy
// of p (bf16, truncated: the least arithmetic that writes it).
void stream_bf16_pass(Arrays& a, int threads) {
  const std::int64_t n = a.n;
  float* __restrict p = a.param.get();
  const std::uint16_t* __restrict g = a.grad_bf16.get();
  float* __restrict m = a.exp_avg.get();
  float* __restrict v = a.exp_avg_sq.get();
  std::uint16_t* __restrict copy = a.param_bf16.get();
  omp_set_num_threads(threads);
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
}

using Pass = std::function<void()>;

void register_row(const std::string& name, std::int64_t n, Pass pass) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [n, pass](benchmark::State& state) {
                                 for (auto _ : state) {
                                   pass();
                                   benchmark::ClobberMemory();
                                 }
                                 count_bytes(state, n);
                               })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// An update and the stream of its bytes, timed alternately in one loop, so that the machine's
// drifts touch both alike; which runs first alternates too.
struct Pairing {
  std::string name;
  Pass ours;
  Pass stream;
};

double seconds_of(const Pass& pass) {
  const auto start = std::chrono::steady_clock::now();
  pass();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void print_alternated(const std::vector<Pairing>& pairings, std::int64_t n, int rounds) {
  std::fprintf(stderr,
               "\nalternated, %d rounds after one warm-up each; GB/s at %lld bytes per parameter;"
               " ratio: the median over rounds of stream time / update time\n",
               rounds, static_cast<long long>(kAdamWBytesPerParam));
  std::fprintf(stderr, "%-40s %12s %12s %8s\n", "update", "ours GB/s", "stream GB/s", "ratio");
  const double bytes = static_cast<double>(n) * kAdamWBytesPerParam;
  for (const Pairing& pairing : pairings) {
    pairing.ours();
    pairing.stream();
    std::vector<double> ours, stream, ratios;
    for (int round = 0; round < rounds; ++round) {
      double o = 0.0;
      double s = 0.0;
      if (round % 2 == 0) {
        o = seconds_of(pairing.ours);
        s = seconds_of(pairing.stream);
      } else {
        s = seconds_of(pairing.stream);
        o = seconds_of(pairing.ours);
      }
      ours.push_back(o);
      stream.push_back(s);
      ratios.push_back(s / o);
    }
    std::fprintf(stderr, "%-40s %12.2f %12.2f %8.3f\n", pairing.name.c_str(),
                 bytes / median(ours) * 1e-9, bytes / median(stream) * 1e-9, median(ratios));
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const char* size_text = std::getenv("ZEROSHARD_BENCH_PARAMS");
  const std::int64_t n = size_text != nullptr ? std::atoll(size_text) : 100'000'000;
  const char* rounds_text = std::getenv("ZEROSHARD_BENCH_ROUNDS");
  const int rounds = rounds_text != nullptr ? std::atoi(rounds_text) : 9;
  Arrays& a = arrays_of(n);
  std::vector<cpu::Isa> isas;
  for (cpu::Isa isa : {cpu::Isa::kAvx512, cpu::Isa::kAvx2, cpu::Isa::kScalar}) {
    if (cpu::supported(isa)) isas.push_back(isa);
  }
  std::vector<Pairing> pairings;
  for (int threads : {1, 2}) {
    const std::string suffix = "/" + std::to_string(n) + "/threads:" + std::to_string(threads);
    const Pass stream = [&a, threads] { stream_pass(a, threads); };
    const Pass stream_bf16 = [&a, threads] { stream_bf16_pass(a, threads); };
    register_row("BM_StreamSameBytes" + suffix, n, stream);
    register_row("BM_StreamSameBytesBf16" + suffix, n, stream_bf16);
    for (cpu::Isa isa : isas) {
      const std::string name = std::string("BM_CpuAdamW_") + cpu::to_string(isa) + suffix;
      const Pass ours = [&a, isa, threads] { adamw_pass(isa, a, threads); };
      register_row(name, n, ours);
      pairings.push_back({name, ours, stream});
      for (const auto& [type_name, dtype] : {std::pair{"Bf16", zeroshard::DType::kBFloat16},
                                             std::pair{"Fp16", zeroshard::DType::kFloat16}}) {
        const std::string fused =
            std::string("BM_CpuAdamWFused") + type_name + "_" + cpu::to_string(isa) + suffix;
        const Pass ours_fused = [&a, isa, threads, dtype] {
          fused_16bit_pass(isa, a, threads, dtype);
        };
        register_row(fused, n, ours_fused);
        pairings.push_back({fused, ours_fused, stream_bf16});
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  if (rounds > 0) print_alternated(pairings, n, rounds);
  benchmark::Shutdown();
  return 0;
}
