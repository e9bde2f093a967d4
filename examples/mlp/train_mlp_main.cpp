// zeroshard-train-mlp: trains the example MLP on the synthetic task with the ZeRO stage a
// DeepSpeed-style config picks, printing loss, speed and per-rank memory as it goes.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mlp_model.h"
#include "synthetic_data.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Communicator;
using zeroshard::DType;
using zeroshard::examples::MlpModel;
using zeroshard::examples::MlpShape;
using zeroshard::examples::MlpTraining;
using zeroshard::examples::SyntheticClassification;

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
  std::string config_path;
  int steps = 0;
  MlpShape shape{.inputs = 64, .width = 256, .layers = 4, .classes = 10};
  MlpTraining training;
  std::uint64_t seed = 1;
  std::string report_json;
  std::string precision;  ///< empty: as the config says
  std::string device = "auto";
  std::string save_dir;
  int save_every = 0;  ///< 0: only at the end
  std::string resume_dir;
  std::string init_from;
};

template <typename T>
bool parse_number(std::string_view text, T& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

// Returns the problem with the command line, or nothing when it is usable.
std::optional<std::string> parse_options(int argc, char** argv, Options& options) {
  bool has_steps = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--adopt-memory") {
      options.training.adopt_memory = true;
      continue;
    }
    if (i + 1 >= argc) return "missing value after " + std::string(flag);
    const std::string_view value = argv[++i];
    auto positive = [&](int& target) -> std::optional<std::string> {
      if (!parse_number(value, target) || target <= 0) {
        return std::string(flag) + ": expected a positive integer, got '" + std::string(value) +
               "'";
      }
      return std::nullopt;
    };
    std::optional<std::string> problem;
    if (flag == "--config") {
      options.config_path = value;
    } else if (flag == "--steps") {
      problem = positive(options.steps);
      has_steps = true;
    } else if (flag == "--layers") {
      problem = positive(options.shape.layers);
    } else if (flag == "--width") {
      problem = positive(options.shape.width);
    } else if (flag == "--inputs") {
      problem = positive(options.shape.inputs);
    } else if (flag == "--classes") {
      problem = positive(options.shape.classes);
    } else if (flag == "--seed") {
      if (!parse_number(value, options.seed)) {
        problem = "--seed: expected a non-negative integer, got '" + std::string(value) + "'";
      }
    } else if (flag == "--precision") {
      if (value != "fp32" && value != "fp16" && value != "bf16") {
        problem = "--precision: expected fp32, fp16 or bf16, got '" + std::string(value) + "'";
      }
      options.precision = value;
    } else if (flag == "--device") {
      if (value != "cpu" && value != "cuda" && value != "auto") {
        problem = "--device: expected cpu, cuda or auto, got '" + std::string(value) + "'";
      }
      options.device = value;
    } else if (flag == "--checkpoint-every") {
      if (!parse_number(value, options.training.checkpoint_every) ||
          options.training.checkpoint_every < 0) {
        problem =
            "--checkpoint-every: expected a non-negative integer, got '" + std::string(value) + "'";
      }
    } else if (flag == "--dropout") {
      float& p = options.training.dropout;
      if (!parse_number(value, p) || !(p >= 0.0f && p < 1.0f)) {
        problem = "--dropout: expected a probability in [0, 1), got '" + std::string(value) + "'";
      }
    } else if (flag == "--report-json") {
      options.report_json = value;
    } else if (flag == "--save-dir") {
      options.save_dir = value;
    } else if (flag == "--save-every") {
      problem = positive(options.save_every);
    } else if (flag == "--resume") {
      options.resume_dir = value;
    } else if (flag == "--init-from") {
      options.init_from = value;
    } else if (flag == "--grad-handover") {
      if (value != "layer" && value != "end") {
        problem = "--grad-handover: expected layer or end, got '" + std::string(value) + "'";
      }
      options.training.grad_handover =
          value == "end" ? zeroshard::GradHandover::kAtEnd : zeroshard::GradHandover::kPerParameter;
    } else {
      return "unknown flag " + std::string(flag);
    }
    if (problem) return problem;
  }
  if (options.config_path.empty()) return "--config is required";
  if (!has_steps) return "--steps is required";
  if (options.save_every > 0 && options.save_dir.empty()) return "--save-every needs --save-dir";
  return std::nullopt;
}

