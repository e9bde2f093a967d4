// Activation checkpointing over a chain of fully connected layers: gradients are bit-identical to
// those without it (with dropout, at every stage, with each storage option), and the activation
// bytes follow L/k kept inputs plus k layers' activations, as the estimator predicts.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mpi/toy_model.h"
#include "zeroshard/activation_checkpointing.h"

namespace zeroshard::testing {
namespace {

constexpr int kWidth = 16;
constexpr int kBatch = 4;
constexpr std::size_t kActivationBytes = kBatch * kWidth * sizeof(float);

struct ChainOptions {
  int stage = 0;
  int layers = 4;
  int every = 0;  ///< layers per checkpointed block; 0 = no checkpointing
  float dropout = 0.0f;
  bool cpu_checkpointing = false;
  bool contiguous = false;
  bool partition = false;
  int steps = 2;
};

struct ChainResult {
  std::vector<std::vector<float>> grads;  ///< every weight and bias gradient computed, in order
  std::vector<float> parameters;          ///< after the last step
  std::int64_t activation_peak = 0;       ///< the memory report's activations peak
  CheckpointMemory checkpoint_memory;
  std::int64_t gathered_elements = 0;  ///< all-gather elements over the run (stage 3)
};

/// y = dropout(relu(W x + b)) per layer, on host memory (the CPU engine's), with a linear loss.
class Chain {
 public:
  Chain(Engine& engine, const ChainOptions& options) : engine_(engine), options_(options) {
    for (int i = 0; i < options.layers; ++i) {
      const std::string name = "l" + std::to_string(i);
      weights_.push_back(engine.register_parameter(name + ".weight", {kWidth, kWidth}));
      biases_.push_back(engine.register_parameter(name + ".bias", {kWidth}));
      modules_.push_back(engine.module(name));
    }
    engine.finalize();
    for (int i = 0; i < options.layers; ++i) {
      std::vector<float> w(kWidth * kWidth);
      std::vector<float> b(kWidth);
      for (std::size_t j = 0; j < w.size(); ++j) w[j] = initial_value(i, j) * 0.5f;
      for (std::size_t j = 0; j < b.size(); ++j) b[j] = initial_value(i + 7, j) * 0.1f;
      auto gathered = engine.gathered(modules_[i]);
      weights_[i].copy_from(w);
      biases_[i].copy_from(b);
    }
  }

  /// out = dropout(relu(W in + b)), drawing the mask from the generator.
  void forward_layer(int i, const float* in, float* out) {
    auto gathered = engine_.gathered(modules_[i]);
    const float* w = weights_[i].data();
    const float* b = biases_[i].data();
    const float scale = 1.0f / (1.0f - options_.dropout);
    for (int s = 0; s < kBatch; ++s) {
      for (int o = 0; o < kWidth; ++o) {
        float z = b[o];
        for (int j = 0; j < kWidth; ++j) z += w[o * kWidth + j] * in[s * kWidth + j];
        float y = z > 0.0f ? z : 0.0f;
        if (options_.dropout > 0.0f) {
          const float u = static_cast<float>(generator_() >> 8) * 0x1p-24f;
          y = u < options_.dropout ? 0.0f : y * scale;
        }
        out[s * kWidth + o] = y;
      }
    }
  }

  /// Adds layer i's gradients and turns `grad` (d loss / d out) into d loss / d in.
  void backward_layer(int i, const float* in, const float* out, std::vector<float>& grad,
                      ChainResult& result) {
    auto gathered = engine_.gathered(modules_[i]);
    const float scale = 1.0f / (1.0f - options_.dropout);
    // out > 0 exactly where relu passed and dropout kept: the mask needs no storage.
    for (std::size_t k = 0; k < grad.size(); ++k) grad[k] = out[k] > 0.0f ? grad[k] * scale : 0.0f;
    std::vector<float> dw(kWidth * kWidth, 0.0f);
    std::vector<float> db(kWidth, 0.0f);
    std::vector<float> din(kBatch * kWidth, 0.0f);
    const float* w = weights_[i].data();
    for (int s = 0; s < kBatch; ++s) {
      for (int o = 0; o < kWidth; ++o) {
        const float g = grad[s * kWidth + o];
        db[o] += g;
        for (int j = 0; j < kWidth; ++j) {
          dw[o * kWidth + j] += g * in[s * kWidth + j];
          din[s * kWidth + j] += g * w[o * kWidth + j];
        }
      }
    }
    float* wg = weights_[i].grad();
    for (std::size_t k = 0; k < dw.size(); ++k) wg[k] += dw[k];
    engine_.grad_ready(weights_[i]);
    float* bg = biases_[i].grad();
    for (std::size_t k = 0; k < db.size(); ++k) bg[k] += db[k];
    engine_.grad_ready(biases_[i]);
    result.grads.push_back(std::move(dw));
    result.grads.push_back(std::move(db));
    grad = std::move(din);
  }

