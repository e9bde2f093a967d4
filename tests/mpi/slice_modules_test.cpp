// A model whose weights are stacked over its layers (one tensor per weight, layer l its slice
// [l * n, (l + 1) * n)) trains per layer at stage 3 with modules made of slices, gathered into
// the model's own memory, to the parameters of stage 0 bit for bit, holding one layer gathered
// at a time beside the persistent tensors. A whole-model gather trains the toy model alike.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

constexpr int kLayers = 4;

/// Per layer: w1 (48 elements), b1 (16), w2 (64), stacked over the layers; a tied embedding and
/// a final norm small enough to stay whole on every rank (persistent).
std::vector<ToyTensor> stacked_tensors() {
  return {{"wte", 24},
          {"h.w1", 48 * kLayers},
          {"h.b1", 16 * kLayers},
          {"h.w2", 64 * kLayers},
          {"lnf", 8}};
}
constexpr std::int64_t kPerLayer[] = {0, 48, 16, 64, 0};
constexpr std::int64_t kLayerElements = 48 + 16 + 64;
constexpr std::int64_t kPersistentElements = 24 + 8;

Config stacked_config(int stage) {
  Config config = toy_config(stage);
  config.zero_optimization.param_persistence_threshold = 25;  // wte and lnf
  // Without prefetch and reuse, exactly the layer in use is gathered.
  config.zero_optimization.prefetch_bucket_size = 0;
  config.zero_optimization.max_reuse_distance = 0;
  return config;
}

std::unique_ptr<UpdateRule> adamw() { return rule_cases()[0].make(); }

/// The toy gradients of elements [begin, end) of tensor k, added into the model's gradient block,
/// from the values in its parameter block (both host copies, fp32).
void add_gradients(std::vector<float>& grads, const std::vector<float>& params, std::size_t k,
                   std::int64_t offset, std::int64_t begin, std::int64_t end, int rank,
                   std::int64_t step) {
  for (std::int64_t i = begin; i < end; ++i) {
    grads[offset + i] += toy_gradient(params[offset + i], static_cast<int>(k), i, rank, step);
  }
}

/// The stacked model at stage 3 per layer, against stage 0. With `sharded_embedding` the tied
/// embedding is a module of its own instead of a persistent tensor, and is gathered twice in the
/// forward (the embedding, then the output head) and twice in the backward, released between.
void train_stacked_per_layer(bool sharded_embedding) {
  const auto tensors = stacked_tensors();
  constexpr int kSteps = 4;
  Config config = stacked_config(3);
  if (sharded_embedding) config.zero_optimization.param_persistence_threshold = 10;  // lnf only

  Engine reference = make_engine(stacked_config(0), adamw());
  const auto reference_handles = register_toy(reference, tensors);
  for (std::int64_t step = 0; step < kSteps; ++step) {
    toy_micro_step(reference, tensors, reference_handles, step);
    reference.step();
  }

  Engine engine = make_engine(config, adamw());
  engine.set_grad_handover(GradHandover::kAtEnd);
  std::vector<Parameter> handles;
  for (const ToyTensor& t : tensors)
    handles.push_back(engine.register_parameter(t.name, {t.numel}));
  std::vector<ModuleId> layers;
  for (int l = 0; l < kLayers; ++l) {
    std::vector<ParamSlice> slices;
    for (std::size_t k = 1; k <= 3; ++k) {
      slices.push_back({handles[k], l * kPerLayer[k], (l + 1) * kPerLayer[k]});
    }
    layers.push_back(engine.add_module("layer" + std::to_string(l), slices));
  }
  // A tensor outside every slice module is a module of its own.
  const ModuleId embedding = handles[0].module();
  const auto use_embedding = [&] {
    if (sharded_embedding) auto guard = engine.gathered(embedding);
  };
  // The model's own memory, as its trainer allocates it, with its initial values.
  const std::int64_t padded = engine.padded_numel();
  std::vector<std::int64_t> offset(tensors.size());
  std::vector<float> params(padded, 0.0f);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    offset[k] = engine.flat_offset(handles[k]);
    for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
      params[offset[k] + i] = initial_value(static_cast<int>(k), i);
    }
  }
  ActivationBuffer own_params = engine.allocate_activations(padded * sizeof(float));
  ActivationBuffer own_grads = engine.allocate_activations(padded * sizeof(float));
  from_host(engine, own_params.data(), params.data(), padded * sizeof(float));
  engine.adopt_memory({.parameters = own_params.data(), .gradients = own_grads.data()});
  engine.finalize();

  for (std::int64_t step = 0; step < kSteps; ++step) {
    // Forward: the embedding, layer by layer each gathered into the model's memory and released,
    // and the tied head.
    use_embedding();
    for (ModuleId layer : layers) {
      auto guard = engine.gathered(layer);
    }
    use_embedding();
    // Backward: the head, the layers in reverse, the embedding; every gradient is handed over at
    // the end, as a stacked model's backward completes them.
    std::vector<float> grads = floats_to_host(engine, own_grads.data(), padded);
    use_embedding();
    params = floats_to_host(engine, own_params.data(), padded);
    for (int l = kLayers; l-- > 0;) {
      auto guard = engine.gathered(layers[l]);
      const std::vector<float> gathered = floats_to_host(engine, own_params.data(), padded);
      for (std::size_t k = 1; k <= 3; ++k) {
        add_gradients(grads, gathered, k, offset[k], l * kPerLayer[k], (l + 1) * kPerLayer[k],
                      engine.rank(), step);
      }
    }
    {
      std::optional<Engine::GatheredModule> guard;
      if (sharded_embedding) guard.emplace(engine.gathered(embedding));
      const std::vector<float> gathered = floats_to_host(engine, own_params.data(), padded);
      add_gradients(grads, gathered, 0, offset[0], 0, tensors[0].numel, engine.rank(), step);
    }
    add_gradients(grads, params, 4, offset[4], 0, tensors[4].numel, engine.rank(), step);
    from_host(engine, own_grads.data(), grads.data(), padded * sizeof(float));
    engine.all_grads_ready();
    engine.step();
  }
  EXPECT_EQ(engine.consolidated_parameters(), reference.consolidated_parameters())
      << "world " << engine.world_size();
  // One layer at a time (the embedding is never gathered beside one), and the persistent ones.
  const std::int64_t persistent = sharded_embedding ? 8 : kPersistentElements;
  EXPECT_EQ(engine.peak_gathered_bytes(),
            static_cast<std::int64_t>(sizeof(float)) * (kLayerElements + persistent));
  EXPECT_EQ(reference.peak_gathered_bytes(), 0);
}

