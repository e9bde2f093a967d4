// The CPU AdamW against the memory system's limit, in one run: every path the CPU has (AVX-512,
// AVX2, scalar) beside a streaming kernel that moves the same 28 bytes per parameter (reads p, g,
// m, v; writes p, m, v) with one add and no other arithmetic, at 1, 2, 4, ... OpenMP threads up to
// the processors there are (and that count itself). The fused 16-bit steps (a bf16 or fp16
// gradient in, scaled by a factor, a copy of the weights in the same type out) also move 28 bytes
// per parameter (reads p 4, g 2, m v 8; writes p m v 12, the copy 2) and are set beside a
// streaming kernel that moves those. The gradient norm's scan of the same gradient is set beside
// a read-only stream of its bytes and against the update's time for the same elements, which it
// precedes in every step. Google Benchmark's rows come first; then each pass and its stream (and
// a scan's update) run alternately, round after round, and the medians go to stderr as a table.
// ZEROSHARD_BENCH_PARAMS sets the size (default 100M), ZEROSHARD_BENCH_ROUNDS the alternated
// rounds (default 9; 0 skips them).
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
#include "memory/memory_tracker.h"  // host_memory

namespace {

using zeroshard::bench::median;

namespace cpu = zeroshard::detail::cpu_optimizer;

// Both the fp32 step and the fused 16-bit steps: 4 + 4 + 8 read and 12 written, or 4 + 2 + 8
// read and 12 + 2 written.
constexpr std::int64_t kAdamWBytesPerParam = 28;

// The arrays as the engine allocates its host shard (memory/memory_tracker.h): huge pages where
// they span some, zeroed (first touched) by the OpenMP team in the update's tiles, then filled.
struct Arrays {
  explicit Arrays(std::int64_t n) : n(n) {
    for (auto* array : {&param, &grad, &exp_avg, &exp_avg_sq}) {
      array->reset(static_cast<float*>(allocate(sizeof(float))));
      float* data = array->get();
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) data[i] = 1e-3f * static_cast<float>(i % 1000);
    }
    for (auto* array : {&grad_bf16, &param_bf16}) {
      array->reset(static_cast<std::uint16_t*>(allocate(sizeof(std::uint16_t))));
      std::uint16_t* data = array->get();
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        data[i] = static_cast<std::uint16_t>(0x3A83 + i % 1000);  // 1e-3 and up, as bf16
      }
    }
  }
  void* allocate(std::size_t element) const {
    return zeroshard::detail::host_memory().allocate(static_cast<std::size_t>(n) * element,
                                                     zeroshard::MemoryCategory::kOptimizerStates);
  }

  struct Free {
    void operator()(void* p) const noexcept { zeroshard::detail::host_memory().deallocate(p); }
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

// The gradient norm's scan, as the CPU backend runs it before the update: the gradient as stored
// (fp32, or bf16 bits read as bf16 or fp16), on `threads` OpenMP threads.
void scan_pass(cpu::Isa isa, Arrays& a, int threads, zeroshard::DType dtype) {
  omp_set_num_threads(threads);
  const void* grad = dtype == zeroshard::DType::kFloat32 ? static_cast<const void*>(a.grad.get())
                                                         : a.grad_bf16.get();
  double sum = cpu::sum_of_squares(isa, grad, dtype, a.n);
  benchmark::DoNotOptimize(sum);
}

// The scan's bytes read once, in the optimizer's tiles, with one integer add per 4 bytes.
void read_stream_pass(Arrays& a, int threads, std::size_t element_bytes) {
  const std::int64_t n = a.n;
  const auto* words = element_bytes == 4
                          ? reinterpret_cast<const std::uint32_t*>(a.grad.get())
                          : reinterpret_cast<const std::uint32_t*>(a.grad_bf16.get());
  const auto per_word = static_cast<std::int64_t>(4 / element_bytes);
  std::uint32_t total = 0;
  omp_set_num_threads(threads);
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (std::int64_t t = 0; t < (n + 65535) / 65536; ++t) {
    const std::int64_t end = ((t + 1) * 65536 < n ? (t + 1) * 65536 : n) / per_word;
    std::uint32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t i = t * 65536 / per_word; i < end; ++i) sum += words[i];
    total += sum;
  }
  benchmark::DoNotOptimize(total);
}

using Pass = std::function<void()>;

