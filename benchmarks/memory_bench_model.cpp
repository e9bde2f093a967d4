// The synthetic model and the adapters to the MLP and GPT examples.
#include "memory_bench_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "zeroshard/error.h"

#ifdef ZEROSHARD_BENCH_WITH_MLP
#include "mlp_model.h"
#include "synthetic_data.h"
#endif
#ifdef ZEROSHARD_BENCH_WITH_GPT
#include "gpt_model.h"
#endif

namespace zeroshard::bench {

namespace {

constexpr std::int64_t kPatternElements = 4096;

float pattern_value(std::size_t i) {
  return 0.02f * static_cast<float>(std::sin(0.001 * static_cast<double>(i)));
}

/// `params` elements in `tensors` tensors of (nearly) equal size, one module each, so stage 3
/// gathers them one at a time. Its gradients are fixed values written in the model's precision,
/// as a backward pass would write them.
class SyntheticModel final : public BenchModel {
 public:
  SyntheticModel(Engine& engine, std::int64_t params, int tensors) : engine_(engine) {
    for (int t = 0; t < tensors; ++t) {
      const std::int64_t numel = params / tensors + (t < params % tensors ? 1 : 0);
      handles_.push_back(
          engine.register_parameter("layer" + std::to_string(t) + ".weight", {numel}));
      numels_.push_back(numel);
    }
  }

  void initialize() override {
    for (std::size_t t = 0; t < handles_.size(); ++t) {
      std::vector<float> values(static_cast<std::size_t>(numels_[t]));
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = pattern_value(i + t);
      handles_[t].copy_from(values);
    }
    // Gradients repeat a short pattern, prepared once in the model's precision, so that the
    // benchmark's own memory stays small beside the engine's in the process's peak RSS.
    std::vector<float> pattern(kPatternElements);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = 0.05f * pattern_value(i);
    gradient_pattern_.resize(pattern.size() * size_of(engine_.model_dtype()));
    convert(pattern.data(), DType::kFloat32, gradient_pattern_.data(), engine_.model_dtype(),
            kPatternElements);
  }

  void micro_step(std::int64_t) override {
    for (const Parameter& p : handles_) {
      const Engine::GatheredModule gathered = engine_.gathered(p.module());
    }
    const std::size_t element = size_of(engine_.model_dtype());
    for (std::size_t t = handles_.size(); t-- > 0;) {
      const Engine::GatheredModule gathered = engine_.gathered(handles_[t].module());
      auto* grad = static_cast<unsigned char*>(handles_[t].raw_grad());
      for (std::int64_t done = 0; done < numels_[t]; done += kPatternElements) {
        const std::int64_t n = std::min(kPatternElements, numels_[t] - done);
        std::memcpy(grad + done * element, gradient_pattern_.data(), n * element);
      }
      engine_.grad_ready(handles_[t]);
    }
  }

  std::vector<std::int64_t> tensor_numels() const override { return numels_; }

 private:
  Engine& engine_;
  std::vector<Parameter> handles_;
  std::vector<std::int64_t> numels_;
  std::vector<unsigned char> gradient_pattern_;
};

#ifdef ZEROSHARD_BENCH_WITH_MLP
/// The MLP example on its synthetic classification task; each rank takes its own samples.
class MlpBenchModel final : public BenchModel {
 public:
  MlpBenchModel(Engine& engine, const BenchOptions& o, int checkpoint_every)
      : engine_(engine),
        model_(engine,
               examples::MlpShape{
                   .inputs = o.inputs, .width = o.width, .layers = o.layers, .classes = o.classes},
               o.micro_batch, examples::MlpTraining{.checkpoint_every = checkpoint_every}),
        data_(o.inputs, o.classes, 1),
        micro_batch_(o.micro_batch),
        x_(static_cast<std::size_t>(o.micro_batch) * o.inputs),
        labels_(static_cast<std::size_t>(o.micro_batch)) {}

  void initialize() override { model_.initialize(1); }

  void micro_step(std::int64_t step) override {
    const examples::BatchRange range = examples::data_parallel_range(
        step, 0, 1, micro_batch_, engine_.rank(), engine_.world_size());
    data_.sample(range.first, range.count, x_.data(), labels_.data());
    model_.train_micro_step(x_.data(), labels_.data(), range.count);
  }

