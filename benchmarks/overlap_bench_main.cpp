// zeroshard-overlap-bench: does the engine's communication hide behind the model's compute? For
// each ZeRO stage it times, on a chain of square linear layers, one training step as the engine
// runs it (bucket reductions started by grad_ready() while backward goes on, stage-3 gathers
// prefetched), and beside it the same step's compute alone and communication alone. A ratio
// overlapped / (compute + communication) under 1 is time the overlap saved.
//
// With --super-offload it asks the same of the offloaded optimizer: AdamW in CPU memory, the step
// with the update after backward beside the step with super_offload (the update during backward),
// their steps alternated.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_median.h"
#include "command_line.h"
#include "mlp_math.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Communicator;
using zeroshard::Device;
using zeroshard::Engine;
using zeroshard::examples::MlpMath;
using Clock = std::chrono::steady_clock;

constexpr const char* kDescription =
    "Each ZeRO stage's training step on a chain of square linear layers, beside the same step's "
    "compute alone and communication alone. Run under mpirun for several ranks, e.g.\n"
    "  mpirun -np 2 zeroshard-overlap-bench";

struct Options {
  std::string device = "cpu";
  std::string stages = "0123";
  int layers = 8;
  int width = 512;
  int batch = 64;
  int steps = 10;
  int warmup = 2;
  bool check = false;
  bool super_offload = false;
};

void add_flags(CLI::App& app, Options& options) {
  using zeroshard::cli::add_integer;
  app.add_option("--device", options.device, "where the engine and the model compute")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--stages", options.stages, "the ZeRO stages to measure, as digits")
      ->check(zeroshard::cli::stage_digits())
      ->capture_default_str();
  add_integer(app, "--layers", options.layers, "linear layers of W x W weights")
      ->capture_default_str();
  add_integer(app, "--width", options.width, "W")->capture_default_str();
  add_integer(app, "--batch", options.batch, "samples per step and rank")->capture_default_str();
  add_integer(app, "--steps", options.steps, "timed steps per measurement; the median is reported")
      ->capture_default_str();
  add_integer(app, "--warmup", options.warmup, "untimed steps first")->capture_default_str();
  app.add_flag("--super-offload", options.super_offload,
               "compare the offloaded AdamW update after backward with super_offload's update "
               "during backward, alternated, instead of compute and communication");
  app.add_flag("--check", options.check,
               "exit 1 unless every time is positive and finite (for the test suite)");
}

/// How the optimizer runs: SGD on the engine's device, or AdamW offloaded to CPU memory with
/// its update after backward or, under super_offload, during it.
enum class Update { kResident, kOffloaded, kSuperOffloaded };

std::string config_json(int stage, const Options& options, Update update) {
  // One layer's weights per bucket, so that each layer's grad_ready() can start a reduction, and
  // two layers prefetched ahead at stage 3.
  const long long layer = static_cast<long long>(options.width) * options.width;
  const std::string optimizer = update == Update::kResident
                                    ? R"({"type": "SGD", "params": {"lr": 0.001}})"
                                    : R"({"type": "AdamW", "params": {"lr": 0.0001}})";
  std::string offload;
  if (update != Update::kResident) {
    offload = std::string(R"(, "offload_optimizer": {"device": "cpu", "super_offload": )") +
              (update == Update::kSuperOffloaded ? "true" : "false") + "}";
  }
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(options.batch) +
         R"(, "optimizer": )" + optimizer + R"(, "zero_optimization": {"stage": )" +
         std::to_string(stage) + R"(, "overlap_comm": true, "reduce_bucket_size": )" +
         std::to_string(layer) + R"(, "allgather_bucket_size": )" + std::to_string(layer) +
         R"(, "stage3_prefetch_bucket_size": )" + std::to_string(2 * layer) + offload + "}}";
}

// A chain of linear layers y = x W^T without bias or activation: enough arithmetic per layer
// (three matrix products of batch x W x W) for a reduction to hide behind.
class LayerChain {
 public:
  LayerChain(Engine& engine, MlpMath& math, const Options& options)
      : engine_(engine), math_(math), width_(options.width), batch_(options.batch) {
    const std::size_t activation = static_cast<std::size_t>(batch_) * width_ * sizeof(float);
    for (int i = 0; i <= options.layers; ++i) {
      activations_.push_back(engine.allocate_activations(activation));
    }
    grad_a_ = engine.allocate_activations(activation);
    grad_b_ = engine.allocate_activations(activation);
    bias_grad_ = engine.allocate_activations(static_cast<std::size_t>(width_) * sizeof(float));
    weight_grad_scratch_ =
        engine.allocate_activations(static_cast<std::size_t>(width_) * width_ * sizeof(float));
    zero_bias_ = engine.allocate_activations(static_cast<std::size_t>(width_) * sizeof(float));
    for (int i = 0; i < options.layers; ++i) {
      const std::string name = "layer" + std::to_string(i);
      weights_.push_back(engine.register_parameter(name + ".weight", {width_, width_}));
      modules_.push_back(engine.module(name));
    }
  }

