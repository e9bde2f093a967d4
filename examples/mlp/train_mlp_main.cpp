// zeroshard-train-mlp: trains the example MLP on the synthetic task with the ZeRO stage a
// DeepSpeed-style config picks, printing loss, speed and per-rank memory as it goes.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mlp_model.h"
#include "report_json.h"
#include "run_guard.h"
#include "synthetic_data.h"
#include "trainer_options.h"
#include "trainer_setup.h"
#include "training_checkpoints.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Communicator;
using zeroshard::DType;
using zeroshard::examples::MlpModel;
using zeroshard::examples::MlpShape;
using zeroshard::examples::MlpTraining;
using zeroshard::examples::SyntheticClassification;

constexpr const char* kProgram = "zeroshard-train-mlp";
constexpr const char* kUsage =
    "usage: zeroshard-train-mlp --config FILE --steps N [--layers L] [--width W] [--inputs I]\n"
    "                           [--classes C] [--seed S] [--precision P] [--device D]\n"
    "                           [--checkpoint-every K] [--dropout P] [--report-json FILE]\n"
    "                           [--save-dir DIR [--save-every K]] [--resume DIR]\n"
    "                           [--init-from FILE.safetensors] [--grad-handover H]\n"
    "                           [--adopt-memory]\n"
    "  --config FILE       DeepSpeed-style JSON config (zero_optimization.stage picks the stage)\n"
    "  --steps N           optimizer steps to run, each over one global batch\n"
    "  --layers L          linear layers (default 4)\n"
    "  --width W           hidden width (default 256)\n"
    "  --inputs I          input features (default 64)\n"
    "  --classes C         classes of the synthetic task (default 10)\n"
    "  --seed S            seed of the weights and the data (default 1)\n"
    "  --precision P       fp32, fp16 or bf16; overrides the config's fp16/bf16 sections\n"
    "  --device D          cpu, cuda or auto (default): auto takes the GPU the local rank picks\n"
    "                      when there is one (see ZEROSHARD_DEVICE), the CPU otherwise\n"
    "  --checkpoint-every K  activation checkpointing: blocks of K layers keep only their input\n"
    "                      and run again in backward (default 0, off); the config's\n"
    "                      activation_checkpointing section says where kept inputs go\n"
    "  --dropout P         dropout probability after each hidden layer (default 0)\n"
    "  --report-json FILE  rank 0 writes losses, parameter checksums and memory reports\n"
    "  --save-dir DIR      save checkpoints into DIR (tags stepK), at the end of the run and\n"
    "  --save-every K      every K steps\n"
    "  --resume DIR        continue from DIR's latest checkpoint, data position included; --steps\n"
    "                      stays the total, so the run ends where an uninterrupted one does\n"
    "  --init-from FILE    start from the weights of a safetensors file (zeroshard-consolidate)\n"
    "  --grad-handover H   layer (default): each layer hands its gradients over as its backward\n"
    "                      ends; end: all at once after the whole backward, as a model with\n"
    "                      weights stacked over layers must (GradHandover::kAtEnd)\n"
    "  --adopt-memory      the model allocates its parameters and gradients itself and lends\n"
    "                      them to the engine (Engine::adopt_memory)\n"
    "Run under mpirun for several ranks, e.g.\n"
    "  mpirun -np 4 zeroshard-train-mlp --config examples/configs/zero3.json --steps 30\n";

struct Options {
  zeroshard::examples::TrainerOptions common;
  MlpShape shape{.inputs = 64, .width = 256, .layers = 4, .classes = 10};
  MlpTraining training;
  std::uint64_t seed = 1;
  std::string init_from;
};