// The device --device names; `cuda` without a usable GPU is an error that says why.
zeroshard::Device choose_device(const std::string& choice) {
  if (choice == "cpu") return zeroshard::Device::cpu();
  if (choice == "auto") return zeroshard::Device::from_environment();
  if (!zeroshard::cuda_available()) {
    throw zeroshard::UsageError("--device cuda: " + zeroshard::cuda_unavailable_reason());
  }
  const zeroshard::Device device = zeroshard::Device::from_environment();
  if (!device.is_cuda()) {
    throw zeroshard::UsageError("--device cuda, but ZEROSHARD_DEVICE asks for the CPU");
  }
  return device;
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// The data position a checkpoint keeps in its user section: the next step's index (the batches
// of step s are a function of s alone, see data_parallel_range).
std::string data_position(int next_step) { return "next_step=" + std::to_string(next_step); }

int parse_data_position(const std::string& text, const std::string& where) {
  const std::string key = "next_step=";
  int step = -1;
  if (!text.starts_with(key) || !parse_number(std::string_view(text).substr(key.size()), step) ||
      step < 0) {
    throw zeroshard::UsageError("--resume " + where + ": the checkpoint's user section is '" +
                                text + "', not a data position of zeroshard-train-mlp");
  }
  return step;
}

struct Checksum {
  double sum = 0.0;
  double abs_sum = 0.0;
};

Checksum checksum(const std::vector<float>& parameters) {
  Checksum c;
  for (float p : parameters) {
    c.sum += p;
    c.abs_sum += std::fabs(p);
  }
  return c;
}

// What the error handler needs to know about how far the run got.
struct Progress {
  /// The program's own communicator; null until it exists.
  Communicator* communicator = nullptr;
  /// Until the engine exists every rank does the same thing (read the same config file), so an
  /// error so far happened on every rank alike.
  bool in_lockstep = true;
};

// `communicator` carries the program's own collectives (loss, reports), apart from the engine's,
// so they can never interleave with the engine's outstanding transfers.
int train(const Options& options, Communicator* communicator, Progress& progress) {
  const int rank = communicator->rank();
  const int world = communicator->size();

  zeroshard::Config config = zeroshard::Config::from_json_file(options.config_path, world);
  if (!options.precision.empty()) {
    config.fp16.enabled = options.precision == "fp16";
    config.bf16.enabled = options.precision == "bf16";
  }
  if (rank == 0) {
    for (const std::string& notice : config.notices()) std::printf("note: %s\n", notice.c_str());
  }
  const int micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int accumulation = static_cast<int>(config.gradient_accumulation_steps);

  const zeroshard::Device device = choose_device(options.device);
  progress.in_lockstep = false;
  zeroshard::Engine engine(config, device, Communicator::from_environment(device));
  MlpModel model(engine, options.shape, micro_batch, options.training);
  model.initialize(options.seed);
  const SyntheticClassification data(options.shape.inputs, options.shape.classes, options.seed);
  if (!options.init_from.empty()) engine.load_weights(options.init_from);
  int first_step = 0;
  if (!options.resume_dir.empty()) {
    const zeroshard::CheckpointInfo info = engine.load_checkpoint(options.resume_dir);
    first_step = parse_data_position(info.user_state, options.resume_dir + "/" + info.tag);
    if (first_step >= options.steps) {
      throw zeroshard::UsageError("--steps " + std::to_string(options.steps) +
                                  " is the total, and checkpoint " + options.resume_dir + "/" +
                                  info.tag + " is already at step " + std::to_string(first_step));
    }
    if (rank == 0) {
      std::printf("resumed from %s/%s at step %d\n", options.resume_dir.c_str(), info.tag.c_str(),
                  first_step);
    }
  }
  const Checksum initial = checksum(engine.consolidated_parameters());
  // The report's peaks cover the training steps, not the set-up and the checksums' gathers.
  engine.reset_memory_peaks();
  int last_saved = -1;
  const auto save = [&](int next_step) {
    engine.save_checkpoint(options.save_dir, "step" + std::to_string(next_step),
                           data_position(next_step));
    last_saved = next_step;
    if (rank == 0) std::printf("saved %s/step%d\n", options.save_dir.c_str(), next_step);
  };

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
  for (int step = first_step; step < options.steps; ++step) {
    std::chrono::steady_clock::duration busy{};
    float loss = 0.0f;
    zeroshard::StepResult result;
    for (int micro = 0; micro < accumulation; ++micro) {
      const auto range = zeroshard::examples::data_parallel_range(step, micro, accumulation,
                                                                  micro_batch, rank, world);
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
    communicator->all_reduce(&stats[0], 1, DType::kFloat32, zeroshard::ReduceOp::kSum);
    communicator->all_reduce(&stats[1], 1, DType::kFloat32, zeroshard::ReduceOp::kMax);
    const double global_loss = static_cast<double>(stats[0]) / world;
    losses.push_back(global_loss);
    // One line per step; the engine adds its own lr / grad-norm line every steps_per_print.
    if (rank == 0) {
      std::printf(
          "step %5d/%d | loss %.6f | lr %.3e | grad norm %.4f | %8.2f ms/step | model states "
          "%.3f MiB/rank%s\n",
          step + 1, options.steps, global_loss, result.lr, result.grad_norm,
          std::chrono::duration<double, std::milli>(busy).count(), static_cast<double>(stats[1]),
          result.skipped ? " | skipped (overflow)" : "");
      std::fflush(stdout);
    }
    if (options.save_every > 0 && (step + 1) % options.save_every == 0) save(step + 1);
  }
  if (!options.save_dir.empty() && last_saved != options.steps) save(options.steps);

  const zeroshard::MemoryReport report = engine.memory_report();
  const Checksum final_checksum = checksum(engine.consolidated_parameters());
  const double sum = final_checksum.sum;
  const double abs_sum = final_checksum.abs_sum;
  const std::vector<std::string> tables = communicator->all_gather_text(report.to_table());
  const std::vector<std::string> reports = communicator->all_gather_text(report.to_json());
  if (rank != 0) return 0;

  std::printf("final loss %.6f, parameter checksum sum %.9g abs %.9g\n", losses.back(), sum,
              abs_sum);
  for (const std::string& table : tables) std::printf("%s", table.c_str());
  std::fflush(stdout);
  if (!options.report_json.empty()) {
    nlohmann::json out;
    out["final_loss"] = losses.back();
    out["losses"] = losses;
    out["param_checksum"] = {{"sum", sum}, {"abs_sum", abs_sum}};
    out["initial_param_checksum"] = {{"sum", initial.sum}, {"abs_sum", initial.abs_sum}};
    out["first_step"] = first_step;
    out["stage"] = engine.stage();
    out["precision"] = to_string(engine.model_dtype());
    out["world_size"] = world;
    out["device"] = device.to_string();
    out["parameters"] = model.parameter_count();
    out["padded_parameters"] = engine.padded_numel();
    out["checkpoint_every"] = options.training.checkpoint_every;
    out["dropout"] = options.training.dropout;
    out["grad_handover"] =
        options.training.grad_handover == zeroshard::GradHandover::kAtEnd ? "end" : "layer";
    out["reduce_bucket_size"] = config.zero_optimization.reduce_bucket_size;
    out["adopt_memory"] = options.training.adopt_memory;
    if (const zeroshard::ActivationCheckpointer* checkpointer = model.checkpointer()) {
      const zeroshard::CheckpointProfile profile = checkpointer->profile();
      out["checkpointing"] = {
          {"cpu_checkpointing", config.activation_checkpointing.cpu_checkpointing},
          {"recomputes", profile.recomputes},
          {"recompute_seconds", profile.recompute_seconds},
          {"peak_kept_device", checkpointer->memory().peak_kept_device},
          {"peak_kept_host", checkpointer->memory().peak_kept_host}};
    }
    out["memory"] = nlohmann::json::array();
    for (const std::string& text : reports) out["memory"].push_back(nlohmann::json::parse(text));
    std::ofstream file(options.report_json);
    file << out.dump(2) << '\n';
    if (!file) throw zeroshard::IoError("cannot write --report-json file " + options.report_json);
  }
  return 0;
}

// An error on one rank would leave the others waiting in their next collective for ever, so it
// ends the whole job. An error while reading the config is the same on every rank: reported
// once, and every rank simply exits.
int fail(const char* what, const Progress& progress) {
  const int rank = progress.communicator ? progress.communicator->rank() : 0;
  if (!progress.in_lockstep || rank == 0) std::fprintf(stderr, "zeroshard-train-mlp: %s\n", what);
  std::fflush(stderr);
  if (progress.in_lockstep || progress.communicator == nullptr) return 1;
  if (progress.communicator->size() > 1) progress.communicator->abort(1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (const std::optional<std::string> problem = parse_options(argc, argv, options)) {
    std::fprintf(stderr, "zeroshard-train-mlp: %s\n%s", problem->c_str(), kUsage);
    return 2;
  }
  Progress progress;
  // Owned here so that it outlives train() when an error unwinds it: fail() aborts through it.
  std::unique_ptr<Communicator> communicator;
  try {
    communicator = Communicator::from_environment();
    progress.communicator = communicator.get();
    return train(options, communicator.get(), progress);
  } catch (const std::exception& error) {
    return fail(error.what(), progress);
  }
}
