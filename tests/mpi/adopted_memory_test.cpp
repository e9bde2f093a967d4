// The engine working in the model's own memory (Engine::adopt_memory): the same parameters as
// engine-owned buffers at every stage and world size, bit for bit, in either gradient handover;
// nothing copied at stages 0-1 (the memory report lists the model's blocks as adopted and no
// buffer of the engine's beside them); addresses that stay put; the model's initial values taken.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

#include "mpi/toy_model.h"
#include "precision/half_conversion.h"

namespace zeroshard::testing {
namespace {

std::unique_ptr<UpdateRule> adamw() { return rule_cases()[0].make(); }

/// Adds tensor k's toy gradient (times the loss scale) into its gradient buffer, in the
/// engine's precision, as toy_micro_step_any_precision does.
void add_gradient(Engine& engine, const Parameter& handle, std::size_t k, std::int64_t step) {
  const DType dtype = engine.model_dtype();
  const std::int64_t n = handle.numel();
  const std::size_t bytes = n * size_of(dtype);
  const std::vector<char> raw_param = to_host(engine, handle.raw_data(), bytes);
  void* grad_buffer = handle.raw_grad();
  std::vector<char> raw_grad = to_host(engine, grad_buffer, bytes);
  std::vector<float> w(n);
  std::vector<float> g(n);
  detail::convert_to_float(raw_param.data(), dtype, w.data(), n);
  detail::convert_to_float(raw_grad.data(), dtype, g.data(), n);
  const auto scale = static_cast<float>(engine.loss_scale());
  for (std::int64_t i = 0; i < n; ++i) {
    g[i] += scale * toy_gradient(w[i], static_cast<int>(k), i, engine.rank(), step);
  }
  detail::convert_from_float(g.data(), raw_grad.data(), dtype, n);
  from_host(engine, grad_buffer, raw_grad.data(), bytes);
}

/// Hands every gradient over after the whole backward (GradHandover::kAtEnd).
void toy_micro_step_at_end(Engine& engine, const std::vector<ToyTensor>& tensors,
                           const std::vector<Parameter>& handles, std::int64_t step) {
  std::vector<ModuleId> order;
  for (const Parameter& p : handles) {
    if (order.empty() || order.back() != p.module()) order.push_back(p.module());
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto guard = engine.gathered(*it);
    for (std::size_t k = tensors.size(); k-- > 0;) {
      if (handles[k].module() == *it && tensors[k].trainable)
        add_gradient(engine, handles[k], k, step);
    }
  }
  engine.all_grads_ready();
}

/// A model that owns its memory: one flat block of parameters and one of gradients in the
/// engine's layout, on the engine's device (activation memory serves as the model's here).
struct OwnMemory {
  ActivationBuffer parameters;
  ActivationBuffer gradients;
};

/// Registers the uneven toy model (its frozen tensor stays the engine's), writes the initial
/// values into the model's own block and lends both blocks to the engine.
std::vector<Parameter> register_adopted(Engine& engine, const std::vector<ToyTensor>& tensors,
                                        OwnMemory& own) {
  std::vector<Parameter> handles;
  for (const ToyTensor& t : tensors) {
    ParamOptions options;
    options.trainable = t.trainable;
    handles.push_back(engine.register_parameter(t.name, {t.numel}, options));
  }
  const DType dtype = engine.model_dtype();
  const std::size_t bytes = engine.padded_numel() * size_of(dtype);
  own.parameters = engine.allocate_activations(bytes);
  own.gradients = engine.allocate_activations(bytes);
  std::vector<char> block(bytes);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    std::vector<float> values(tensors[k].numel);
    for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
      values[i] = initial_value(static_cast<int>(k), i);
    }
    detail::convert_from_float(values.data(),
                               block.data() + engine.flat_offset(handles[k]) * size_of(dtype),
                               dtype, tensors[k].numel);
  }
  from_host(engine, own.parameters.data(), block.data(), bytes);
  engine.adopt_memory({.parameters = own.parameters.data(), .gradients = own.gradients.data()});
  // The frozen tensor is the engine's: it takes its values as before.
  std::vector<float> frozen(tensors[2].numel);
  for (std::int64_t i = 0; i < tensors[2].numel; ++i) frozen[i] = initial_value(2, i);
  handles[2].copy_from(frozen);
  return handles;
}

