// zeroshard-torch-bench: the libtorch example's GPT measured side by side in one run. Step time of
// zeroshard::torch::Optimizer at stage 0 against the same loop with torch::optim::AdamW (any
// number of ranks; one process needs no mpirun), and under mpirun with 2+ ranks each rank's
// model-state bytes at stage 3 against stage 0, beside the bytes stage 3 held gathered at once.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "command_line.h"
#include "torch_gpt_batches.h"  // torch_gpt::Batch
#include "torch_gpt_flags.h"
#include "torch_gpt_model.h"
#include "torch_gpt_trainers.h"
#include "zeroshard/torch.h"

namespace {

using torch_gpt::Gpt;
using torch_gpt::GptShape;
using zeroshard::Communicator;

constexpr const char* kProgram = "zeroshard-torch-bench";
constexpr const char* kDescription =
    "The libtorch example's GPT: step time of zeroshard stage 0 against torch::optim::AdamW in "
    "the same loop, and (under mpirun with 2+ ranks) per-rank model-state bytes of stage 3 "
    "against stage 0, e.g.\n"
    "  zeroshard-torch-bench\n"
    "  mpirun -np 2 zeroshard-torch-bench --check";

struct Options {
  GptShape shape{.vocab = 96, .layers = 4, .width = 64, .heads = 4, .seq = 64};
  int batch = 8;
  int steps = 10;
  int repeats = 5;
  int warmup = 3;
  bool check = false;
};

// examples/configs/zero<stage>.json, with the benchmark's micro batch.
zeroshard::Config bench_config(int stage, int batch, int world) {
  const std::string json = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(batch) +
                           R"(, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
      "zero_optimization": {"stage": )" +
                           std::to_string(stage) +
                           R"(, "reduce_bucket_size": 50000, "allgather_bucket_size": 50000,
      "stage3_prefetch_bucket_size": 50000, "stage3_param_persistence_threshold": 1000,
      "stage3_max_live_parameters": 1000000, "stage3_max_reuse_distance": 0}})";
  return zeroshard::Config::from_json_string(json, world);
}

// Random tokens, different on each rank and step, the same for both trainers.
std::vector<torch_gpt::Batch> make_batches(const Options& options, int rank, int count) {
  torch::manual_seed(1000 + static_cast<std::uint64_t>(rank));
  std::vector<torch_gpt::Batch> batches;
  for (int i = 0; i < count; ++i) {
    const torch::Tensor text =
        torch::randint(options.shape.vocab, {options.batch, options.shape.seq + 1}, torch::kLong);
    batches.push_back({text.narrow(1, 0, options.shape.seq), text.narrow(1, 1, options.shape.seq)});
  }
  return batches;
}

// Seconds per step of `steps` training steps.
template <class Trainer>
std::vector<double> timed_steps(Trainer& trainer, Gpt& model,
                                const std::vector<torch_gpt::Batch>& batches, int steps) {
  std::vector<double> seconds;
  for (int step = 0; step < steps; ++step) {
    const torch_gpt::Batch& batch = batches[static_cast<std::size_t>(step) % batches.size()];
    const auto start = std::chrono::steady_clock::now();
    trainer.zero_grad();
    trainer.backward(model->loss(batch.tokens, batch.targets));
    trainer.step();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5)];
}

// Stage 0 against torch::optim::AdamW: the two trainers alternate, each running `steps` steps
// per round (the first of each round's pair swapped every round), so drift in the machine's speed
// falls on both alike. Prints rank 0's medians and their ratio.
void compare_step_time(const Options& options, Communicator& communicator) {
  const int world = communicator.size();
  const std::vector<torch_gpt::Batch> batches =
      make_batches(options, communicator.rank(), options.steps);
  Gpt zeroshard_model = torch_gpt::make_gpt(options.shape, 1);
  Gpt torch_model = torch_gpt::make_gpt(options.shape, 1);
  torch_gpt::ZeroshardTrainer zeroshard_trainer(*zeroshard_model,
                                                bench_config(0, options.batch, world));
  torch_gpt::TorchTrainer torch_trainer(*torch_model, bench_config(0, options.batch, world),
                                        communicator);
  timed_steps(zeroshard_trainer, zeroshard_model, batches, options.warmup);
  timed_steps(torch_trainer, torch_model, batches, options.warmup);
  std::vector<double> zeroshard_seconds;
  std::vector<double> torch_seconds;
  for (int round = 0; round < options.repeats; ++round) {
    const auto run_zeroshard = [&] {
      const std::vector<double> s =
          timed_steps(zeroshard_trainer, zeroshard_model, batches, options.steps);
      zeroshard_seconds.insert(zeroshard_seconds.end(), s.begin(), s.end());
    };
    const auto run_torch = [&] {
      const std::vector<double> s = timed_steps(torch_trainer, torch_model, batches, options.steps);
      torch_seconds.insert(torch_seconds.end(), s.begin(), s.end());
    };
    if (round % 2 == 0) {
      run_zeroshard();
      run_torch();
    } else {
      run_torch();
      run_zeroshard();
    }
  }
  if (communicator.rank() != 0) return;
  const double zeroshard_median = quantile(zeroshard_seconds, 0.5);
  const double torch_median = quantile(torch_seconds, 0.5);
  const std::string torch_label =
      world > 1 ? "torch::optim::AdamW + all-reduce" : "torch::optim::AdamW";
  std::printf("\nstep time, rank 0: %zu steps each, %d rounds alternating\n",
              zeroshard_seconds.size(), options.repeats);
  std::printf("  %-40s %10s %10s %10s\n", "", "median ms", "p10 ms", "p90 ms");
  std::printf("  %-40s %10.2f %10.2f %10.2f\n", torch_label.c_str(), torch_median * 1e3,
              quantile(torch_seconds, 0.1) * 1e3, quantile(torch_seconds, 0.9) * 1e3);
  std::printf("  %-40s %10.2f %10.2f %10.2f\n", "zeroshard::torch::Optimizer, stage 0",
              zeroshard_median * 1e3, quantile(zeroshard_seconds, 0.1) * 1e3,
              quantile(zeroshard_seconds, 0.9) * 1e3);
  std::printf("  %-40s %10.3f   (target <= 1.05)\n", "ratio of medians, zeroshard / torch",
              zeroshard_median / torch_median);
  std::fflush(stdout);
}