// Returns the problem with the command line, or nothing when it is usable.
std::optional<std::string> parse_options(int argc, char** argv, Options& options) {
  using zeroshard::examples::OwnFlag;
  using zeroshard::examples::parse_number;
  using zeroshard::examples::parse_positive;
  zeroshard::examples::TrainerFlags flags;
  flags.steps_required = true;
  flags.is_switch = [](std::string_view flag) { return flag == "--adopt-memory"; };
  flags.own = [&](std::string_view flag, std::string_view value) {
    OwnFlag result;
    result.known = true;
    std::optional<std::string>& problem = result.problem;
    if (flag == "--adopt-memory") {
      options.training.adopt_memory = true;
    } else if (flag == "--layers") {
      problem = parse_positive(flag, value, options.shape.layers);
    } else if (flag == "--width") {
      problem = parse_positive(flag, value, options.shape.width);
    } else if (flag == "--inputs") {
      problem = parse_positive(flag, value, options.shape.inputs);
    } else if (flag == "--classes") {
      problem = parse_positive(flag, value, options.shape.classes);
    } else if (flag == "--seed") {
      if (!parse_number(value, options.seed)) {
        problem = "--seed: expected a non-negative integer, got '" + std::string(value) + "'";
      }
    } else if (flag == "--dropout") {
      float& p = options.training.dropout;
      if (!parse_number(value, p) || !(p >= 0.0f && p < 1.0f)) {
        problem = "--dropout: expected a probability in [0, 1), got '" + std::string(value) + "'";
      }
    } else if (flag == "--init-from") {
      options.init_from = value;
    } else if (flag == "--grad-handover") {
      if (value != "layer" && value != "end") {
        problem = "--grad-handover: expected layer or end, got '" + std::string(value) + "'";
      }
      options.training.grad_handover =
          value == "end" ? zeroshard::GradHandover::kAtEnd : zeroshard::GradHandover::kPerParameter;
    } else {
      result.known = false;
    }
    return result;
  };
  std::optional<std::string> problem =
      zeroshard::examples::parse_trainer_options(argc, argv, options.common, flags);
  options.training.checkpoint_every = options.common.checkpoint_every;
  return problem;
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// `communicator` carries the program's own collectives (loss, reports), apart from the engine's,
// so they can never interleave with the engine's outstanding transfers.
int train(const Options& options, Communicator& communicator,
          zeroshard::examples::RunProgress& progress) {
  namespace examples = zeroshard::examples;
  const examples::TrainerOptions& common = options.common;
  const int rank = communicator.rank();
  const int world = communicator.size();

  const zeroshard::Config config = examples::load_trainer_config(common, world);
  examples::print_config_notices(config, rank);
  const int micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int accumulation = static_cast<int>(config.gradient_accumulation_steps);

  const zeroshard::Device device = examples::choose_device(common.device);
  progress.in_lockstep = false;
  zeroshard::Engine engine(config, device, Communicator::from_environment(device));
  MlpModel model(engine, options.shape, micro_batch, options.training);
  model.initialize(options.seed);
  const SyntheticClassification data(options.shape.inputs, options.shape.classes, options.seed);
  if (!options.init_from.empty()) engine.load_weights(options.init_from);
  examples::TrainingCheckpoints checkpoints(engine, common, kProgram, rank);
  const int first_step = checkpoints.resume();
  const examples::Checksum initial = examples::checksum(engine.consolidated_parameters());
  // The report's peaks cover the training steps, not the set-up and the checksums' gathers.
  engine.reset_memory_peaks();

  if (rank == 0) {
    std::printf(
        "zeroshard-train-mlp: stage %d, %d rank(s) on %s (%s), %s, %s, MLP %d-%dx%d-%d with %lld "
        "parameters, global batch %d x %d x %d = %lld, checkpoint every %d layers, dropout %g\n",
        engine.stage(), world, device.to_string().c_str(), engine.communicator().backend().c_str(),
        to_string(engine.model_dtype()), engine.update_rule().name().c_str(), options.shape.inputs,
        options.shape.layers, options.shape.width, options.shape.classes,
        static_cast<long long>(model.parameter_count()), micro_batch, accumulation, world,
        static_cast<long long>(micro_batch) * accumulation * world,
        options.training.checkpoint_every, static_cast<double>(options.training.dropout));
    std::fflush(stdout);
  }

  std::vector<float> x(static_cast<std::size_t>(micro_batch) * options.shape.inputs);
  std::vector<int> labels(static_cast<std::size_t>(micro_batch));
  std::vector<double> losses;
  for (int step = first_step; step < common.steps; ++step) {
    std::chrono::steady_clock::duration busy{};
    float loss = 0.0f;
    zeroshard::StepResult result;
    for (int micro = 0; micro < accumulation; ++micro) {
      const auto range =
          examples::data_parallel_range(step, micro, accumulation, micro_batch, rank, world);
      data.sample(range.first, range.count, x.data(), labels.data());
      const auto start = std::chrono::steady_clock::now();
      loss += model.train_micro_step(x.data(), labels.data(), range.count);
      // The engine knows where the accumulation window ends; in between, step() only reduces.
      result = engine.step();
      busy += std::chrono::steady_clock::now() - start;
    }
    // Every rank's micro-batches are the same size, so the mean of the rank means is the mean
    // over the global batch.
    float stats[2] = {loss / static_cast<float>(accumulation),
                      static_cast<float>(
                          mib(engine.memory_report().model_state_bytes(engine.memory_location())))};
    communicator.all_reduce(&stats[0], 1, DType::kFloat32, zeroshard::ReduceOp::kSum);
    communicator.all_reduce(&stats[1], 1, DType::kFloat32, zeroshard::ReduceOp::kMax);
    const double global_loss = static_cast<double>(stats[0]) / world;
    losses.push_back(global_loss);
    // One line per step; the engine adds its own lr / grad-norm line every steps_per_print.
    if (rank == 0) {
      std::printf(
          "step %5d/%d | loss %.6f | lr %.3e | grad norm %.4f | %8.2f ms/step | model states "
          "%.3f MiB/rank%s\n",
          step + 1, common.steps, global_loss, result.lr, result.grad_norm,
          std::chrono::duration<double, std::milli>(busy).count(), static_cast<double>(stats[1]),
          result.skipped ? " | skipped (overflow)" : "");
      std::fflush(stdout);
    }
    checkpoints.after_step(step);
  }
  checkpoints.finish();

  const zeroshard::MemoryReport report = engine.memory_report();
  const examples::Checksum final_checksum = examples::checksum(engine.consolidated_parameters());
  const examples::GatheredMemory memory = examples::gather_memory(communicator, report);
  if (rank != 0) return 0;

  std::printf("final loss %.6f, parameter checksum sum %.9g abs %.9g\n", losses.back(),
              final_checksum.sum, final_checksum.abs_sum);
  for (const std::string& table : memory.tables) std::printf("%s", table.c_str());
  std::fflush(stdout);
  if (!common.report_json.empty()) {
    nlohmann::json out =
        examples::run_report(engine, config, device,
                             {.losses = losses,
                              .initial = initial,
                              .final = final_checksum,
                              .first_step = first_step,
                              .world = world,
                              .parameters = model.parameter_count(),
                              .checkpoint_every = options.training.checkpoint_every,
                              .checkpointer = model.checkpointer()});
    out["dropout"] = options.training.dropout;
    out["grad_handover"] =
        options.training.grad_handover == zeroshard::GradHandover::kAtEnd ? "end" : "layer";
    out["reduce_bucket_size"] = config.zero_optimization.reduce_bucket_size;
    out["adopt_memory"] = options.training.adopt_memory;
    if (const zeroshard::ActivationCheckpointer* checkpointer = model.checkpointer()) {
      out["checkpointing"]["recompute_seconds"] = checkpointer->profile().recompute_seconds;
    }
    examples::write_report_json(common.report_json, std::move(out), memory);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zeroshard::examples::run_trainer(argc, argv, kProgram, kUsage, parse_options, train);
}