Config adopted_config(int stage, bool bf16) {
  Config config = toy_config(stage);
  config.bf16.enabled = bf16;
  return config;
}

void micro_step(Engine& engine, const std::vector<ToyTensor>& tensors,
                const std::vector<Parameter>& handles, std::int64_t step) {
  if (engine.grad_handover() == GradHandover::kAtEnd) {
    toy_micro_step_at_end(engine, tensors, handles, step);
  } else {
    toy_micro_step_any_precision(engine, tensors, handles, step);
  }
}

/// A 16-bit block carries its values rounded, and so does the master taken from it: an engine of
/// its own memory compared with it starts from the same rounded values.
void give_bf16_initial_values(const std::vector<Parameter>& handles,
                              const std::vector<ToyTensor>& tensors) {
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    std::vector<float> values(tensors[k].numel);
    for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
      values[i] = initial_value(static_cast<int>(k), i);
    }
    std::vector<char> narrow(tensors[k].numel * 2);
    detail::convert_from_float(values.data(), narrow.data(), DType::kBFloat16, tensors[k].numel);
    detail::convert_to_float(narrow.data(), DType::kBFloat16, values.data(), tensors[k].numel);
    handles[k].copy_from(values);
  }
}

class AdoptedMemory : public ::testing::TestWithParam<std::tuple<int, GradHandover, bool>> {};

TEST_P(AdoptedMemory, TrainsToTheParametersOfEngineOwnedMemoryInPlace) {
  const int stage = std::get<0>(GetParam());
  const GradHandover handover = std::get<1>(GetParam());
  const bool bf16 = std::get<2>(GetParam());
  const auto tensors = uneven_toy_tensors();
  constexpr int kSteps = 5;

  Engine owned = make_engine(adopted_config(stage, bf16), adamw());
  owned.set_grad_handover(handover);
  const auto owned_handles = register_toy(owned, tensors);
  if (bf16) give_bf16_initial_values(owned_handles, tensors);
  for (std::int64_t step = 0; step < kSteps; ++step) {
    micro_step(owned, tensors, owned_handles, step);
    owned.step();
  }

  Engine adopted = make_engine(adopted_config(stage, bf16), adamw());
  adopted.set_grad_handover(handover);
  OwnMemory own;
  const auto handles = register_adopted(adopted, tensors, own);
  const DType dtype = adopted.model_dtype();
  const auto dsize = static_cast<std::int64_t>(size_of(dtype));
  for (std::int64_t step = 0; step < kSteps; ++step) {
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      if (!tensors[k].trainable) continue;
      const std::int64_t at = adopted.flat_offset(handles[k]) * dsize;
      // Every address handed out is the model's own, at every step.
      EXPECT_EQ(handles[k].raw_grad(), reinterpret_cast<char*>(own.gradients.data()) + at);
      if (stage != 3) {
        EXPECT_EQ(handles[k].raw_data(), reinterpret_cast<char*>(own.parameters.data()) + at);
      } else {
        auto guard = adopted.gathered(handles[k].module());
        EXPECT_EQ(handles[k].raw_data(), reinterpret_cast<char*>(own.parameters.data()) + at);
      }
    }
    micro_step(adopted, tensors, handles, step);
    adopted.step();
  }
  const std::vector<float> expected = owned.consolidated_parameters();
  EXPECT_EQ(adopted.consolidated_parameters(), expected)
      << "stage " << stage << " world " << adopted.world_size();

  // The model's own block holds the trained parameters (stage 3: once gathered).
  const std::vector<char> block =
      to_host(adopted, own.parameters.data(), adopted.padded_numel() * dsize);
  std::size_t consolidated_at = 0;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    std::vector<float> values(tensors[k].numel);
    std::vector<char> raw = block;
    if (stage == 3) {
      auto guard = adopted.gathered(handles[k].module());
      raw = to_host(adopted, own.parameters.data(), adopted.padded_numel() * dsize);
    }
    detail::convert_to_float(raw.data() + adopted.flat_offset(handles[k]) * dsize, dtype,
                             values.data(), tensors[k].numel);
    std::vector<float> rounded(expected.begin() + consolidated_at,
                               expected.begin() + consolidated_at + tensors[k].numel);
    consolidated_at += tensors[k].numel;
    // The block holds the model-precision rounding of the master.
    std::vector<char> narrow(tensors[k].numel * dsize);
    detail::convert_from_float(rounded.data(), narrow.data(), dtype, tensors[k].numel);
    detail::convert_to_float(narrow.data(), dtype, rounded.data(), tensors[k].numel);
    EXPECT_EQ(values, rounded) << tensors[k].name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    StagesHandoversPrecisions, AdoptedMemory,
    ::testing::Combine(::testing::Values(0, 1, 2, 3),
                       ::testing::Values(GradHandover::kPerParameter, GradHandover::kAtEnd),
                       ::testing::Bool()),
    [](const auto& info) {
      return "stage" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) == GradHandover::kAtEnd ? "_at_end" : "_per_parameter") +
             (std::get<2>(info.param) ? "_bf16" : "_fp32");
    });

