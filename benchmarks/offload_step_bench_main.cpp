// zeroshard-offload-step-bench: the update phase of an engine step with the optimizer offloaded to
// CPU memory (bf16, stage 2, one rank), against the fused AdamW pass of the CPU rules over the
// same number of elements, on the same thread count, alternated round by round. The step's update
// splits into the gradient-norm scan, the waits for the norm's sum, and the rule's pass; each is
// reported as a ratio to the bare pass, for every thread count from 1 up to the cores there are.
// The scan's tiles whose sums were taken as the gradients landed (before step(), on a GPU box
// while backward goes on) are reported beside it, and the update with them.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_median.h"
#include "command_line.h"
#include "engine/engine_internals.h"
#include "kernels/cpu/cpu_optimizer.h"
#include "memory/memory_tracker.h"
#include "zeroshard/quantity.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::bench::median;
namespace cpu = zeroshard::detail::cpu_optimizer;

struct Options {
  std::int64_t params = std::int64_t{1} << 25;
  int rounds = 5;
  std::vector<int> threads;
  bool check = false;
};

// The thread counts 1, 2, 4, ... up to the cores this process may run on, and that count.
std::vector<int> default_threads() {
  const int cores = omp_get_num_procs();
  std::vector<int> counts;
  for (int t = 1; t < cores; t *= 2) counts.push_back(t);
  counts.push_back(cores);
  return counts;
}

// Sizes the host team the engine builds next, as a user does with OMP_NUM_THREADS.
void set_team(int threads) {
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  omp_set_num_threads(threads);
}

zeroshard::Config offload_config() {
  zeroshard::Config config;
  config.train_micro_batch_size_per_gpu = 1;
  config.gradient_clipping = 1.0;
  config.steps_per_print = 0;
  config.bf16.enabled = true;
  config.zero_optimization.stage = 2;
  config.zero_optimization.offload_optimizer.device = zeroshard::OffloadDevice::kCpu;
  return config;
}

// Host arrays of the bare pass, first touched by the team that runs it.
struct BareArrays {
  explicit BareArrays(std::int64_t n)
      : n(n),
        param(allocate<float>(n)),
        exp_avg(allocate<float>(n)),
        exp_avg_sq(allocate<float>(n)),
        grad(allocate<std::uint16_t>(n)),
        copy(allocate<std::uint16_t>(n)) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      param.get()[i] = 1e-3f * static_cast<float>(i % 1000);
      exp_avg.get()[i] = exp_avg_sq.get()[i] = 0.0f;
      grad.get()[i] = static_cast<std::uint16_t>(0x3A83 + i % 1000);
    }
  }
  struct Free {
    void operator()(void* p) const noexcept { zeroshard::detail::host_memory().deallocate(p); }
  };
  template <class T>
  static std::unique_ptr<T, Free> allocate(std::int64_t n) {
    return std::unique_ptr<T, Free>(static_cast<T*>(zeroshard::detail::host_memory().allocate(
        static_cast<std::size_t>(n) * sizeof(T), zeroshard::MemoryCategory::kOptimizerStates)));
  }
  void pass() {
    float* states[] = {exp_avg.get(), exp_avg_sq.get()};
    cpu::adam(cpu::active_isa(),
              {.param = param.get(),
               .grad = grad.get(),
               .states = states,
               .grad_dtype = zeroshard::DType::kBFloat16,
               .grad_factor = 0.37f,
               .param_copy = copy.get(),
               .param_copy_dtype = zeroshard::DType::kBFloat16},
              n,
              {.weight_factor = 1.0f - 1e-5f,
               .l2 = 0.0f,
               .beta1 = 0.9f,
               .one_minus_beta1 = 0.1f,
               .beta2 = 0.999f,
               .one_minus_beta2 = 1.0f - 0.999f,
               .step_size = 1e-3f,
               .inv_bias_correction2_sqrt = 10.0f,
               .eps = 1e-8f},
              false);
  }
  std::int64_t n;
  std::unique_ptr<float, Free> param, exp_avg, exp_avg_sq;
  std::unique_ptr<std::uint16_t, Free> grad, copy;
};