struct StageMemory {
  std::int64_t model_state = 0;
  std::int64_t gathered_peak = 0;
};

// A few steps at `stage` (so that stage 3 has gathered every unit), then this rank's bytes.
StageMemory stage_memory(const Options& options, int stage, int world,
                         const std::vector<torch_gpt::Batch>& batches) {
  Gpt model = torch_gpt::make_gpt(options.shape, 1);
  torch_gpt::ZeroshardTrainer trainer(*model, bench_config(stage, options.batch, world));
  timed_steps(trainer, model, batches, static_cast<int>(batches.size()));
  const zeroshard::Engine& engine = trainer.optimizer().engine();
  return {engine.memory_report().model_state_bytes(engine.memory_location()),
          engine.peak_gathered_bytes()};
}

// Stage 3 against stage 0 on the same ranks: stage 3 keeps 1/world of the model states plus what
// it gathers, so its share is bounded by 1/world + window / stage-0 bytes. Returns whether every
// rank is within the bound.
bool compare_memory(const Options& options, Communicator& communicator) {
  const int world = communicator.size();
  const int rank = communicator.rank();
  const std::vector<torch_gpt::Batch> batches = make_batches(options, rank, 2);
  const StageMemory stage0 = stage_memory(options, 0, world, batches);
  const StageMemory stage3 = stage_memory(options, 3, world, batches);
  const double ratio =
      static_cast<double>(stage3.model_state) / static_cast<double>(stage0.model_state);
  const double bound = 1.0 / world + static_cast<double>(stage3.gathered_peak) /
                                         static_cast<double>(stage0.model_state);
  // In whole bytes (stage 3 <= stage 0 / world + gathered), so an equality is no rounding.
  const bool within =
      world * stage3.model_state <= stage0.model_state + world * stage3.gathered_peak;
  char line[256];
  std::snprintf(line, sizeof line, "  %4d %14lld %14lld %14lld %9.4f %9.4f  %s", rank,
                static_cast<long long>(stage0.model_state),
                static_cast<long long>(stage3.model_state),
                static_cast<long long>(stage3.gathered_peak), ratio, bound, within ? "ok" : "OVER");
  const std::vector<std::string> lines = communicator.all_gather_text(line);
  if (rank == 0) {
    std::printf(
        "\nmodel-state bytes per rank (parameters + gradients + master + optimizer states), "
        "%d ranks\n"
        "  rank  stage 0 bytes  stage 3 bytes  gathered peak 3/0 ratio     bound  (1/%d + "
        "gathered / stage 0)\n",
        world, world);
    for (const std::string& text : lines) std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
  double over = within ? 0.0 : 1.0;
  communicator.all_reduce(std::span<double>(&over, 1));
  return over == 0.0;
}

int run(const Options& options) {
  std::unique_ptr<Communicator> communicator = Communicator::from_environment();
  const int world = communicator->size();
  if (communicator->rank() == 0) {
    const Gpt model = torch_gpt::make_gpt(options.shape, 1);
    std::printf(
        "%s: GPT %lld layers x %lld wide x %lld heads, context %lld, vocabulary %lld, %lld "
        "parameters, micro batch %d, %d rank(s), %d torch thread(s) per rank\n",
        kProgram, static_cast<long long>(options.shape.layers),
        static_cast<long long>(options.shape.width), static_cast<long long>(options.shape.heads),
        static_cast<long long>(options.shape.seq), static_cast<long long>(options.shape.vocab),
        static_cast<long long>(model->parameter_count()), options.batch, world,
        torch::get_num_threads());
    std::fflush(stdout);
  }
  compare_step_time(options, *communicator);
  if (world < 2) return 0;
  const bool within = compare_memory(options, *communicator);
  if (!within && options.check) {
    if (communicator->rank() == 0) {
      std::fprintf(stderr, "%s: stage 3 holds more than its bound on some rank (OVER above)\n",
                   kProgram);
    }
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, kProgram);
  using zeroshard::cli::add_integer;
  torch_gpt::add_shape_flags(app, options.shape);
  add_integer(app, "--batch", options.batch, "sequences per rank per step")->capture_default_str();
  add_integer(app, "--steps", options.steps, "timed steps per trainer per round")
      ->capture_default_str();
  add_integer(app, "--repeats", options.repeats, "rounds; medians over every timed step")
      ->capture_default_str();
  add_integer(app, "--warmup", options.warmup, "untimed steps per trainer first", 0)
      ->capture_default_str();
  app.add_flag("--check", options.check,
               "exit 1 when stage 3's model-state bytes exceed their bound on any rank (timings "
               "are printed, never asserted)");
  app.callback([&options] {
    if (options.shape.width % options.shape.heads != 0) {
      throw CLI::ValidationError("--heads does not divide --width");
    }
  });
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", kProgram, error.what());
    return 1;
  }
}