  void initialize() {
    std::vector<float> values(static_cast<std::size_t>(width_) * width_);
    for (std::size_t k = 0; k < values.size(); ++k) {
      values[k] = (static_cast<float>(k % 17) - 8.0f) / (8.0f * static_cast<float>(width_));
    }
    for (const zeroshard::Parameter& weight : weights_) weight.copy_from(values);
    std::vector<float> input(static_cast<std::size_t>(batch_) * width_, 0.5f);
    math_.upload(activations_[0].data(), input.data(), input.size() * sizeof(float));
  }

  /// Forward and backward through every layer; with `communicate` the engine gathers (stage 3)
  /// and reduces as training does, without it only the arithmetic runs.
  void forward_backward(bool communicate) {
    const std::size_t layers = weights_.size();
    for (std::size_t i = 0; i < layers; ++i) {
      std::optional<Engine::GatheredModule> gathered;
      if (communicate) gathered.emplace(engine_.gathered(modules_[i]));
      math_.linear_forward(activations_[i].data(), weights_[i].data(), zero_bias_.data(),
                           activations_[i + 1].data(), batch_, width_, width_, false);
    }
    float* output_grad = activations_[layers].data();
    float* spare[2] = {grad_a_.data(), grad_b_.data()};
    for (std::size_t i = layers; i-- > 0;) {
      std::optional<Engine::GatheredModule> gathered;
      if (communicate) gathered.emplace(engine_.gathered(modules_[i]));
      // Without communication the gradient goes to scratch memory: the engine's gradient buffer
      // is borrowed only between grad_target() and grad_ready().
      const zeroshard::GradTarget weight_grad =
          communicate ? weights_[i].grad_target()
                      : zeroshard::GradTarget{weight_grad_scratch_.data(), false};
      math_.linear_grads(output_grad, activations_[i].data(), static_cast<float*>(weight_grad.data),
                         bias_grad_.data(), batch_, width_, width_, weight_grad.accumulate, true);
      math_.input_grad(output_grad, weights_[i].data(), spare[i % 2], batch_, width_, width_);
      output_grad = spare[i % 2];
      if (communicate) engine_.grad_ready(weights_[i]);
    }
  }

  /// The engine's part of a step with the arithmetic left out: the same gathers, gradients
  /// handed over in the same order, and the same reductions.
  void communicate_only() {
    for (zeroshard::ModuleId module : modules_) {
      const Engine::GatheredModule gathered = engine_.gathered(module);
    }
    for (std::size_t i = weights_.size(); i-- > 0;) {
      const Engine::GatheredModule gathered = engine_.gathered(modules_[i]);
      engine_.grad_ready(weights_[i]);
    }
  }

  /// Every layer gathered for the guards' lifetime, so that forward_backward(false) runs the
  /// arithmetic alone at every stage.
  std::vector<Engine::GatheredModule> gather_all() {
    std::vector<Engine::GatheredModule> all;
    for (zeroshard::ModuleId module : modules_) all.push_back(engine_.gathered(module));
    return all;
  }

  /// Waits until the device has finished the work queued so far.
  void synchronize() {
    float probe = 0.0f;
    zeroshard::copy_to_host(engine_.device(), &probe, zero_bias_.data(), sizeof probe,
                            engine_.compute_stream());
  }

 private:
  Engine& engine_;
  MlpMath& math_;
  int width_;
  int batch_;
  std::vector<zeroshard::Parameter> weights_;
  std::vector<zeroshard::ModuleId> modules_;
  std::vector<zeroshard::ActivationBuffer> activations_;
  zeroshard::ActivationBuffer grad_a_;
  zeroshard::ActivationBuffer grad_b_;
  zeroshard::ActivationBuffer bias_grad_;
  zeroshard::ActivationBuffer weight_grad_scratch_;
  zeroshard::ActivationBuffer zero_bias_;
};

struct StageTimes {
  int stage = 0;
  double compute_ms = 0.0;
  double comm_ms = 0.0;
  double overlapped_ms = 0.0;
};