// Multiples of 16 elements whose total divides by 16 x {1,2,3,4}: no padding.
std::vector<ToyTensor> aligned_tensors() {
  return {{"a.weight", 160}, {"a.bias", 32}, {"b.weight", 160}, {"b.bias", 32}};
}
constexpr std::int64_t kP = 384;

class AdoptedMemoryReport : public ::testing::TestWithParam<int> {};

TEST_P(AdoptedMemoryReport, ListsTheModelsBlocksAndNoCopyBesideThem) {
  const int stage = GetParam();
  Config config = toy_config(stage);
  config.zero_optimization.param_persistence_threshold = 0;
  Engine engine = make_engine(config, adamw());
  const auto tensors = aligned_tensors();
  std::vector<Parameter> handles;
  for (const ToyTensor& t : tensors)
    handles.push_back(engine.register_parameter(t.name, {t.numel}));
  ASSERT_EQ(engine.padded_numel(), kP);
  ActivationBuffer parameters = engine.allocate_activations(4 * kP);
  ActivationBuffer gradients = engine.allocate_activations(4 * kP);
  engine.adopt_memory({.parameters = parameters.data(), .gradients = gradients.data()});
  for (std::int64_t step = 0; step < 2; ++step) {
    toy_micro_step(engine, tensors, handles, step);
    engine.step();
  }
  const MemoryReport report = engine.memory_report();
  const MemoryLocation where = engine_memory(engine);
  const int l = static_cast<int>(where);
  const std::int64_t n = engine.world_size();
  const auto& params = report.at(MemoryCategory::kParameters, where);
  const auto& grads = report.at(MemoryCategory::kGradients, where);
  EXPECT_EQ(report.adopted[l][static_cast<int>(MemoryCategory::kParameters)], 4 * kP);
  EXPECT_EQ(report.adopted[l][static_cast<int>(MemoryCategory::kGradients)], 4 * kP);
  // The model's gradients are the whole gradients: no shard and no bucket input areas.
  EXPECT_EQ(grads.peak, 4 * kP);
  if (stage <= 2) {
    // Nothing of the engine's own beside the model's parameters, ever.
    EXPECT_EQ(params.peak, 4 * kP);
  } else {
    // The shard, and the gathers fill the model's memory instead of buffers of their own.
    EXPECT_EQ(params.peak, 4 * kP + 4 * kP / n);
  }
  EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, where).current,
            stage == 0 ? 8 * kP : 8 * kP / n);
}

INSTANTIATE_TEST_SUITE_P(Stages, AdoptedMemoryReport, ::testing::Values(0, 1, 2, 3));