  EstimateInput activation_input() const override {
    EstimateInput input;
    const examples::MlpShape& shape = model_.shape();
    if (shape.inputs != shape.width || shape.classes != shape.width) return input;
    input.activation_bytes = model_.fixed_activation_bytes();
    input.layer_activation_bytes = static_cast<std::int64_t>(micro_batch_) * shape.width *
                                   static_cast<std::int64_t>(sizeof(float));
    input.layers = shape.layers;
    input.checkpoint_every = model_.training().checkpoint_every;
    input.cpu_checkpointing = engine_.config().activation_checkpointing.cpu_checkpointing;
    return input;
  }

  double recompute_seconds() const override {
    return model_.checkpointer() ? model_.checkpointer()->profile().recompute_seconds : 0.0;
  }

  std::vector<std::int64_t> tensor_numels() const override {
    std::vector<std::int64_t> numels;
    for (const Parameter& p : engine_.parameters()) {
      if (p.trainable()) numels.push_back(p.numel());
    }
    return numels;
  }

 private:
  Engine& engine_;
  examples::MlpModel model_;
  examples::SyntheticClassification data_;
  int micro_batch_;
  std::vector<float> x_;
  std::vector<int> labels_;
};
#endif

#ifdef ZEROSHARD_BENCH_WITH_GPT
/// The GPT example on a byte vocabulary, trained on token ids from a fixed pattern: its memory
/// does not depend on the text, only on the shape and the micro batch.
class GptBenchModel final : public BenchModel {
 public:
  GptBenchModel(Engine& engine, const BenchOptions& o, int checkpoint_every)
      : engine_(engine),
        model_(engine,
               examples::GptShape{.vocab = kVocab,
                                  .layers = o.gpt_layers,
                                  .channels = o.gpt_channels,
                                  .heads = o.gpt_heads,
                                  .seq = o.gpt_seq},
               o.micro_batch, examples::GptTraining{.checkpoint_every = checkpoint_every}),
        micro_batch_(o.micro_batch),
        tokens_(static_cast<std::size_t>(o.micro_batch) * o.gpt_seq + 1) {
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      tokens_[i] = static_cast<int>((i * 7 + static_cast<std::size_t>(engine.rank())) % kVocab);
    }
  }

  void initialize() override { model_.initialize(1); }

  void micro_step(std::int64_t) override {
    model_.train_micro_step(tokens_.data(), tokens_.data() + 1, micro_batch_);
  }

  double recompute_seconds() const override {
    return model_.checkpointer() ? model_.checkpointer()->profile().recompute_seconds : 0.0;
  }

  std::vector<std::int64_t> tensor_numels() const override {
    std::vector<std::int64_t> numels;
    for (const Parameter& p : engine_.parameters()) numels.push_back(p.numel());
    return numels;
  }

 private:
  static constexpr int kVocab = 256;
  Engine& engine_;
  examples::GptModel model_;
  int micro_batch_;
  std::vector<int> tokens_;  ///< the inputs; the targets are the same shifted by one
};
#endif

}  // namespace

bool mlp_available() {
#ifdef ZEROSHARD_BENCH_WITH_MLP
  return true;
#else
  return false;
#endif
}

std::unique_ptr<BenchModel> make_model(const BenchOptions& options, Engine& engine,
                                       int checkpoint_every) {
  if (options.gpt()) {
#ifdef ZEROSHARD_BENCH_WITH_GPT
    return std::make_unique<GptBenchModel>(engine, options, checkpoint_every);
#else
    throw UsageError(
        "--gpt: this build has no GPT example (configure with "
        "ZEROSHARD_BUILD_EXAMPLES=ON)");
#endif
  }
  if (!options.mlp()) {
    if (checkpoint_every != 0) {
      throw UsageError("--checkpoint-every: the synthetic model has no forward to checkpoint");
    }
    return std::make_unique<SyntheticModel>(engine, options.params, options.tensors);
  }
#ifdef ZEROSHARD_BENCH_WITH_MLP
  return std::make_unique<MlpBenchModel>(engine, options, checkpoint_every);
#else
  throw UsageError(
      "--layers: this build has no MLP example (configure with ZEROSHARD_BUILD_EXAMPLES=ON)");
#endif
}

}  // namespace zeroshard::bench