// The median over `steps` runs of `body`, every rank starting together and the slowest rank's
// time kept: a step is as slow as its slowest rank.
template <class Body>
double median_ms(Communicator& host, LayerChain& chain, const Options& options, Body body) {
  std::vector<double> times;
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    chain.synchronize();
    host.barrier();
    const Clock::time_point start = Clock::now();
    body();
    chain.synchronize();
    float ms = std::chrono::duration<float, std::milli>(Clock::now() - start).count();
    host.all_reduce(&ms, 1, zeroshard::DType::kFloat32, zeroshard::ReduceOp::kMax);
    if (step >= options.warmup) times.push_back(ms);
  }
  return zeroshard::bench::median(times);
}

StageTimes measure(int stage, const Device& device, Communicator& host, const Options& options) {
  const zeroshard::Config config = zeroshard::Config::from_json_string(
      config_json(stage, options, Update::kResident), host.size());
  Engine engine(config, device, Communicator::from_environment(device));
  const std::unique_ptr<MlpMath> math = zeroshard::examples::make_mlp_math(device);
  engine.set_compute_stream(math->stream());
  LayerChain chain(engine, *math, options);
  chain.initialize();

  StageTimes times{.stage = stage};
  {
    // Gathered outside the timed steps: at stage 3 the all-gathers belong to comm, and counting
    // them in compute as well would make compute + comm overstate the serial time.
    const std::vector<Engine::GatheredModule> gathered = chain.gather_all();
    times.compute_ms = median_ms(host, chain, options, [&] { chain.forward_backward(false); });
  }
  times.comm_ms = median_ms(host, chain, options, [&] {
    chain.communicate_only();
    engine.step();
  });
  times.overlapped_ms = median_ms(host, chain, options, [&] {
    chain.forward_backward(true);
    engine.step();
  });
  return times;
}

/// One model and engine per way of updating, trained side by side.
struct Trainer {
  Trainer(int stage, Update update, const Device& device, Communicator& host,
          const Options& options)
      : engine(
            zeroshard::Config::from_json_string(config_json(stage, options, update), host.size()),
            device, Communicator::from_environment(device)),
        math(zeroshard::examples::make_mlp_math(device)) {
    engine.set_compute_stream(math->stream());
    chain.emplace(engine, *math, options);
    chain->initialize();
  }
  struct StepMs {
    double total = 0.0;
    double in_step = 0.0;  ///< of it, in step()
  };
  /// One training step, the slowest rank's time.
  StepMs step(Communicator& host) {
    chain->synchronize();
    host.barrier();
    const Clock::time_point start = Clock::now();
    chain->forward_backward(true);
    const Clock::time_point step_start = Clock::now();
    overlapped += engine.step().overlapped ? 1 : 0;
    chain->synchronize();
    const Clock::time_point end = Clock::now();
    float ms[2] = {std::chrono::duration<float, std::milli>(end - start).count(),
                   std::chrono::duration<float, std::milli>(end - step_start).count()};
    host.all_reduce(ms, 2, zeroshard::DType::kFloat32, zeroshard::ReduceOp::kMax);
    return {ms[0], ms[1]};
  }

  Engine engine;
  std::unique_ptr<MlpMath> math;
  std::optional<LayerChain> chain;
  int overlapped = 0;  ///< steps whose update ran during backward and was kept
};

struct SuperOffloadTimes {
  int stage = 0;
  double sequential_ms = 0.0;
  double sequential_step_ms = 0.0;  ///< of it, in step()
  double overlapped_ms = 0.0;
  double overlapped_step_ms = 0.0;
  int kept = 0;  ///< timed steps super_offload kept the overlapped update of
};

SuperOffloadTimes measure_super_offload(int stage, const Device& device, Communicator& host,
                                        const Options& options) {
  Trainer sequential(stage, Update::kOffloaded, device, host, options);
  Trainer overlapped(stage, Update::kSuperOffloaded, device, host, options);
  std::vector<double> times[4];  // sequential total, in step(); overlapped total, in step()
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    if (step == options.warmup) overlapped.overlapped = 0;
    // Alternated, and which goes first alternates too: the machine's noise falls on both alike.
    const bool sequential_first = step % 2 == 0;
    const Trainer::StepMs first = (sequential_first ? sequential : overlapped).step(host);
    const Trainer::StepMs second = (sequential_first ? overlapped : sequential).step(host);
    if (step < options.warmup) continue;
    const Trainer::StepMs& s = sequential_first ? first : second;
    const Trainer::StepMs& o = sequential_first ? second : first;
    for (auto [k, ms] : {std::pair{0, s.total}, {1, s.in_step}, {2, o.total}, {3, o.in_step}}) {
      times[k].push_back(ms);
    }
  }
  return {.stage = stage,
          .sequential_ms = zeroshard::bench::median(times[0]),
          .sequential_step_ms = zeroshard::bench::median(times[1]),
          .overlapped_ms = zeroshard::bench::median(times[2]),
          .overlapped_step_ms = zeroshard::bench::median(times[3]),
          .kept = overlapped.overlapped};
}