  /// One micro-step; `checkpointer` is null without checkpointing.
  void train_step(ActivationCheckpointer* checkpointer, int step, ChainResult& result) {
    ActivationBuffer input = engine_.allocate_activations(kActivationBytes);
    // Model-parallel ranks see the same samples; data-parallel ranks see their own.
    const int sample_rank = options_.partition ? 0 : engine_.rank();
    for (int k = 0; k < kBatch * kWidth; ++k) {
      input.data()[k] = initial_value(sample_rank + 3 * step, k);
    }
    std::vector<float> grad(kBatch * kWidth);
    for (int k = 0; k < kBatch * kWidth; ++k) grad[k] = initial_value(11, k) * 0.25f;
    const int layers = options_.layers;
    if (checkpointer == nullptr) {
      std::vector<ActivationBuffer> acts;
      acts.push_back(std::move(input));
      for (int i = 0; i < layers; ++i) {
        acts.push_back(engine_.allocate_activations(kActivationBytes));
        forward_layer(i, acts[i].data(), acts[i + 1].data());
      }
      for (int i = layers - 1; i >= 0; --i) {
        backward_layer(i, acts[i].data(), acts[i + 1].data(), grad, result);
        acts.pop_back();
      }
      return;
    }
    const int every = options_.every;
    for (int first = 0; first < layers; first += every) {
      const int last = std::min(first + every, layers);
      input = checkpointer->checkpoint(std::move(input), [this, first, last](BlockContext& ctx) {
        const float* in = ctx.input().data();
        for (int i = first; i < last; ++i) {
          float* out = ctx.allocate(kActivationBytes);
          forward_layer(i, in, out);
          in = out;
        }
      });
    }
    input = ActivationBuffer();  // the loss is linear: its gradient needs no output
    const int blocks = (layers + every - 1) / every;
    for (int block = blocks - 1; block >= 0; --block) {
      const int first = block * every;
      const int last = std::min(first + every, layers);
      checkpointer->backward([&, first, last](BlockContext& ctx) {
        for (int i = last - 1; i >= first; --i) {
          const float* in = i == first ? ctx.input().data() : ctx.activation(i - first - 1);
          backward_layer(i, in, ctx.activation(i - first), grad, result);
        }
      });
    }
  }

  std::mt19937& generator() { return generator_; }

 private:
  Engine& engine_;
  ChainOptions options_;
  std::vector<Parameter> weights_;
  std::vector<Parameter> biases_;
  std::vector<ModuleId> modules_;
  std::mt19937 generator_{1234};
};

Config chain_config(const ChainOptions& options) {
  Config config = toy_config(options.stage);
  config.zero_optimization.param_persistence_threshold = 0;
  config.zero_optimization.max_reuse_distance = 0;
  config.activation_checkpointing.cpu_checkpointing = options.cpu_checkpointing;
  config.activation_checkpointing.partition_activations = options.partition;
  if (options.contiguous) {
    config.activation_checkpointing.contiguous_memory_optimization = true;
    config.activation_checkpointing.number_checkpoints =
        (options.layers + options.every - 1) / options.every;
  }
  return config;
}

ChainResult run_chain(const ChainOptions& options, Communicator* model_parallel = nullptr) {
  SgdOptions sgd;
  sgd.lr = 0.05;
  Engine engine = make_engine(chain_config(options), make_sgd(sgd));
  Chain chain(engine, options);
  std::unique_ptr<ActivationCheckpointer> checkpointer;
  StdRandomState<std::mt19937> random(chain.generator());
  if (options.every > 0) {
    checkpointer = std::make_unique<ActivationCheckpointer>(engine, model_parallel);
    checkpointer->register_random_state(random);
  }
  ChainResult result;
  engine.communicator().reset_traffic();
  for (int step = 0; step < options.steps; ++step) {
    chain.train_step(checkpointer.get(), step, result);
    engine.step();
  }
  result.gathered_elements =
      engine.communicator().traffic().elements[static_cast<int>(Collective::kAllGather)];
  result.parameters = engine.consolidated_parameters();
  result.activation_peak =
      engine.memory_report().at(MemoryCategory::kActivations, engine_memory(engine)).peak;
  if (checkpointer) result.checkpoint_memory = checkpointer->memory();
  return result;
}

bool skip_on_gpu() { return test_device().is_cuda(); }

void expect_same(const ChainResult& a, const ChainResult& b, const std::string& what) {
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i], b.grads[i]) << what << ": gradient " << i;
  }
  EXPECT_EQ(a.parameters, b.parameters) << what;
}

