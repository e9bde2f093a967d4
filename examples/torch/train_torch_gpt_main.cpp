// zeroshard-train-torch-gpt: trains a character-level GPT written with torch::nn on byte-level
// text (by default the licence texts of Debian's base-files) with zeroshard::torch::Optimizer at
// the ZeRO stage a DeepSpeed config picks, or with torch::optim::AdamW (--torch-optim) in the
// same loop; prints the loss and time of each step, then the final loss beside the baseline.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "run_guard.h"  // zeroshard::examples::run_trainer
#include "text_data.h"  // zeroshard::examples::TextCorpus, default_text_files
#include "torch_gpt_batches.h"
#include "torch_gpt_flags.h"
#include "torch_gpt_model.h"
#include "torch_gpt_trainers.h"
#include "trainer_setup.h"  // zeroshard::examples::choose_device
#include "zeroshard/torch.h"

namespace {

using torch_gpt::Gpt;
using torch_gpt::GptShape;
using torch_gpt::RankBatches;
using zeroshard::Communicator;

constexpr const char* kProgram = "zeroshard-train-torch-gpt";
constexpr const char* kDescription =
    "Trains a character-level GPT built from torch::nn layers with zeroshard::torch::Optimizer "
    "at the ZeRO stage the config picks (or, with --torch-optim, torch::optim::AdamW). Run under "
    "mpirun for several ranks, e.g.\n"
    "  mpirun -np 2 zeroshard-train-torch-gpt --config examples/configs/zero3.json";

struct Options {
  std::string config_path;
  int steps = 60;
  bool torch_optim = false;
  bool require_below_baseline = false;
  GptShape shape;
  int batch = 0;    ///< 0: the config's train_micro_batch_size_per_gpu
  double lr = 0.0;  ///< 0: the config's optimizer.params.lr
  std::uint64_t seed = 1;
  std::string device = "cpu";
  int final_steps = 5;
  std::vector<std::string> data;
};

void add_flags(CLI::App& app, Options& options) {
  using zeroshard::cli::add_integer;
  app.add_option("--config", options.config_path, "DeepSpeed-style JSON config")
      ->required()
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  add_integer(app, "--steps", options.steps, "optimizer steps")->capture_default_str();
  app.add_flag("--torch-optim", options.torch_optim,
               "train with torch::optim::AdamW (the config's lr, betas, eps, weight decay and "
               "clipping; gradients averaged over the ranks) instead of zeroshard");
  app.add_flag("--require-below-baseline", options.require_below_baseline,
               "exit with status 1 unless the final loss is below the unigram entropy");
  torch_gpt::add_shape_flags(app, options.shape);
  add_integer(app, "--batch", options.batch,
              "sequences per rank per micro-step; overrides the config's "
              "train_micro_batch_size_per_gpu");
  app.add_option("--lr", options.lr, "learning rate; overrides the config's optimizer.params.lr")
      ->check(zeroshard::cli::positive_number());
  add_integer(app, "--seed", options.seed, "seed of the weights and of the training windows", 0)
      ->capture_default_str();
  app.add_option("--device", options.device,
                 "where the model trains; cuda takes the GPU the local rank picks (see "
                 "ZEROSHARD_DEVICE) and needs a libtorch with CUDA (the PyPI torch wheel's)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  add_integer(app, "--final-steps", options.final_steps,
              "the final loss is the mean over this many last steps")
      ->capture_default_str();
  app.add_option("--data", options.data,
                 "a text file to train on (repeatable); default: the regular files in "
                 "/usr/share/common-licenses")
      ->type_name("FILE")
      ->allow_extra_args(false);
  app.callback([&options] {
    if (options.shape.width % options.shape.heads != 0) {
      throw CLI::ValidationError("--heads " + std::to_string(options.shape.heads) +
                                 " does not divide --width " + std::to_string(options.shape.width));
    }
  });
}

// The mean over ranks of a value each rank computed on its own micro-batches.
double mean_over_ranks(Communicator& communicator, double value) {
  communicator.all_reduce(std::span<double>(&value, 1));
  return value / communicator.size();
}

struct Curve {
  std::vector<double> losses;   ///< per step, averaged over the ranks
  std::vector<double> seconds;  ///< per step, rank 0's wall time
};

// The training loop, written once for both trainers (torch_gpt_trainers.h).
template <class Trainer>
Curve train_loop(Trainer& trainer, Gpt& model, RankBatches& batches, torch::Device device,
                 int steps, int accumulation, Communicator& communicator) {
  Curve curve;
  for (int step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    trainer.zero_grad();
    double loss = 0.0;
    for (int micro = 0; micro < accumulation; ++micro) {
      const torch_gpt::Batch batch = batches.next();
      const torch::Tensor micro_loss =
          model->loss(batch.tokens.to(device), batch.targets.to(device));
      trainer.backward(micro_loss);
      trainer.step();
      loss += micro_loss.item<double>() / accumulation;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    curve.losses.push_back(mean_over_ranks(communicator, loss));
    curve.seconds.push_back(seconds);
    if (communicator.rank() == 0) {
      std::printf("step %4d/%d | loss %.4f | %8.1f ms\n", step + 1, steps, curve.losses.back(),
                  seconds * 1e3);
      std::fflush(stdout);
    }
  }
  return curve;
}

int train(const Options& options, Communicator& communicator,
          zeroshard::examples::RunProgress& progress) {
  const int rank = communicator.rank();
  const int world = communicator.size();
  zeroshard::Config config = zeroshard::Config::from_json_file(options.config_path, world);
  if (options.lr > 0.0) config.optimizer.params["lr"] = options.lr;
  if (options.batch > 0) {
    config.train_micro_batch_size_per_gpu = options.batch;
    config.train_batch_size =
        static_cast<std::int64_t>(options.batch) * config.gradient_accumulation_steps * world;
  }
  const zeroshard::Device device = zeroshard::examples::choose_device(options.device);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    throw zeroshard::UsageError(
        "--device cuda: this libtorch has no usable GPU (Debian's libtorch is built for the CPU "
        "only); build the example against a CUDA libtorch, such as the PyPI torch wheel's");
  }
  const torch::Device torch_device =
      device.is_cuda() ? torch::Device(torch::kCUDA, static_cast<torch::DeviceIndex>(device.index))
                       : torch::Device(torch::kCPU);
  const int micro_batch = static_cast<int>(config.train_micro_batch_size_per_gpu);
  const int accumulation = static_cast<int>(config.gradient_accumulation_steps);

  const std::vector<std::string> files =
      options.data.empty() ? zeroshard::examples::default_text_files() : options.data;
  const zeroshard::examples::TextCorpus corpus(files, static_cast<int>(options.shape.seq));
  GptShape shape = options.shape;
  shape.vocab = corpus.vocab();
  Gpt model = torch_gpt::make_gpt(shape, options.seed);
  model->to(torch_device);
  const std::int64_t parameters = model->parameter_count();
  RankBatches batches(corpus, static_cast<int>(shape.seq), micro_batch, rank, world, options.seed);
  if (rank == 0) {
    std::printf(
        "%s: %s on %s, %d rank(s), GPT %lld layers x %lld wide x %lld heads, context %lld, "
        "vocabulary "
        "%lld, %lld parameters, %d x %d x %d sequences per step\n",
        kProgram,
        options.torch_optim
            ? "torch::optim::AdamW"
            : ("zeroshard stage " + std::to_string(config.zero_optimization.stage)).c_str(),
        device.to_string().c_str(), world, static_cast<long long>(shape.layers),
        static_cast<long long>(shape.width), static_cast<long long>(shape.heads),
        static_cast<long long>(shape.seq), static_cast<long long>(shape.vocab),
        static_cast<long long>(parameters), micro_batch, accumulation, world);
    std::fflush(stdout);
  }

  // Building a trainer fails on every rank alike (a key of the config it refuses, say), so it is
  // reported once; from the first step an error may strike one rank alone, and then it ends the
  // job rather than leave the others waiting in a collective.
  const auto run = [&](auto& trainer) {
    progress.in_lockstep = false;
    return train_loop(trainer, model, batches, torch_device, options.steps, accumulation,
                      communicator);
  };
  Curve curve;
  std::string memory_table;
  if (options.torch_optim) {
    torch_gpt::TorchTrainer trainer(*model, config, communicator);
    curve = run(trainer);
  } else {
    torch_gpt::ZeroshardTrainer trainer(*model, config);
    curve = run(trainer);
    memory_table = trainer.optimizer().engine().memory_report().to_table();
  }
  if (rank != 0) return 0;

  const std::size_t last =
      std::min<std::size_t>(static_cast<std::size_t>(options.final_steps), curve.losses.size());
  double final_loss = 0.0;
  for (std::size_t i = curve.losses.size() - last; i < curve.losses.size(); ++i) {
    final_loss += curve.losses[i] / static_cast<double>(last);
  }
  // The first step also builds buffers and, at stage 3, records the gather order.
  std::vector<double> steady(curve.seconds.begin() + (curve.seconds.size() > 1 ? 1 : 0),
                             curve.seconds.end());
  std::sort(steady.begin(), steady.end());
  const double median_ms = steady.empty() ? 0.0 : steady[steady.size() / 2] * 1e3;
  const double baseline = corpus.unigram_entropy();
  std::printf(
      "baseline (unigram entropy): %.4f nats/byte\n"
      "final loss (mean of the last %zu steps): %.4f\n"
      "median step after the first: %.1f ms\n",
      baseline, last, final_loss, median_ms);
  if (!memory_table.empty()) std::printf("rank 0 memory:\n%s", memory_table.c_str());
  std::fflush(stdout);
  if (options.require_below_baseline && !(final_loss < baseline)) {
    std::fprintf(stderr,
                 "%s: final loss %.4f is not below the baseline %.4f (the unigram entropy, what a "
                 "model that ignores context reaches): the model did not learn from context\n",
                 kProgram, final_loss, baseline);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return zeroshard::examples::run_trainer(argc, argv, kProgram, kDescription, add_flags, train);
}