bool print_super_offload(const Device& device, Communicator& host, const Options& options) {
  const bool print = host.rank() == 0;
  if (print) {
    std::printf(
        "  sequential:  AdamW offloaded to CPU memory, its update in step() after backward\n"
        "  overlapped:  the same with super_offload, each bucket's shard updated as it arrives\n"
        "               during backward\n"
        "  (in step()): the part of the step spent in Engine::step(), median on its own\n\n"
        "stage | sequential ms (in step()) | overlapped ms (in step()) | overlapped/sequential | "
        "steps kept overlapped\n");
  }
  bool sane = true;
  for (char digit : options.stages) {
    const int stage = digit - '0';
    if (stage == 0) continue;  // offload_optimizer needs stage 1-3
    const SuperOffloadTimes t = measure_super_offload(stage, device, host, options);
    sane = sane && std::isfinite(t.sequential_ms) && t.sequential_ms > 0.0 &&
           std::isfinite(t.overlapped_ms) && t.overlapped_ms > 0.0 && t.kept == options.steps;
    if (print) {
      std::printf("%5d | %13.2f (%9.2f) | %13.2f (%9.2f) | %21.3f | %d of %d\n", t.stage,
                  t.sequential_ms, t.sequential_step_ms, t.overlapped_ms, t.overlapped_step_ms,
                  t.overlapped_ms / t.sequential_ms, t.kept, options.steps);
      std::fflush(stdout);
    }
  }
  return sane;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, "zeroshard-overlap-bench");
  add_flags(app, options);
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  // The program's own timing collectives go through a host communicator of their own.
  std::unique_ptr<Communicator> host;
  try {
    host = Communicator::from_environment();
    Device device = Device::cpu();
    if (options.device == "cuda") {
      if (!zeroshard::cuda_available()) {
        if (host->rank() == 0) {
          std::printf("zeroshard-overlap-bench: skipped, no GPU: %s\n",
                      zeroshard::cuda_unavailable_reason().c_str());
        }
        return 0;
      }
      device = Device::from_environment();
    }
    const bool print = host->rank() == 0;
    const long long parameters =
        static_cast<long long>(options.layers) * options.width * options.width;
    if (print) {
      std::printf(
          "zeroshard-overlap-bench: %d rank(s) on %s, %d layers of %dx%d (%lld parameters), batch "
          "%d per rank, median of %d steps after %d warm-up, slowest rank\n",
          host->size(), device.to_string().c_str(), options.layers, options.width, options.width,
          parameters, options.batch, options.steps, options.warmup);
    }
    if (options.super_offload) {
      const bool sane = print_super_offload(device, *host, options);
      if (options.check && !sane) {
        std::fprintf(stderr,
                     "zeroshard-overlap-bench: a time was not positive and finite, or a step "
                     "did not keep its overlapped update\n");
        return 1;
      }
      return 0;
    }
    if (print) {
      std::printf(
          "  compute:     forward + backward arithmetic, every layer gathered beforehand\n"
          "  comm:        the same gathers, gradient hand-overs and step() (with its update), no "
          "model\n"
          "               arithmetic\n"
          "  overlapped:  the training step as the engine runs it (overlap_comm, prefetch)\n\n"
          "stage | compute ms | comm ms | compute+comm ms | overlapped ms | "
          "overlapped/(compute+comm)\n");
    }
    bool sane = true;
    for (char digit : options.stages) {
      const StageTimes t = measure(digit - '0', device, *host, options);
      const double serial = t.compute_ms + t.comm_ms;
      const double ratio = t.overlapped_ms / serial;
      for (double value : {t.compute_ms, t.comm_ms, t.overlapped_ms}) {
        sane = sane && std::isfinite(value) && value > 0.0;
      }
      if (print) {
        std::printf("%5d | %10.2f | %7.2f | %15.2f | %13.2f | %25.3f\n", t.stage, t.compute_ms,
                    t.comm_ms, serial, t.overlapped_ms, ratio);
        std::fflush(stdout);
      }
    }
    if (options.check && !sane) {
      std::fprintf(stderr, "zeroshard-overlap-bench: a time was not positive and finite\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zeroshard-overlap-bench: %s\n", error.what());
    if (host && host->size() > 1) host->abort(1);
    return 1;
  }
}