void register_row(const std::string& name, std::int64_t n, double bytes_per_param, Pass pass) {
  benchmark::RegisterBenchmark(
      name.c_str(),
      [n, bytes_per_param, pass](benchmark::State& state) {
        for (auto _ : state) {
          pass();
          benchmark::ClobberMemory();
        }
        state.SetBytesProcessed(static_cast<std::int64_t>(
            static_cast<double>(state.iterations() * n) * bytes_per_param));
        state.counters["Gparam/s"] = benchmark::Counter(
            static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
      })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// A pass and the stream of its bytes, timed alternately in one loop, so that the machine's drifts
// touch both alike; which runs first rotates too. A scan also has the update of its elements
// beside it: the step runs both, and the scan's share of the update's time is what it costs.
struct Pairing {
  std::string pass;
  std::string isa;
  int threads;
  double bytes_per_param;
  Pass ours;
  Pass stream;
  Pass update;  ///< empty but for a scan
};

double seconds_of(const Pass& pass) {
  const auto start = std::chrono::steady_clock::now();
  pass();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void print_alternated(const std::vector<Pairing>& pairings, std::int64_t n, int rounds) {
  std::fprintf(stderr,
               "\nalternated, %d rounds after one warm-up each, %lld parameters; GB/s at the "
               "bytes per parameter shown; medians over rounds of stream time / our time and of a "
               "scan's time / its update's time\n",
               rounds, static_cast<long long>(n));
  std::fprintf(stderr, "%-18s %-7s %7s %6s %10s %12s %12s %12s\n", "pass", "isa", "threads",
               "B/par", "ours GB/s", "stream GB/s", "stream/ours", "scan/update");
  for (const Pairing& pairing : pairings) {
    std::vector<const Pass*> passes = {&pairing.ours, &pairing.stream};
    if (pairing.update) passes.push_back(&pairing.update);
    for (const Pass* pass : passes) (*pass)();
    std::vector<std::vector<double>> times(passes.size());
    std::vector<double> stream_ratios;
    std::vector<double> update_ratios;
    for (int round = 0; round < rounds; ++round) {
      std::vector<double> t(passes.size());
      for (std::size_t k = 0; k < passes.size(); ++k) {
        const std::size_t which = (k + static_cast<std::size_t>(round)) % passes.size();
        t[which] = seconds_of(*passes[which]);
      }
      for (std::size_t k = 0; k < passes.size(); ++k) times[k].push_back(t[k]);
      stream_ratios.push_back(t[1] / t[0]);
      if (pairing.update) update_ratios.push_back(t[0] / t[2]);
    }
    const double bytes = static_cast<double>(n) * pairing.bytes_per_param;
    char update_ratio[32] = "";
    if (pairing.update)
      std::snprintf(update_ratio, sizeof update_ratio, "%.3f", median(update_ratios));
    std::fprintf(stderr, "%-18s %-7s %7d %6.0f %10.2f %12.2f %12.3f %12s\n", pairing.pass.c_str(),
                 pairing.isa.c_str(), pairing.threads, pairing.bytes_per_param,
                 bytes / median(times[0]) * 1e-9, bytes / median(times[1]) * 1e-9,
                 median(stream_ratios), update_ratio);
  }
}

// 1, 2, 4, ... up to the processors this process may use, and that count itself.
std::vector<int> thread_counts() {
  const int processors = omp_get_num_procs();
  std::vector<int> counts;
  for (int threads = 1; threads < processors; threads *= 2) counts.push_back(threads);
  counts.push_back(processors);
  return counts;
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
  using zeroshard::DType;
  struct Kind {
    const char* name;  ///< of the update's row
    const char* scan_name;
    DType dtype;  ///< of the gradient (and the copy, for the 16-bit passes)
  };
  const Kind kinds[] = {{"AdamW fp32", "scan fp32", DType::kFloat32},
                        {"AdamW fused bf16", "scan bf16", DType::kBFloat16},
                        {"AdamW fused fp16", "scan fp16", DType::kFloat16}};
  std::vector<Pairing> pairings;
  for (int threads : thread_counts()) {
    const std::string suffix = "/" + std::to_string(n) + "/threads:" + std::to_string(threads);
    const Pass stream = [&a, threads] { stream_pass(a, threads); };
    const Pass stream_bf16 = [&a, threads] { stream_bf16_pass(a, threads); };
    const Pass read_fp32 = [&a, threads] { read_stream_pass(a, threads, 4); };
    const Pass read_16 = [&a, threads] { read_stream_pass(a, threads, 2); };
    register_row("BM_StreamSameBytes" + suffix, n, kAdamWBytesPerParam, stream);
    register_row("BM_StreamSameBytesBf16" + suffix, n, kAdamWBytesPerParam, stream_bf16);
    register_row("BM_StreamReadFp32" + suffix, n, 4, read_fp32);
    register_row("BM_StreamRead16Bit" + suffix, n, 2, read_16);
    for (cpu::Isa isa : isas) {
      const std::string isa_name = cpu::to_string(isa);
      for (const Kind& kind : kinds) {
        const bool fp32 = kind.dtype == DType::kFloat32;
        const DType dtype = kind.dtype;
        const Pass update =
            fp32 ? Pass([&a, isa, threads] { adamw_pass(isa, a, threads); })
                 : Pass([&a, isa, threads, dtype] { fused_16bit_pass(isa, a, threads, dtype); });
        const std::string type =
            fp32 ? "" : (dtype == DType::kBFloat16 ? "FusedBf16" : "FusedFp16");
        const std::string update_row = "BM_CpuAdamW" + type + "_" + isa_name + suffix;
        register_row(update_row, n, kAdamWBytesPerParam, update);
        pairings.push_back({kind.name,
                            isa_name,
                            threads,
                            kAdamWBytesPerParam,
                            update,
                            fp32 ? stream : stream_bf16,
                            {}});
        const Pass scan = [&a, isa, threads, dtype] { scan_pass(isa, a, threads, dtype); };
        const double scan_bytes = static_cast<double>(zeroshard::size_of(dtype));
        const std::string scan_type = fp32 ? "Fp32" : (dtype == DType::kBFloat16 ? "Bf16" : "Fp16");
        register_row("BM_CpuNormScan" + scan_type + "_" + isa_name + suffix, n, scan_bytes, scan);
        pairings.push_back({kind.scan_name, isa_name, threads, scan_bytes, scan,
                            fp32 ? read_fp32 : read_16, update});
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  if (rounds > 0) print_alternated(pairings, n, rounds);
  benchmark::Shutdown();
  return 0;
}