class ActivationCheckpointingStages : public ::testing::TestWithParam<int> {};

TEST_P(ActivationCheckpointingStages, GradientsAreBitIdenticalWithAndWithoutDropout) {
  if (skip_on_gpu()) GTEST_SKIP() << "the chain model computes on host memory";
  for (float dropout : {0.0f, 0.25f}) {
    ChainOptions options;
    options.stage = GetParam();
    options.layers = 5;
    options.dropout = dropout;
    const ChainResult plain = run_chain(options);
    for (int every : {1, 2, 5}) {
      options.every = every;
      options.cpu_checkpointing = false;
      expect_same(plain, run_chain(options),
                  "every " + std::to_string(every) + " dropout " + std::to_string(dropout));
      options.cpu_checkpointing = true;
      expect_same(plain, run_chain(options), "cpu_checkpointing, every " + std::to_string(every));
    }
  }
}

TEST_P(ActivationCheckpointingStages, ContiguousBufferGivesTheSameGradients) {
  if (skip_on_gpu()) GTEST_SKIP() << "the chain model computes on host memory";
  ChainOptions options;
  options.stage = GetParam();
  options.dropout = 0.25f;
  const ChainResult plain = run_chain(options);
  options.every = 2;
  options.contiguous = true;
  expect_same(plain, run_chain(options), "contiguous");
  options.cpu_checkpointing = true;
  expect_same(plain, run_chain(options), "contiguous in host memory");
}

INSTANTIATE_TEST_SUITE_P(EveryStage, ActivationCheckpointingStages, ::testing::Values(0, 1, 2, 3));

TEST(ActivationCheckpointing, StageThreeGathersEachBlockAgainForTheRecompute) {
  if (skip_on_gpu()) GTEST_SKIP() << "the chain model computes on host memory";
  ChainOptions options;
  options.stage = 3;
  options.steps = 1;
  const ChainResult plain = run_chain(options);
  options.every = 2;
  const ChainResult checkpointed = run_chain(options);
  // Forward and backward gather every layer once each without checkpointing; the recompute adds
  // one more forward's gathers (max_reuse_distance 0 keeps nothing gathered).
  EXPECT_EQ(checkpointed.gathered_elements * 2, plain.gathered_elements * 3);
}

TEST(ActivationCheckpointing, PeakFollowsKeptInputsPlusOneBlock) {
  if (skip_on_gpu()) GTEST_SKIP() << "the chain model computes on host memory";
  const auto a = static_cast<std::int64_t>(kActivationBytes);
  for (int layers : {4, 6, 8}) {
    ChainOptions options;
    options.layers = layers;
    options.steps = 1;
    const ChainResult plain = run_chain(options);
    EXPECT_EQ(plain.activation_peak, (layers + 1) * a);
    EXPECT_EQ(plain.activation_peak, estimate_activations(a, layers, 0).device);
    for (int every : {1, 2, 3, 4}) {
      options.every = every;
      options.cpu_checkpointing = false;
      const ChainResult kept = run_chain(options);
      const int blocks = (layers + every - 1) / every;
      // While block j runs, the inputs of blocks 0..j are kept and its own layers are live.
      std::int64_t expected = 0;
      for (int j = 0; j < blocks; ++j) {
        const int size = std::min(every, layers - j * every);
        expected = std::max<std::int64_t>(expected, (j + 1 + size) * a);
      }
      if (layers % every == 0) {
        EXPECT_EQ(expected, (layers / every + every) * a);
      }
      EXPECT_EQ(kept.activation_peak, expected) << "L " << layers << " k " << every;
      EXPECT_EQ(kept.activation_peak, estimate_activations(a, layers, every).device);
      EXPECT_EQ(kept.checkpoint_memory.peak_kept_device, blocks * a);
      options.cpu_checkpointing = true;
      const ChainResult offloaded = run_chain(options);
      EXPECT_EQ(offloaded.checkpoint_memory.peak_kept_device, 0);
      EXPECT_EQ(offloaded.checkpoint_memory.peak_kept_host, blocks * a);
      // On the device: the block's input and its layers' activations, and from the second block
      // on one more input with a copy in flight (the previous block's going out in forward, the
      // next one's coming back in backward).
      std::int64_t device = 0;
      for (int j = 0; j < blocks; ++j) {
        const int size = std::min(every, layers - j * every);
        device = std::max<std::int64_t>(device, ((j == 0 ? 1 : 2) + size) * a);
      }
      EXPECT_EQ(offloaded.checkpoint_memory.peak_device, device)
          << "L " << layers << " k " << every;
      const ActivationEstimate estimate = estimate_activations(a, layers, every, true);
      EXPECT_EQ(offloaded.checkpoint_memory.peak_device, estimate.device);
      // The memory report counts what was allocated: on CPU ranks kept copies and device
      // activations are both host memory, and the host keeps every input until backward ends.
      EXPECT_EQ(offloaded.activation_peak, estimate.device + estimate.host);
    }
  }
}

