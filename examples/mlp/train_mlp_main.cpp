// zeroshard-train-mlp: trains the example MLP on the synthetic task with the ZeRO stage a
// DeepSpeed-style config picks, printing loss, speed and per-rank memory as it goes.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mlp_model.h"
#include "report_json.h"
#include "run_guard.h"
#include "synthetic_data.h"
#include "trainer_options.h"
#include "trainer_setup.h"
#include "training_checkpoints.h"
#include "wire_phases.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Communicator;
using zeroshard::DType;
using zeroshard::examples::MlpModel;
using zeroshard::examples::MlpPhase;
using zeroshard::examples::MlpShape;
using zeroshard::examples::MlpTraining;
using zeroshard::examples::SyntheticClassification;

constexpr const char* kProgram = "zeroshard-train-mlp";
constexpr const char* kDescription =
    "Trains the example MLP on a synthetic classification task with the ZeRO stage the config "
    "(or --stage) picks. Run under mpirun for several ranks, e.g.\n"
    "  mpirun -np 4 zeroshard-train-mlp --config examples/configs/zero3.json --steps 30";

struct Options {
  zeroshard::examples::TrainerOptions common;
  MlpShape shape{.inputs = 64, .width = 256, .layers = 4, .classes = 10};
  MlpTraining training;
  std::uint64_t seed = 1;
  std::string init_from;
  std::string wire_interface;
};

void add_flags(CLI::App& app, Options& options) {
  using zeroshard::cli::add_integer;
  zeroshard::examples::add_trainer_flags(app, options.common, /*steps_required=*/true);
  add_integer(app, "--layers", options.shape.layers, "linear layers")->capture_default_str();
  add_integer(app, "--width", options.shape.width, "hidden width")->capture_default_str();
  add_integer(app, "--inputs", options.shape.inputs, "input features")->capture_default_str();
  add_integer(app, "--classes", options.shape.classes, "classes of the synthetic task")
      ->capture_default_str();
  add_integer(app, "--seed", options.seed, "seed of the weights and the data", 0)
      ->capture_default_str();
  app.add_option("--dropout", options.training.dropout,
                 "dropout probability after each hidden layer")
      ->type_name("P")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            float p = 0.0f;
            if (zeroshard::examples::parse_number(text, p) && p >= 0.0f && p < 1.0f) return {};
            return "got '" + text + "', expected a probability in [0, 1)";
          },
          ""))
      ->capture_default_str();
  app.add_option("--init-from", options.init_from,
                 "start from the weights of a safetensors file (zeroshard-consolidate)")
      ->type_name("FILE");
  app.add_option_function<std::string>(
         "--grad-handover",
         [&options](const std::string& handover) {
           options.training.grad_handover = handover == "end"
                                                ? zeroshard::GradHandover::kAtEnd
                                                : zeroshard::GradHandover::kPerParameter;
         },
         "layer (default): each layer hands its gradients over as its backward ends; end: all at "
         "once after the whole backward, as a model with weights stacked over layers must "
         "(GradHandover::kAtEnd)")
      ->check(CLI::IsMember({"layer", "end"}));
  app.add_option("--wire-interface", options.wire_interface,
                 "count the bytes this network interface sends in each step's forward, backward "
                 "and step(), on the first rank of each host, with a barrier at each boundary; "
                 "the report's \"wire\" section has them per step (the first step left out), "
                 "summed over hosts")
      ->type_name("IF");
  app.add_flag("--adopt-memory", options.training.adopt_memory,
               "the model allocates its parameters and gradients itself and lends them to the "
               "engine (Engine::adopt_memory)");
  app.callback([&options] { options.training.checkpoint_every = options.common.checkpoint_every; });
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
  const examples::Checksum initial = examples::checksum(engine);
  std::optional<examples::WirePhases> wire;
  if (!options.wire_interface.empty()) {
    wire.emplace(communicator, options.wire_interface);
    model.set_phase_hook([&wire](MlpPhase phase) {
      wire->end_phase(phase == MlpPhase::kForward ? examples::WirePhase::kForward
                                                  : examples::WirePhase::kBackward);
    });
  }
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
    std::chrono::steady_clock::duration stepping{};
    float loss = 0.0f;
    zeroshard::StepResult result;
    // The first step makes the connections and records stage 3's gather order: not counted.
    if (wire) wire->start_step(step > first_step || common.steps - first_step == 1);
    for (int micro = 0; micro < accumulation; ++micro) {
      const auto range =
          examples::data_parallel_range(step, micro, accumulation, micro_batch, rank, world);
      data.sample(range.first, range.count, x.data(), labels.data());
      const auto start = std::chrono::steady_clock::now();
      loss += model.train_micro_step(x.data(), labels.data(), range.count);
      const auto step_start = std::chrono::steady_clock::now();
      // The engine knows where the accumulation window ends; in between, step() only reduces.
      result = engine.step();
      const auto end = std::chrono::steady_clock::now();
      busy += end - start;
      stepping += end - step_start;
      if (wire) wire->end_phase(examples::WirePhase::kStep);
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
    // What csv_monitor and tensorboard write as Train/Samples/train_loss.
    engine.log_loss(global_loss);
    // One line per step; the engine adds its own lr / grad-norm line every steps_per_print.
    if (rank == 0) {
      std::printf(
          "step %5d/%d | loss %.6f | lr %.3e | grad norm %.4f | %8.2f ms/step (step() %.2f) | "
          "model states %.3f MiB/rank%s\n",
          step + 1, common.steps, global_loss, result.lr, result.grad_norm,
          std::chrono::duration<double, std::milli>(busy).count(),
          std::chrono::duration<double, std::milli>(stepping).count(),
          static_cast<double>(stats[1]), result.skipped ? " | skipped (overflow)" : "");
      std::fflush(stdout);
    }
    checkpoints.after_step(step);
  }
  checkpoints.finish();

  const zeroshard::MemoryReport report = engine.memory_report();
  const examples::Checksum final_checksum = examples::checksum(engine);
  const examples::GatheredMemory memory = examples::gather_memory(communicator, report);
  const nlohmann::json wire_report = wire ? wire->report() : nlohmann::json();
  if (rank != 0) return 0;

  std::printf("final loss %.6f, parameter checksum sum %.9g abs %.9g\n", losses.back(),
              final_checksum.sum, final_checksum.abs_sum);
  if (wire) {
    std::printf("wire %s: %.0f forward, %.0f backward, %.0f step() bytes per step from %d hosts\n",
                wire_report["interface"].get<std::string>().c_str(),
                wire_report["forward"].get<double>(), wire_report["backward"].get<double>(),
                wire_report["step"].get<double>(), wire_report["hosts"].get<int>());
  }
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
    if (wire) out["wire"] = wire_report;
    if (const zeroshard::ActivationCheckpointer* checkpointer = model.checkpointer()) {
      out["checkpointing"]["recompute_seconds"] = checkpointer->profile().recompute_seconds;
    }
    examples::write_report_json(common.report_json, std::move(out), memory);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zeroshard::examples::run_trainer(argc, argv, kProgram, kDescription, add_flags, train);
}