// qwZ rounds what the gathers carry; the persistent parameters (under
// stage3_param_persistence_threshold) are kept whole and unquantized, in the model's own memory as
// in the engine's: before any step and after one, each reads back what the engine's memory gives.
TEST(AdoptedMemory, QuantizedWeightsLeaveThePersistentParametersExact) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Config config = adopted_config(3, bf16);
    config.zero_optimization.quantized_weights = true;
    const auto tensors = uneven_toy_tensors();
    Engine owned = make_engine(config, adamw());
    const auto owned_handles = register_toy(owned, tensors);
    if (bf16) give_bf16_initial_values(owned_handles, tensors);
    Engine engine = make_engine(config, adamw());
    OwnMemory own;
    const auto handles = register_adopted(engine, tensors, own);
    const DType dtype = engine.model_dtype();
    // Reads every persistent parameter with its module gathered, so that the gather's decode has
    // run over the module's range.
    const auto persistent_values = [&](Engine& e, const std::vector<Parameter>& h) {
      std::vector<float> all;
      for (std::size_t k = 0; k < tensors.size(); ++k) {
        if (!tensors[k].trainable ||
            tensors[k].numel >= config.zero_optimization.param_persistence_threshold) {
          continue;
        }
        auto guard = e.gathered(h[k].module());
        const std::int64_t n = tensors[k].numel;
        std::vector<float> values(n);
        detail::convert_to_float(to_host(e, h[k].raw_data(), n * size_of(dtype)).data(), dtype,
                                 values.data(), n);
        all.insert(all.end(), values.begin(), values.end());
      }
      return all;
    };
    std::vector<float> expected;
    for (std::size_t k : {std::size_t{1}, std::size_t{6}}) {  // a.bias and c.bias
      for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
        const float value = initial_value(static_cast<int>(k), i);
        expected.push_back(bf16 ? detail::bfloat16_to_float(detail::float_to_bfloat16(value))
                                : value);
      }
    }
    EXPECT_EQ(persistent_values(engine, handles), expected) << "before any step";
    EXPECT_EQ(persistent_values(owned, owned_handles), expected);
    toy_micro_step_any_precision(owned, tensors, owned_handles, 0);
    ASSERT_TRUE(owned.step().updated);
    toy_micro_step_any_precision(engine, tensors, handles, 0);
    ASSERT_TRUE(engine.step().updated);
    EXPECT_EQ(persistent_values(engine, handles), persistent_values(owned, owned_handles))
        << "after a step";
  }
}

// Stages 0-1 empty the 16-bit gradients into an fp32 accumulator at every micro-step's end; the
// model's own gradient memory keeps the window's sum where the model wrote it, so the two are
// refused together, by name.
TEST(AdoptedMemory, Fp32AccumulationOfTheModelsGradientsIsAConfigError) {
  Config config = adopted_config(1, true);
  config.grad_accum_dtype = "fp32";
  Engine engine = make_engine(config, adamw());
  OwnMemory own;
  try {
    // Its first use of a parameter finalizes the engine.
    register_adopted(engine, uneven_toy_tensors(), own);
    engine.finalize();
    FAIL() << "fp32 accumulation in adopted gradient memory was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "data_types.grad_accum_dtype");
    EXPECT_NE(std::string(error.what()).find("Engine::adopt_memory"), std::string::npos)
        << error.what();
  }
}

TEST(AdoptedMemory, AfterFinalizeIsAUsageError) {
  Engine engine = make_engine(toy_config(1), adamw());
  engine.register_parameter("a.weight", {64});
  engine.finalize();
  float block[64] = {};
  EXPECT_THROW(engine.adopt_memory({.parameters = block}), UsageError);
}

TEST(AdoptedMemory, RanksThatDisagreeGetAUsageErrorEverywhere) {
  Engine engine = make_engine(toy_config(2), adamw());
  if (engine.world_size() == 1) GTEST_SKIP() << "needs two ranks or more to disagree";
  engine.register_parameter("a.weight", {64});
  ActivationBuffer gradients = engine.allocate_activations(4 * engine.padded_numel());
  if (engine.rank() == 0) engine.adopt_memory({.gradients = gradients.data()});
  try {
    engine.finalize();
    FAIL() << "ranks that adopt differently were not detected";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("adopt_memory"), std::string::npos) << error.what();
  }
}