TEST(SliceModules, AStackedModelTrainsPerLayerAtStageThreeAsAtStageZero) {
  train_stacked_per_layer(false);
}

TEST(SliceModules, ATiedEmbeddingGatheredAgainWithinAStepTrainsAsAtStageZero) {
  train_stacked_per_layer(true);
}

TEST(SliceModules, AtStageThreeWithoutAdoptedMemoryAreAUsageError) {
  Engine engine = make_engine(stacked_config(3), adamw());
  const Parameter w = engine.register_parameter("h.w1", {48 * kLayers});
  engine.add_module("layer0", {{w, 0, 48}});
  try {
    engine.finalize();
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("adopt_memory"), std::string::npos) << error.what();
  }
}

TEST(SliceModules, SlicesOutsideTheParameterOrOverlappingAreUsageErrors) {
  Engine engine = make_engine(stacked_config(3), adamw());
  const Parameter w = engine.register_parameter("h.w1", {48 * kLayers});
  EXPECT_THROW(engine.add_module("bad", {{w, 180, 200}}), UsageError);
  EXPECT_THROW(engine.add_module("bad", {{w, 0, 48}, {w, 40, 96}}), UsageError);
  EXPECT_THROW(engine.add_module("h", {{w, 0, 48}}), UsageError) << "the name is taken";
}

TEST(WholeModelGather, TrainsTheToyModelAsPerModuleGathersDo) {
  const auto tensors = uneven_toy_tensors();
  Engine reference = make_engine(toy_config(0), adamw());
  const auto reference_handles = register_toy(reference, tensors);
  Config config = toy_config(3);
  config.zero_optimization.param_persistence_threshold = 0;
  Engine engine = make_engine(config, adamw());
  const auto handles = register_toy(engine, tensors);
  for (std::int64_t step = 0; step < 3; ++step) {
    toy_micro_step(reference, tensors, reference_handles, step);
    reference.step();
    {
      const Engine::GatheredModel model = engine.gathered_model();
      for (std::size_t k = tensors.size(); k-- > 0;) {
        if (!tensors[k].trainable) continue;
        add_toy_gradient(engine, handles[k], k, step);
        engine.grad_ready(handles[k]);
      }
    }
    engine.step();
  }
  EXPECT_EQ(engine.consolidated_parameters(), reference.consolidated_parameters());
  // Every trainable element was gathered at once.
  EXPECT_GE(engine.peak_gathered_bytes(), 4 * (91 + 7 + 77 + 11 + 33 + 3));
}

}  // namespace
}  // namespace zeroshard::testing