TEST(ActivationCheckpointing, PartitionOverTheModelParallelRanksKeepsEachRanksPartOfEachInput) {
  if (skip_on_gpu()) GTEST_SKIP() << "the chain model computes on host memory";
  // The ranks of the world act as one model-parallel group: same samples, same activations.
  std::unique_ptr<Communicator> group = Communicator::from_environment();
  if (group->size() < 2) GTEST_SKIP() << "needs a world of 2 or more ranks as the group";
  // Each rank keeps its part of every input: the fp32 elements split as evenly as they go, the
  // first ranks one more when they do not divide.
  const std::int64_t elements = kActivationBytes / sizeof(float);
  const std::int64_t ranks = group->size();
  const std::int64_t part =
      (elements / ranks + (group->rank() < elements % ranks ? 1 : 0)) * sizeof(float);
  for (int stage : {0, 3}) {
    ChainOptions options;
    options.stage = stage;
    options.layers = 6;
    options.dropout = 0.25f;
    options.partition = true;  // also: every rank sees the same samples
    // The same samples on both ranks without checkpointing.
    const ChainResult reference = [&] {
      ChainOptions same = options;
      same.every = 0;
      return run_chain(same);
    }();
    for (int every : {1, 2, 3}) {
      options.every = every;
      options.cpu_checkpointing = false;
      const ChainResult split = run_chain(options, group.get());
      expect_same(reference, split, "partitioned, every " + std::to_string(every));
      const int blocks = (options.layers + every - 1) / every;
      EXPECT_EQ(split.checkpoint_memory.peak_kept_device, blocks * part);
      options.cpu_checkpointing = true;
      const ChainResult split_host = run_chain(options, group.get());
      expect_same(reference, split_host,
                  "partitioned in host memory, every " + std::to_string(every));
      EXPECT_EQ(split_host.checkpoint_memory.peak_kept_host, blocks * part);
      EXPECT_EQ(split_host.checkpoint_memory.peak_kept_device, 0);
    }
  }
}

TEST(ActivationCheckpointing, PartitionWithoutAGroupKeepsWholeInputs) {
  if (skip_on_gpu()) GTEST_SKIP() << "the chain model computes on host memory";
  ChainOptions options;
  options.layers = 4;
  options.partition = true;
  const ChainResult reference = run_chain(options);
  options.every = 2;
  const ChainResult kept = run_chain(options, nullptr);
  expect_same(reference, kept, "partition_activations without a group");
  EXPECT_EQ(kept.checkpoint_memory.peak_kept_device,
            2 * static_cast<std::int64_t>(kActivationBytes));
}

TEST(ActivationCheckpointing, BackwardWithoutACheckpointIsAUsageError) {
  Engine engine = make_engine(toy_config(0), make_sgd());
  engine.register_parameter("w", {4});
  ActivationCheckpointer checkpointer(engine);
  EXPECT_THROW(checkpointer.backward([](BlockContext&) {}), UsageError);
  EXPECT_THROW(checkpointer.checkpoint(ActivationBuffer(), [](BlockContext&) {}), UsageError);
  EXPECT_THROW(checkpointer.checkpoint(engine.allocate_activations(16), [](BlockContext&) {}),
               UsageError);
}

TEST(ActivationCheckpointing, TooManyCheckpointsForTheContiguousBufferNameTheKey) {
  Config config = toy_config(0);
  config.activation_checkpointing.contiguous_memory_optimization = true;
  config.activation_checkpointing.number_checkpoints = 1;
  Engine engine = make_engine(config, make_sgd());
  engine.register_parameter("w", {4});
  ActivationCheckpointer checkpointer(engine);
  auto block = [](BlockContext& ctx) { ctx.allocate(64); };
  ActivationBuffer out = checkpointer.checkpoint(engine.allocate_activations(64), block);
  try {
    checkpointer.checkpoint(std::move(out), block);
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "activation_checkpointing.number_checkpoints");
  }
}

}  // namespace
}  // namespace zeroshard::testing