TEST(AdoptedMemory, FlatOffsetOfAFrozenParameterIsAUsageError) {
  Engine engine = make_engine(toy_config(0), adamw());
  ParamOptions frozen;
  frozen.trainable = false;
  const Parameter table = engine.register_parameter("table", {8}, frozen);
  EXPECT_THROW(engine.flat_offset(table), UsageError);
}

// Stage 3 gathers into the model's memory and the update changes the shards, so what a module
// holds there outside gather() is stale. ZEROSHARD_POISON_RELEASED=1 makes it NaN instead, and
// leaves the persistent parameters, which are whole on every rank, readable.
class PoisonReleased : public ::testing::Test {
 protected:
  void SetUp() override { setenv("ZEROSHARD_POISON_RELEASED", "1", 1); }
  void TearDown() override { setenv("ZEROSHARD_POISON_RELEASED", previous_.c_str(), 1); }

  static std::vector<float> values_of(Engine& engine, const OwnMemory& own,
                                      const Parameter& handle) {
    const DType dtype = engine.model_dtype();
    const std::int64_t n = handle.numel();
    const std::vector<char> raw =
        to_host(engine,
                static_cast<const char*>(static_cast<const void*>(own.parameters.data())) +
                    engine.flat_offset(handle) * size_of(dtype),
                n * size_of(dtype));
    std::vector<float> values(n);
    detail::convert_to_float(raw.data(), dtype, values.data(), n);
    return values;
  }
  static int nan_count(const std::vector<float>& values) {
    int count = 0;
    for (float v : values) count += std::isnan(v) ? 1 : 0;
    return count;
  }

 private:
  std::string previous_ = [] {
    const char* value = std::getenv("ZEROSHARD_POISON_RELEASED");
    return std::string(value ? value : "");
  }();
};

TEST_F(PoisonReleased, AModuleReadOutsideItsGatherIsNaNAtStage3) {
  for (bool bf16 : {false, true}) {
    OwnMemory own;
    Engine engine = make_engine(adopted_config(3, bf16), adamw());
    const std::vector<ToyTensor> tensors = uneven_toy_tensors();
    std::vector<Parameter> handles = register_adopted(engine, tensors, own);
    engine.finalize();
    const Parameter& b_weight = handles[3];
    const Parameter& a_bias = handles[1];  // 7 elements: persistent, whole on every rank
    EXPECT_EQ(nan_count(values_of(engine, own, b_weight)), b_weight.numel()) << "bf16 " << bf16;
    EXPECT_EQ(nan_count(values_of(engine, own, a_bias)), 0) << "bf16 " << bf16;
    {
      auto gathered = engine.gathered(b_weight.module());
      const std::vector<float> values = values_of(engine, own, b_weight);
      EXPECT_EQ(nan_count(values), 0) << "bf16 " << bf16;
    }
    toy_micro_step_any_precision(engine, tensors, handles, 0);
    engine.step();
    // The step's update made the last gathered values stale: they are poisoned again.
    EXPECT_EQ(nan_count(values_of(engine, own, b_weight)), b_weight.numel()) << "bf16 " << bf16;
    EXPECT_EQ(nan_count(values_of(engine, own, a_bias)), 0) << "bf16 " << bf16;
  }
}

TEST_F(PoisonReleased, PoisonedTrainingEqualsTrainingWithoutIt) {
  std::vector<float> results[2];
  for (bool poison : {false, true}) {
    setenv("ZEROSHARD_POISON_RELEASED", poison ? "1" : "0", 1);
    OwnMemory own;
    Engine engine = make_engine(adopted_config(3, false), adamw());
    const std::vector<ToyTensor> tensors = uneven_toy_tensors();
    std::vector<Parameter> handles = register_adopted(engine, tensors, own);
    for (std::int64_t step = 0; step < 3; ++step) {
      toy_micro_step_any_precision(engine, tensors, handles, step);
      engine.step();
    }
    results[poison ? 1 : 0] = engine.consolidated_parameters();
  }
  EXPECT_EQ(results[0], results[1]);
}

}  // namespace
}  // namespace zeroshard::testing