struct Row {
  int threads = 0;
  double bare = 0.0, update = 0.0, scan = 0.0, norm_wait = 0.0, rule = 0.0, landed = 0.0;
};

Row measure(const Options& options, int threads) {
  set_team(threads);
  zeroshard::Engine engine(offload_config(), zeroshard::Communicator::from_environment(),
                           zeroshard::make_adamw({.lr = 1e-3}));
  zeroshard::Parameter weight = engine.register_parameter("weight", {options.params});
  engine.finalize();
  BareArrays bare(options.params);
  const zeroshard::detail::StepTimes& times =
      zeroshard::detail::EngineInternals::state(engine).times();
  std::vector<double> bare_s, update_s, scan_s, norm_s, rule_s, landed_s;
  for (int round = -1; round < options.rounds; ++round) {  // round -1 warms both up
    auto* grad = static_cast<std::uint16_t*>(weight.grad_target().data);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < options.params; ++i) {
      grad[i] = static_cast<std::uint16_t>(0x3A83 + (i + round) % 1000);
    }
    const zeroshard::detail::StepTimes before = times;
    engine.grad_ready(weight);
    engine.step();
    const auto start = std::chrono::steady_clock::now();
    bare.pass();
    const double bare_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (round < 0) continue;
    bare_s.push_back(bare_seconds);
    update_s.push_back(times.update - before.update);
    scan_s.push_back(times.scan - before.scan);
    norm_s.push_back(times.norm_wait - before.norm_wait);
    rule_s.push_back(times.rule - before.rule);
    landed_s.push_back(times.landed_scan - before.landed_scan);
  }
  return {threads,        median(bare_s), median(update_s), median(scan_s),
          median(norm_s), median(rule_s), median(landed_s)};
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "The update phase of an offloaded bf16 engine step (stage 2, optimizer in CPU memory) "
      "against the bare fused AdamW pass over as many elements, on 1, 2, 4, ... threads up to "
      "the cores there are, alternated round by round; medians.",
      "zeroshard-offload-step-bench"};
  app.add_option_function<std::string>(
      "--params",
      [&options](const std::string& text) {
        options.params = zeroshard::parse_count(text, "--params");
      },
      "elements of the one trainable tensor (default 32M)");
  app.add_option("--rounds", options.rounds, "timed rounds per thread count")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", options.threads, "thread counts (default 1, 2, 4, ... cores)");
  app.add_flag("--check", options.check, "exit 1 unless every time is positive and finite");
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  if (options.threads.empty()) options.threads = default_threads();
  try {
    std::printf(
        "zeroshard-offload-step-bench: %lld bf16 parameters, 1 rank, the %s path; "
        "update = scan + norm waits + rule, each over the bare fused AdamW pass; landed = the "
        "scan's sums taken as the gradients landed, before step()\n",
        static_cast<long long>(options.params),
        std::string(cpu::to_string(cpu::active_isa())).c_str());
    std::printf("%7s | %8s | %9s | %7s | %7s | %7s | %9s | %13s | %11s | %13s | %22s\n", "threads",
                "bare ms", "update ms", "scan ms", "wait ms", "rule ms", "landed ms",
                "update / bare", "rule / bare", "scan / update", "(update + landed) / bare");
    bool sane = true;
    for (int threads : options.threads) {
      const Row r = measure(options, threads);
      std::printf(
          "%7d | %8.2f | %9.2f | %7.2f | %7.2f | %7.2f | %9.2f | %13.3f | %11.3f | %13.3f | "
          "%22.3f\n",
          r.threads, r.bare * 1e3, r.update * 1e3, r.scan * 1e3, r.norm_wait * 1e3, r.rule * 1e3,
          r.landed * 1e3, r.update / r.bare, r.rule / r.bare, r.scan / r.update,
          (r.update + r.landed) / r.bare);
      sane = sane && r.bare > 0.0 && r.update > 0.0 && r.rule > 0.0;
    }
    return options.check && !sane ? 1 : 0;
  } catch (const zeroshard::Error& error) {
    std::fprintf(stderr, "zeroshard-offload-step-bench: %s\n", error.what());
    return 1;
  }
}
