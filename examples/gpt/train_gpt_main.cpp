// zeroshard-train-gpt: trains the example GPT on byte-level text (by default the licence texts
// of Debian's base-files) with the ZeRO stage a DeepSpeed-style config picks, printing the loss,
// tokens per second and validation loss as it goes, and per-rank memory at the end.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gpt_model.h"
#include "report_json.h"
#include "run_guard.h"
#include "text_data.h"
#include "trainer_options.h"
#include "trainer_setup.h"
#include "training_checkpoints.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Communicator;
using zeroshard::examples::GptModel;
using zeroshard::examples::GptShape;
using zeroshard::examples::GptTraining;
using zeroshard::examples::TextCorpus;

constexpr const char* kProgram = "zeroshard-train-gpt";
constexpr const char* kDescription =
    "Trains the example GPT on byte-level text with the ZeRO stage the config (or --stage) "
    "picks. Run under mpirun for several ranks, e.g.\n"
    "  mpirun -np 4 zeroshard-train-gpt --config examples/configs/zero3.json";

struct Options {
  Options() { common.steps = 150; }  // --steps is optional here

  zeroshard::examples::TrainerOptions common;
  GptShape shape{.vocab = 0, .layers = 4, .channels = 128, .heads = 4, .seq = 64};
  int batch = 0;  ///< 0: as the config says
  GptTraining training;
  std::uint64_t seed = 1;
  double lr = 0.0;  ///< 0: as the config says
  int eval_every = 25;
  int eval_batches = 2;
  std::vector<std::string> data;
  double peak_tflops = 0.0;
};

void add_flags(CLI::App& app, Options& options) {
  using zeroshard::cli::add_integer;
  using zeroshard::cli::positive_number;
  zeroshard::examples::add_trainer_flags(app, options.common, /*steps_required=*/false);
  add_integer(app, "--layers", options.shape.layers, "transformer blocks")->capture_default_str();
  add_integer(app, "--d-model", options.shape.channels, "channels of the residual stream")
      ->type_name("C")
      ->capture_default_str();
  add_integer(app, "--heads", options.shape.heads, "attention heads; must divide C")
      ->capture_default_str();
  add_integer(app, "--seq-len", options.shape.seq, "context length in bytes")
      ->capture_default_str();
  add_integer(app, "--batch", options.batch,
              "sequences per rank per micro-step; overrides the config's "
              "train_micro_batch_size_per_gpu")
      ->type_name("B");
  add_integer(app, "--seed", options.seed, "seed of the weights and of the training windows", 0)
      ->capture_default_str();
  app.add_option("--lr", options.lr, "learning rate; overrides the config's optimizer.params.lr")
      ->type_name("LR")
      ->check(positive_number());
  add_integer(app, "--eval-every", options.eval_every,
              "validation loss every K steps and at the end")
      ->type_name("K")
      ->capture_default_str();
  add_integer(app, "--eval-batches", options.eval_batches, "validation micro-batches per rank")
      ->capture_default_str();
  app.add_option("--data", options.data,
                 "a text file to train on (repeatable); default: the regular files in "
                 "/usr/share/common-licenses")
      ->type_name("FILE")
      ->allow_extra_args(false);
  app.add_option("--peak-tflops", options.peak_tflops,
                 "the device's peak TFLOP/s: the progress line adds the model FLOPs utilisation "
                 "(achieved / peak)")
      ->type_name("F")
      ->check(positive_number());
  app.callback([&options] {
    if (options.shape.channels % options.shape.heads != 0) {
      throw CLI::ValidationError("--heads " + std::to_string(options.shape.heads) +
                                 " does not divide --d-model " +
                                 std::to_string(options.shape.channels));
    }
    options.training.checkpoint_every = options.common.checkpoint_every;
  });
}

// The sum over ranks, added in rank order on every rank, so every world size and stage that
// computes the same per-rank values gets the same bits.
double sum_over_ranks(Communicator& communicator, double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  double sum = 0.0;
  for (const std::string& part : communicator.all_gather_text(text)) sum += std::stod(part);
  return sum;
}

// The mean validation loss per token over eval_batches x micro_batch x world windows, spread
// evenly over the validation text; each rank takes every world-th micro-batch of them.
double validation_loss(GptModel& model, const TextCorpus& corpus, Communicator& communicator,
                       int eval_batches, int micro_batch) {
  const int rank = communicator.rank();
  const int world = communicator.size();
  const int seq = model.shape().seq;
  const std::int64_t count = static_cast<std::int64_t>(eval_batches) * micro_batch * world;
  std::vector<int> tokens(static_cast<std::size_t>(micro_batch) * seq);
  std::vector<int> targets(tokens.size());
  double sum = 0.0;
  for (int b = 0; b < eval_batches; ++b) {
    for (int s = 0; s < micro_batch; ++s) {
      const std::int64_t index = (static_cast<std::int64_t>(b) * world + rank) * micro_batch + s;
      corpus.validation_window(index, count, tokens.data() + static_cast<std::size_t>(s) * seq,
                               targets.data() + static_cast<std::size_t>(s) * seq);
    }
    sum += model.evaluate(tokens.data(), targets.data(), micro_batch);
  }
  return sum_over_ranks(communicator, sum) / (static_cast<double>(eval_batches) * world);
}

// `communicator` carries the program's own collectives (loss, reports), apart from the engine's,
// so they can never interleave with the engine's outstanding transfers.
int train(const Options& options, Communicator& communicator,
          zeroshard::examples::RunProgress& progress) {
  namespace examples = zeroshard::examples;
  const examples::TrainerOptions& common = options.common;
  const int rank = communicator.rank();
  const int world = communicator.size();

  zeroshard::Config config = examples::load_trainer_config(common, world);
  if (options.lr > 0.0) config.optimizer.params["lr"] = options.lr;
  if (options.batch > 0) {
    config.train_micro_batch_size_per_gpu = options.batch;
    config.train_batch_size =
        static_cast<std::int64_t>(options.batch) * config.gradient_accumulation_steps * world;
  }
  examples::print_config_notices(config, rank);
  const int micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int accumulation = static_cast<int>(config.gradient_accumulation_steps);

  const std::vector<std::string> files =
      options.data.empty() ? examples::default_text_files() : options.data;
  const TextCorpus corpus(files, options.shape.seq);
  GptShape shape = options.shape;
  shape.vocab = corpus.vocab();

  const zeroshard::Device device = examples::choose_device(common.device);
  progress.in_lockstep = false;
  zeroshard::Engine engine(config, device, Communicator::from_environment(device));
  GptModel model(engine, shape, micro_batch, options.training);
  model.initialize(options.seed);
  examples::TrainingCheckpoints checkpoints(engine, common, kProgram, rank);
  const int first_step = checkpoints.resume();
  const examples::Checksum initial = examples::checksum(engine);
  const std::int64_t tokens_per_step =
      static_cast<std::int64_t>(micro_batch) * accumulation * world * shape.seq;
  if (rank == 0) {
    std::printf(
        "zeroshard-train-gpt: stage %d, %d rank(s) on %s (%s), %s, %s, GPT %d layers x %d "
        "channels x %d heads, context %d, vocabulary %d, %lld parameters, global batch %d x %d x "
        "%d sequences = %lld tokens, checkpoint every %d blocks\n"
        "text: %zu file(s), %lld training and %lld validation tokens; unigram entropy %.4f nats "
        "(%.4f bits) per byte\n",
        engine.stage(), world, device.to_string().c_str(), engine.communicator().backend().c_str(),
        to_string(engine.model_dtype()), engine.update_rule().name().c_str(), shape.layers,
        shape.channels, shape.heads, shape.seq, shape.vocab,
        static_cast<long long>(model.parameter_count()), micro_batch, accumulation, world,
        static_cast<long long>(tokens_per_step), options.training.checkpoint_every, files.size(),
        static_cast<long long>(corpus.train_tokens()),
        static_cast<long long>(corpus.validation_tokens()), corpus.unigram_entropy(),
        corpus.unigram_entropy() / std::log(2.0));
    std::fflush(stdout);
  }

  const std::size_t window = static_cast<std::size_t>(shape.seq);
  std::vector<int> tokens(static_cast<std::size_t>(micro_batch) * window);
  std::vector<int> targets(tokens.size());
  std::vector<double> losses;
  nlohmann::json validation = nlohmann::json::array();
  std::vector<double> step_seconds;
  for (int step = first_step; step < common.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    double loss = 0.0;
    zeroshard::StepResult result;
    for (int micro = 0; micro < accumulation; ++micro) {
      const auto range =
          examples::data_parallel_range(step, micro, accumulation, micro_batch, rank, world);
      for (int s = 0; s < range.count; ++s) {
        corpus.train_window(options.seed, range.first + s, tokens.data() + s * window,
                            targets.data() + s * window);
      }
      loss += model.train_micro_step(tokens.data(), targets.data(), range.count);
      // The engine knows where the accumulation window ends; in between, step() only reduces.
      result = engine.step();
    }
    // Every rank's micro-batches are the same size, so the mean of the rank means is the mean
    // over the global batch.
    const double global_loss = sum_over_ranks(communicator, loss) / (accumulation * world);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    step_seconds.push_back(seconds);
    losses.push_back(global_loss);
    // What csv_monitor and tensorboard write as Train/Samples/train_loss.
    engine.log_loss(global_loss);
    const bool evaluate = (step + 1) % options.eval_every == 0 || step + 1 == common.steps;
    double validation_value = 0.0;
    if (evaluate) {
      validation_value =
          validation_loss(model, corpus, communicator, options.eval_batches, micro_batch);
      validation.push_back({{"step", step + 1}, {"loss", validation_value}});
    }
    if (rank == 0) {
      const double tokens_per_second = static_cast<double>(tokens_per_step) / seconds;
      const double tflops = tokens_per_second * model.flops_per_token() * 1e-12;
      char extra[128] = "";
      if (evaluate) std::snprintf(extra, sizeof extra, " | val loss %.4f", validation_value);
      char utilisation[64] = "";
      if (options.peak_tflops > 0.0) {
        std::snprintf(utilisation, sizeof utilisation, " | MFU %.1f%%",
                      100.0 * tflops / options.peak_tflops);
      }
      std::printf(
          "step %5d/%d | loss %.4f | lr %.3e | grad norm %.4f | %8.1f ms | %9.0f tok/s | %.3f "
          "TFLOP/s%s%s%s\n",
          step + 1, common.steps, global_loss, result.lr, result.grad_norm, seconds * 1e3,
          tokens_per_second, tflops, utilisation, extra,
          result.skipped ? " | skipped (overflow)" : "");
      std::fflush(stdout);
    }
    checkpoints.after_step(step);
  }
  checkpoints.finish();

  const examples::Checksum final_checksum = examples::checksum(engine);
  const examples::GatheredMemory memory =
      examples::gather_memory(communicator, engine.memory_report());
  if (rank != 0) return 0;

  // The first step also builds the engine's buffers and, at stage 3, records the gather order.
  std::vector<double> steady(step_seconds.begin() + (step_seconds.size() > 1 ? 1 : 0),
                             step_seconds.end());
  double steady_seconds = 0.0;
  for (double s : steady) steady_seconds += s;
  const double tokens_per_second =
      static_cast<double>(tokens_per_step) * static_cast<double>(steady.size()) / steady_seconds;
  std::printf(
      "final loss %.6f, validation loss %.6f (unigram entropy %.4f), %.0f tokens/s after the "
      "first step, parameter checksum sum %.9g abs %.9g\n",
      losses.back(), validation.back().at("loss").get<double>(), corpus.unigram_entropy(),
      tokens_per_second, final_checksum.sum, final_checksum.abs_sum);
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
    out["validation"] = validation;
    out["unigram_entropy"] = corpus.unigram_entropy();
    out["tokens_per_second"] = tokens_per_second;
    out["flops_per_token"] = model.flops_per_token();
    out["shape"] = {{"layers", shape.layers}, {"d_model", shape.channels},
                    {"heads", shape.heads},   {"seq_len", shape.seq},
                    {"vocab", shape.vocab},   {"micro_batch", micro_batch}};
    examples::write_report_json(common.report_json, std::move(out), memory);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zeroshard::examples::run_trainer(argc, argv, kProgram, kDescription, add_flags, train);
}
