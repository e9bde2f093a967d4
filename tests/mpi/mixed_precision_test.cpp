// Mixed precision, loss scaling, clipping and gradient accumulation at every stage: 16-bit runs
// (reduced in 16 bits or in fp32) match an unsharded mixed-precision reference, fp16 overflow skips
// the step on every rank (bf16 too, as DeepSpeed's check_grad_overflow does), a NaN under fp32
// is an error, and bytes follow the ZeRO formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mpi/toy_model.h"
#include "precision/half_conversion.h"

namespace zeroshard::testing {
namespace {

/// d loss / d param of one sample on one rank, from the parameter value the model sees.
using GradientFn =
    std::function<float(float param, int tensor, std::int64_t i, int rank, std::int64_t sample)>;

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat16:
      return detail::half_to_float(detail::float_to_half(value));
    case DType::kBFloat16:
      return detail::bfloat16_to_float(detail::float_to_bfloat16(value));
    case DType::kFloat32:
    case DType::kFloat64:
      break;
  }
  return value;
}

int significand_bits(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 11;
    case DType::kBFloat16:
      return 8;
    case DType::kFloat64:
      return 53;
    case DType::kFloat32:
      break;
  }
  return 24;
}

// The toy gradients (|g| <= 4) on a grid of 2^-bits, with `bits` chosen so that every per-rank
// value and every partial sum of up to `terms` of them is exact in `dtype`: such a sum is below
// 4 * terms, so it spans 2^(log2(4 * terms) - 1) .. 2^-bits. With four ranks, |sum| <= 16 needs
// 4 + bits significant bits: bits = 7 for fp16, 4 for bf16. A 16-bit reduction then yields the
// exact sum whatever order MPI adds in, so comparisons with the reference do not depend on the
// reduction algorithm. (The toy_model grid of 2^-10 would not do: a sum of four values up to 16
// needs 14 significant bits, more than fp16's 11.)
int exact_grid_bits(DType dtype, int terms) {
  const int integer_bits = static_cast<int>(std::ceil(std::log2(4.0 * terms)));
  return std::min(10, significand_bits(dtype) - integer_bits);
}

GradientFn grid_gradient(int bits) {
  const double grid = std::ldexp(1.0, bits);
  return [grid](float param, int tensor, std::int64_t i, int rank, std::int64_t sample) {
    const float fine = toy_gradient(param, tensor, i, rank, sample);
    return static_cast<float>(std::nearbyint(fine * grid) / grid);
  };
}

GradientFn exact_sum_gradient(DType dtype) { return grid_gradient(exact_grid_bits(dtype, 4)); }

// Where tests plant a non-finite value: an element of "b.weight", on the last rank.
constexpr int kPlantedTensor = 3;
constexpr std::int64_t kPlantedElement = 5;

GradientFn planted(GradientFn base, int rank, std::int64_t sample, float value) {
  return [=](float param, int tensor, std::int64_t i, int r, std::int64_t s) {
    if (r == rank && s == sample && tensor == kPlantedTensor && i == kPlantedElement) return value;
    return base(param, tensor, i, r, s);
  };
}

/// `count` values of the engine's model dtype in its memory, widened to fp32 on the host.
std::vector<float> model_floats_to_host(const Engine& engine, const void* source,
                                        std::int64_t count) {
  const DType dtype = engine.model_dtype();
  std::vector<float> values(count);
  detail::convert_to_float(to_host(engine, source, count * size_of(dtype)).data(), dtype,
                           values.data(), count);
  return values;
}

/// One micro-step the way a 16-bit model does it: forward gathers every module, backward
/// computes each gradient from the 16-bit parameter values, multiplies it by the loss scale (the
/// scaled loss's backward) and adds it into the 16-bit gradient buffer.
void micro_step(Engine& engine, const std::vector<ToyTensor>& tensors,
                const std::vector<Parameter>& handles, std::int64_t sample,
                const GradientFn& gradient) {
  const DType dtype = engine.model_dtype();
  const auto scale = static_cast<float>(engine.loss_scale());
  toy_backward(engine, tensors, handles, [&](std::size_t k) {
    const std::int64_t n = tensors[k].numel;
    const std::size_t bytes = n * size_of(dtype);
    const std::vector<float> w = model_floats_to_host(engine, handles[k].raw_data(), n);
    std::vector<float> g(n);
    void* raw_grad = handles[k].raw_grad();
    std::vector<char> grad_bytes = to_host(engine, raw_grad, bytes);
    detail::convert_to_float(grad_bytes.data(), dtype, g.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      g[i] += scale * gradient(w[i], static_cast<int>(k), i, engine.rank(), sample);
    }
    detail::convert_from_float(g.data(), grad_bytes.data(), dtype, n);
    from_host(engine, raw_grad, grad_bytes.data(), bytes);
  });
}

/// The unsharded mixed-precision reference: fp32 master weights; the model sees them rounded to
/// the 16-bit type; each rank's scaled gradient is rounded to it; the ranks' values are summed in
/// fp32 (exact for the toy gradients and at most four ranks) and the sum is rounded once to the
/// 16-bit type unless `round_sum` is false (reduced and kept in fp32); then it is unscaled and
/// averaged with the factor the engine uses, optionally clipped by DeepSpeed's rule, and the same
/// update rule runs on whole tensors.
class MixedReference {
 public:
  MixedReference(const std::vector<ToyTensor>& tensors, const UpdateRule& rule, int world_size,
                 DType dtype, bool round_sum = true)
      : tensors_(tensors),
        rule_(rule),
        world_(world_size),
        dtype_(dtype),
        sum_dtype_(round_sum ? dtype : DType::kFloat32) {
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      std::vector<float> values(tensors[k].numel);
      for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
        values[i] = initial_value(static_cast<int>(k), i);
      }
      master_.push_back(values);
      states_.emplace_back(rule.state_count(), std::vector<float>(tensors[k].numel, 0.0f));
    }
  }

  /// One update; returns the global L2 norm of the averaged, unscaled gradient before clipping.
  /// The clip coefficient comes from `clip_norm` when given (the engine's norm, checked against
  /// the returned one separately), so that both runs multiply by the very same factor.
  double step(std::int64_t sample, const GradientFn& gradient, double loss_scale, double max_norm,
              std::optional<double> clip_norm = std::nullopt) {
    const double unscale = 1.0 / (static_cast<double>(world_) * loss_scale);
    const auto scale = static_cast<float>(loss_scale);
    std::vector<std::vector<float>> grads(tensors_.size());
    double squares = 0.0;
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      if (!tensors_[k].trainable) continue;
      grads[k].resize(tensors_[k].numel);
      for (std::int64_t i = 0; i < tensors_[k].numel; ++i) {
        const float model = round_to(dtype_, master_[k][i]);
        float sum = 0.0f;
        for (int r = 0; r < world_; ++r) {
          sum += round_to(dtype_, scale * gradient(model, static_cast<int>(k), i, r, sample));
        }
        grads[k][i] = round_to(sum_dtype_, sum);
        const double unscaled = grads[k][i] * unscale;
        squares += unscaled * unscaled;
      }
    }
    const double norm = std::sqrt(squares);
    // DeepSpeed's coefficient, applied only below 1; unscaling and clipping are one fp32 factor.
    const double coefficient = max_norm / (clip_norm.value_or(norm) + 1e-6);
    const bool clip = max_norm > 0.0 && coefficient < 1.0;
    const auto factor = static_cast<float>(unscale * (clip ? coefficient : 1.0));
    ++updates_;
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      if (!tensors_[k].trainable) continue;
      for (float& g : grads[k]) g *= factor;
      StepContext context;
      context.step = updates_;
      context.lr = rule_.default_lr();
      context.weight_decay = rule_.default_weight_decay();
      apply_whole(rule_, tensors_[k], master_[k].data(), grads[k].data(), states_[k], context);
    }
    return norm;
  }

  /// Trainable master values, whole and in registration order, as consolidated_parameters().
  std::vector<float> trainable_values() const { return trainable_concat(tensors_, master_); }

 private:
  std::vector<ToyTensor> tensors_;
  const UpdateRule& rule_;
  int world_;
  DType dtype_;
  DType sum_dtype_;
  std::int64_t updates_ = 0;
  std::vector<std::vector<float>> master_;
  std::vector<std::vector<std::vector<float>>> states_;
};

std::unique_ptr<UpdateRule> adamw() {
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return make_adamw(o);
}

// Adam hardly notices a gradient that is off by a constant factor; SGD moves by the gradient
// itself, so a wrong unscale, average or clip coefficient shows in the parameters.
std::unique_ptr<UpdateRule> sgd() {
  SgdOptions o;
  o.lr = 1e-2;
  o.momentum = 0.9;
  return make_sgd(o);
}

/// How gradients are kept: the model's 16-bit type, or bf16 with data_types.grad_accum_dtype
/// fp32 (an fp32 gradient shard at stages 2-3, an fp32 accumulator at stages 0-1).
enum class Precision { kFp32, kFp16, kBf16, kBf16Fp32Accum };

DType model_dtype_of(Precision precision) {
  switch (precision) {
    case Precision::kFp16:
      return DType::kFloat16;
    case Precision::kBf16:
    case Precision::kBf16Fp32Accum:
      return DType::kBFloat16;
    case Precision::kFp32:
      break;
  }
  return DType::kFloat32;
}

std::string name_of(Precision precision) {
  switch (precision) {
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
    case Precision::kBf16Fp32Accum:
      return "bf16_fp32accum";
    case Precision::kFp32:
      break;
  }
  return "fp32";
}

Config mixed_config(int stage, Precision precision) {
  Config config = toy_config(stage);
  config.fp16.enabled = precision == Precision::kFp16;
  // 2^8 keeps the scaled gradients (|g| * 2^8 <= 1024, sums of 16 <= 16384) below fp16's 65504.
  config.fp16.initial_scale_power = 8;
  config.bf16.enabled = precision == Precision::kBf16 || precision == Precision::kBf16Fp32Accum;
  if (precision == Precision::kBf16Fp32Accum) config.grad_accum_dtype = "fp32";
  return config;
}

/// Stage and 16-bit precision pairs.
using MixedCase = std::tuple<int, Precision>;
std::vector<MixedCase> mixed_cases() {
  std::vector<MixedCase> cases;
  for (int stage = 0; stage <= 3; ++stage) {
    for (Precision p : {Precision::kFp16, Precision::kBf16, Precision::kBf16Fp32Accum}) {
      cases.emplace_back(stage, p);
    }
  }
  return cases;
}

/// The same, and fp32 at every stage.
std::vector<MixedCase> all_precision_cases() {
  std::vector<MixedCase> cases = mixed_cases();
  for (int stage = 0; stage <= 3; ++stage) cases.emplace_back(stage, Precision::kFp32);
  return cases;
}

std::string case_name(const MixedCase& c) {
  return "stage" + std::to_string(std::get<0>(c)) + "_" + name_of(std::get<1>(c));
}

double relative_difference(double actual, double expected) {
  return std::fabs(actual - expected) / std::max(1e-12, std::fabs(expected));
}

double worst_relative_difference(const std::vector<float>& actual,
                                 const std::vector<float>& expected) {
  double worst = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double scale = std::max(1e-3, std::fabs(static_cast<double>(expected[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected[i]) / scale);
  }
  return worst;
}

// --- equivalence ---------------------------------------------------------------------------------

class MixedPrecisionEquivalence : public ::testing::TestWithParam<std::tuple<MixedCase, bool>> {};

// The engine reduces 16-bit gradients in their own type by default (communication_data_type
// null, as DeepSpeed): the communicator adds in fp32 and rounds every partial sum to 16 bits, so
// with three or more ranks the result depends on the order MPI adds in. Hence exact-sum gradients
// here; Fp32Communication below covers arbitrary ones.
TEST_P(MixedPrecisionEquivalence, MatchesAnUnshardedMixedPrecisionReferenceAfterTenSteps) {
  const int stage = std::get<0>(std::get<0>(GetParam()));
  const Precision precision = std::get<1>(std::get<0>(GetParam()));
  const bool use_sgd = std::get<1>(GetParam());
  const DType dtype = model_dtype_of(precision);
  Engine engine = make_engine(mixed_config(stage, precision), use_sgd ? sgd() : adamw());
  ASSERT_EQ(engine.model_dtype(), dtype);
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto reference_rule = use_sgd ? sgd() : adamw();
  MixedReference reference(tensors, *reference_rule, engine.world_size(), dtype);
  const GradientFn gradient = exact_sum_gradient(dtype);
  EXPECT_EQ(engine.loss_scale(), dtype == DType::kFloat16 ? 256.0 : 1.0);
  for (std::int64_t step = 0; step < 10; ++step) {
    const double scale = engine.loss_scale();
    micro_step(engine, tensors, handles, step, gradient);
    const StepResult result = engine.step();
    ASSERT_TRUE(result.updated);
    ASSERT_FALSE(result.skipped);
    const double norm = reference.step(step, gradient, scale, 0.0);
    // The norm is the one all-reduce of per-rank partial sums of squares, sent as fp32: within
    // a few fp32 roundings (~1e-7) of the reference's double sum; the loss scale must be out.
    EXPECT_LE(relative_difference(engine.global_grad_norm(), norm), 1e-6)
        << "step " << step << ": engine " << engine.global_grad_norm() << ", reference " << norm;
    EXPECT_EQ(result.grad_norm, engine.global_grad_norm());
  }
  EXPECT_EQ(engine.global_step(), 10);
  // Tolerance: none. Every per-rank gradient and every partial sum is exact in the 16-bit type
  // (see exact_grid_bits), so the engine's 16-bit reduction yields the reference's sum in any
  // order; both multiply it by the same fp32 factor and run the same element-wise rule on the
  // same fp32 masters, and the model copy is the same rounding of them. Any difference is a bug
  // in sharding, conversion, unscaling or averaging, not rounding noise.
  const std::vector<float> actual = engine.consolidated_parameters();
  const std::vector<float> expected = reference.trainable_values();
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_EQ(worst_relative_difference(actual, expected), 0.0)
      << name_of(precision) << " stage " << stage << " world " << engine.world_size();
  // The model's 16-bit copy is the rounded master everywhere, on every rank.
  std::vector<float> model_values;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    auto guard = engine.gathered(handles[k].module());
    const std::vector<float> values =
        model_floats_to_host(engine, handles[k].raw_data(), tensors[k].numel);
    model_values.insert(model_values.end(), values.begin(), values.end());
  }
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(model_values[i], round_to(dtype, expected[i])) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, MixedPrecisionEquivalence,
                         ::testing::Combine(::testing::ValuesIn(mixed_cases()), ::testing::Bool()),
                         [](const auto& info) {
                           return case_name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sgd" : "_adamw");
                         });

// --- communication_data_type fp32 ----------------------------------------------------------------

class Fp32Communication : public ::testing::TestWithParam<MixedCase> {};

TEST_P(Fp32Communication, RoundsTheSumOnceSoAnyGradientsMatchTheReference) {
  const int stage = std::get<0>(GetParam());
  const Precision precision = std::get<1>(GetParam());
  const DType dtype = model_dtype_of(precision);
  Config config = mixed_config(stage, precision);
  config.communication_data_type = "fp32";
  Engine engine = make_engine(config, adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto reference_rule = adamw();
  // An fp32 gradient shard keeps the fp32 sum as it is; every other buffer is 16-bit.
  MixedReference reference(tensors, *reference_rule, engine.world_size(), dtype,
                           /*round_sum=*/precision != Precision::kBf16Fp32Accum);
  // The toy_model grid (2^-10): per-rank values are rounded to 16 bits for real, but four of
  // them, even times fp16's loss scale 2^8, sum exactly in fp32 (at most 15 significant bits),
  // in any order. The engine then rounds the sum once, as the reference does: tolerance none.
  const GradientFn gradient = grid_gradient(10);
  for (std::int64_t step = 0; step < 10; ++step) {
    const double scale = engine.loss_scale();
    engine.communicator().reset_traffic();
    micro_step(engine, tensors, handles, step, gradient);
    ASSERT_TRUE(engine.step().updated);
    reference.step(step, gradient, scale, 0.0);
    const TrafficCounters& traffic = engine.communicator().traffic();
    // Stage 0 reduce-scatters as stages 1-3 do, except on one rank, where it all-reduces.
    const bool all_reduces = stage == 0 && engine.world_size() == 1;
    const int reduction =
        static_cast<int>(all_reduces ? Collective::kAllReduce : Collective::kReduceScatter);
    EXPECT_EQ(traffic.bytes[reduction], 4 * traffic.elements[reduction]) << "sent as fp32";
  }
  const std::vector<float> actual = engine.consolidated_parameters();
  const std::vector<float> expected = reference.trainable_values();
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_EQ(worst_relative_difference(actual, expected), 0.0)
      << name_of(precision) << " stage " << stage << " world " << engine.world_size();
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, Fp32Communication, ::testing::ValuesIn(mixed_cases()),
                         [](const auto& info) { return case_name(info.param); });

class GradientPredivide : public ::testing::TestWithParam<std::tuple<MixedCase, bool>> {};

TEST_P(GradientPredivide, APowerOfTwoFactorChangesNothing) {
  const int stage = std::get<0>(std::get<0>(GetParam()));
  const Precision precision = std::get<1>(std::get<0>(GetParam()));
  const bool fp32_communication = std::get<1>(GetParam());
  const DType dtype = model_dtype_of(precision);
  Config config = mixed_config(stage, precision);
  if (fp32_communication) config.communication_data_type = "fp32";
  // Halving before the reduction and making up for it after are exact in every type, so the
  // run must equal the reference without the factor, whether the division acts on the 16-bit
  // gradients or on their fp32 widening.
  config.gradient_predivide_factor = 2.0;
  Engine engine = make_engine(config, sgd());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto reference_rule = sgd();
  MixedReference reference(tensors, *reference_rule, engine.world_size(), dtype,
                           !(fp32_communication && precision == Precision::kBf16Fp32Accum));
  const GradientFn gradient = exact_sum_gradient(dtype);
  for (std::int64_t step = 0; step < 5; ++step) {
    const double scale = engine.loss_scale();
    micro_step(engine, tensors, handles, step, gradient);
    ASSERT_TRUE(engine.step().updated);
    reference.step(step, gradient, scale, 0.0);
  }
  EXPECT_EQ(
      worst_relative_difference(engine.consolidated_parameters(), reference.trainable_values()),
      0.0)
      << case_name(std::get<0>(GetParam())) << " world " << engine.world_size();
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, GradientPredivide,
                         ::testing::Combine(::testing::ValuesIn(all_precision_cases()),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return case_name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_fp32comm" : "");
                         });

TEST(MixedPrecisionConfig, RejectsGradientTypesTheEngineCannotHonour) {
  auto key_of_error = [](int stage, bool bf16, const std::string& comm,
                         const std::string& accum) -> std::string {
    Config config = toy_config(stage);
    config.bf16.enabled = bf16;
    config.communication_data_type = comm;
    config.grad_accum_dtype = accum;
    try {
      Engine engine = make_engine(config, adamw());
    } catch (const ConfigError& error) {
      return error.key_path();
    }
    return "";
  };
  EXPECT_EQ(key_of_error(1, true, "", "fp32"), "");
  EXPECT_EQ(key_of_error(0, true, "fp32", "fp32"), "");
  EXPECT_EQ(key_of_error(1, true, "bf16", "fp32"), "communication_data_type")
      << "stages 0-1 reduce the fp32 sums of their fp32 accumulator as they are";
  EXPECT_EQ(key_of_error(2, true, "", "fp16"), "data_types.grad_accum_dtype");
  EXPECT_EQ(key_of_error(2, true, "fp16", ""), "communication_data_type");
  EXPECT_EQ(key_of_error(0, false, "bf16", ""), "communication_data_type")
      << "fp32 gradients are not compressed to 16 bits";
  EXPECT_EQ(key_of_error(2, true, "bf16", "bf16"), "");
  EXPECT_EQ(key_of_error(2, true, "fp32", "fp32"), "");
  EXPECT_EQ(key_of_error(0, false, "fp32", "fp32"), "");
}

// --- fp16 overflow -------------------------------------------------------------------------------

class Fp16Overflow : public ::testing::TestWithParam<int> {};

TEST_P(Fp16Overflow, SkipsTheStepOnEveryRankLeavingEverythingAndHalvesTheScale) {
  const int stage = GetParam();
  Config config = mixed_config(stage, Precision::kFp16);
  config.fp16.hysteresis = 1;
  Engine engine = make_engine(config, adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto reference_rule = adamw();
  MixedReference reference(tensors, *reference_rule, engine.world_size(), DType::kFloat16);
  const GradientFn clean = exact_sum_gradient(DType::kFloat16);
  constexpr std::int64_t kOverflowStep = 3;
  const GradientFn gradient = planted(clean, engine.world_size() - 1, kOverflowStep,
                                      std::numeric_limits<float>::infinity());
  for (std::int64_t step = 0; step < kOverflowStep; ++step) {
    const double scale = engine.loss_scale();
    micro_step(engine, tensors, handles, step, gradient);
    ASSERT_TRUE(engine.step().updated);
    reference.step(step, gradient, scale, 0.0);
  }
  const std::vector<float> master_before = engine.consolidated_parameters();
  const std::vector<char> model_before = model_bytes(engine, tensors, handles);
  const double scale_before = engine.loss_scale();

  micro_step(engine, tensors, handles, kOverflowStep, gradient);
  const StepResult skipped = engine.step();
  EXPECT_TRUE(skipped.skipped) << "rank " << engine.rank() << " did not skip";
  EXPECT_FALSE(skipped.updated);
  EXPECT_EQ(engine.global_step(), kOverflowStep);
  EXPECT_EQ(engine.loss_scale(), scale_before / 2) << "hysteresis 1: the first overflow halves";
  const std::vector<float> master_after = engine.consolidated_parameters();
  ASSERT_EQ(master_after.size(), master_before.size());
  EXPECT_EQ(
      std::memcmp(master_after.data(), master_before.data(), master_before.size() * sizeof(float)),
      0)
      << "the fp32 master weights changed on a skipped step";
  EXPECT_EQ(model_bytes(engine, tensors, handles), model_before)
      << "the fp16 model weights changed on a skipped step";

  // The next clean step updates from the untouched masters and optimizer states, as if the
  // skipped step had never been taken (the reference never sees it).
  const double scale = engine.loss_scale();
  micro_step(engine, tensors, handles, kOverflowStep + 1, gradient);
  const StepResult next = engine.step();
  EXPECT_TRUE(next.updated);
  EXPECT_FALSE(next.skipped);
  EXPECT_EQ(engine.global_step(), kOverflowStep + 1);
  reference.step(kOverflowStep + 1, gradient, scale, 0.0);
  EXPECT_EQ(
      worst_relative_difference(engine.consolidated_parameters(), reference.trainable_values()),
      0.0);
}

TEST_P(Fp16Overflow, LowersTheScaleOnlyAfterHysteresisOverflows) {
  const int stage = GetParam();
  Config config = mixed_config(stage, Precision::kFp16);
  config.fp16.hysteresis = 2;
  Engine engine = make_engine(config, adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const GradientFn clean = exact_sum_gradient(DType::kFloat16);
  // NaN on the last rank at samples 1 and 2: the first costs one hysteresis, the second halves.
  const GradientFn gradient =
      planted(planted(clean, engine.world_size() - 1, 1, std::nanf("")), engine.world_size() - 1, 2,
              -std::numeric_limits<float>::infinity());
  const std::vector<double> expected_scales = {256, 256, 128, 128};
  const std::vector<bool> expected_skips = {false, true, true, false};
  for (std::int64_t step = 0; step < 4; ++step) {
    micro_step(engine, tensors, handles, step, gradient);
    const StepResult result = engine.step();
    EXPECT_EQ(result.skipped, expected_skips[step]) << "step " << step;
    EXPECT_EQ(engine.loss_scale(), expected_scales[step]) << "step " << step;
  }
  EXPECT_EQ(engine.global_step(), 2);
}

TEST_P(Fp16Overflow, RaisesTheScaleAfterAWindowOfCleanStepsWithoutChangingTheResult) {
  const int stage = GetParam();
  Config config = mixed_config(stage, Precision::kFp16);
  config.fp16.loss_scale_window = 2;
  Engine engine = make_engine(config, sgd());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto reference_rule = sgd();
  MixedReference reference(tensors, *reference_rule, engine.world_size(), DType::kFloat16);
  const GradientFn gradient = exact_sum_gradient(DType::kFloat16);
  // DeepSpeed doubles once (cur_iter - last_overflow_iter - 1) is a positive multiple of the
  // window: after the 3rd and the 5th clean step here.
  const std::vector<double> expected_scales = {256, 256, 512, 512, 1024};
  for (std::int64_t step = 0; step < 5; ++step) {
    const double scale = engine.loss_scale();
    micro_step(engine, tensors, handles, step, gradient);
    ASSERT_TRUE(engine.step().updated);
    reference.step(step, gradient, scale, 0.0);
    EXPECT_EQ(engine.loss_scale(), expected_scales[step]) << "step " << step;
  }
  // Scales are powers of two and the scaled gradients stay far below fp16's range, so the
  // changing scale must not change a bit of the result.
  EXPECT_EQ(
      worst_relative_difference(engine.consolidated_parameters(), reference.trainable_values()),
      0.0);
}

INSTANTIATE_TEST_SUITE_P(Stages, Fp16Overflow, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// --- NaN without loss scaling --------------------------------------------------------------------

class NonFiniteGradient : public ::testing::TestWithParam<std::tuple<int, Precision>> {};

TEST_P(NonFiniteGradient, StopsTheUpdateOnEveryRankNamingTheParameterAndChangesNothing) {
  const int stage = std::get<0>(GetParam());
  const Precision precision = std::get<1>(GetParam());
  Engine engine = make_engine(mixed_config(stage, precision), adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const int culprit = engine.world_size() - 1;
  const GradientFn gradient = planted(exact_sum_gradient(model_dtype_of(precision)), culprit,
                                      /*sample=*/1, std::nanf(""));
  micro_step(engine, tensors, handles, 0, gradient);
  ASSERT_TRUE(engine.step().updated);
  const std::vector<float> before = engine.consolidated_parameters();
  const std::vector<char> model_before = model_bytes(engine, tensors, handles);

  micro_step(engine, tensors, handles, 1, gradient);
  if (precision == Precision::kBf16) {
    // bf16.check_grad_overflow (default true): every rank skips the step, as DeepSpeed does.
    EXPECT_TRUE(engine.step().skipped);
  } else {
    std::string message;
    try {
      engine.step();
    } catch (const UsageError& error) {
      message = error.what();
    }
    ASSERT_FALSE(message.empty()) << "rank " << engine.rank() << " did not throw";
    EXPECT_NE(message.find("non-finite gradient"), std::string::npos) << message;
    EXPECT_NE(message.find("'b.weight'"), std::string::npos)
        << "rank " << engine.rank() << ": " << message;
  }
  EXPECT_EQ(engine.global_step(), 1);
  const std::vector<float> after = engine.consolidated_parameters();
  EXPECT_EQ(std::memcmp(after.data(), before.data(), before.size() * sizeof(float)), 0);
  EXPECT_EQ(model_bytes(engine, tensors, handles), model_before);

  // The gradients were dropped with the step: training goes on with the next batch.
  micro_step(engine, tensors, handles, 2, exact_sum_gradient(model_dtype_of(precision)));
  EXPECT_TRUE(engine.step().updated);
  EXPECT_EQ(engine.global_step(), 2);
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, NonFiniteGradient,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_" +
                                  name_of(std::get<1>(info.param));
                         });

// --- clipping ------------------------------------------------------------------------------------

class GradientClipping : public ::testing::TestWithParam<MixedCase> {};

TEST_P(GradientClipping, ShardedNormEqualsTheUnshardedNormAndClippedRunsMatch) {
  const int stage = std::get<0>(GetParam());
  const Precision precision = std::get<1>(GetParam());
  const DType dtype = model_dtype_of(precision);
  Config config = mixed_config(stage, precision);
  // The toy gradients' norm stays above 1.5 over these steps: every step is clipped.
  config.gradient_clipping = 0.5;
  Engine engine = make_engine(config, sgd());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto reference_rule = sgd();
  // `independent` clips with its own norm; `mirrored` with the engine's, so that its clip factor
  // is the engine's to the bit and the runs must agree exactly.
  MixedReference independent(tensors, *reference_rule, engine.world_size(), dtype);
  MixedReference mirrored(tensors, *reference_rule, engine.world_size(), dtype);
  const GradientFn gradient = exact_sum_gradient(dtype);
  for (std::int64_t step = 0; step < 10; ++step) {
    const double scale = engine.loss_scale();
    micro_step(engine, tensors, handles, step, gradient);
    const StepResult result = engine.step();
    ASSERT_TRUE(result.updated);
    const double norm = independent.step(step, gradient, scale, config.gradient_clipping);
    mirrored.step(step, gradient, scale, config.gradient_clipping, result.grad_norm);
    ASSERT_GT(norm, config.gradient_clipping) << "the test means to clip";
    // Per-rank sums of squares in double, all-reduced as fp32: a few fp32 roundings (~1e-7).
    EXPECT_LE(relative_difference(engine.global_grad_norm(), norm), 1e-6)
        << "step " << step << ": engine " << engine.global_grad_norm() << ", reference " << norm;
  }
  const std::vector<float> actual = engine.consolidated_parameters();
  EXPECT_EQ(worst_relative_difference(actual, mirrored.trainable_values()), 0.0)
      << case_name(GetParam()) << " world " << engine.world_size();
  // With the reference's own norm the clip factors differ by ~1e-7 relative, and so do the
  // updates. (16-bit runs are left out: a master weight that moves by an ulp may round to another
  // 16-bit value, and the gradient computed from it may land on another grid point.)
  if (dtype == DType::kFloat32) {
    EXPECT_LE(worst_relative_difference(actual, independent.trainable_values()), 1e-6)
        << "stage " << stage << " world " << engine.world_size();
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, GradientClipping,
                         ::testing::ValuesIn(all_precision_cases()),
                         [](const auto& info) { return case_name(info.param); });

// --- gradient accumulation -----------------------------------------------------------------------

class GradientAccumulation : public ::testing::TestWithParam<MixedCase> {};

TEST_P(GradientAccumulation, FourMicroStepsOfBatchBEqualOneStepOfBatchFourB) {
  const int stage = std::get<0>(GetParam());
  const Precision precision = std::get<1>(GetParam());
  constexpr int kMicroSteps = 4;
  Config accumulating = mixed_config(stage, precision);
  accumulating.gradient_accumulation_steps = kMicroSteps;
  Engine micro = make_engine(accumulating, sgd());
  Engine whole = make_engine(mixed_config(stage, precision), sgd());
  const auto tensors = uneven_toy_tensors();
  const auto micro_handles = register_toy(micro, tensors);
  const auto whole_handles = register_toy(whole, tensors);
  // Sums over four ranks and four micro-steps stay exact in the model's type (16-bit runs
  // accumulate in 16-bit buffers), so both runs see the same sums; the mean of four samples is
  // on a grid four times finer, and its sums over four ranks are exact too.
  const GradientFn sample_gradient =
      grid_gradient(exact_grid_bits(model_dtype_of(precision), 4 * kMicroSteps));
  for (std::int64_t step = 0; step < 3; ++step) {
    for (int m = 0; m < kMicroSteps; ++m) {
      EXPECT_EQ(micro.is_gradient_accumulation_boundary(), m == kMicroSteps - 1);
      micro_step(micro, tensors, micro_handles, step * kMicroSteps + m, sample_gradient);
      const StepResult result = micro.step();
      EXPECT_EQ(result.updated, m == kMicroSteps - 1) << "step " << step << " micro-step " << m;
      EXPECT_FALSE(result.skipped);
    }
    // A batch of 4b: the loss is the mean over its samples, so its gradient is the mean of the
    // four micro-batches' gradients.
    const GradientFn batch_gradient = [&](float param, int tensor, std::int64_t i, int rank,
                                          std::int64_t s) {
      float sum = 0.0f;
      for (int m = 0; m < kMicroSteps; ++m) {
        sum += sample_gradient(param, tensor, i, rank, s * kMicroSteps + m);
      }
      return sum / kMicroSteps;
    };
    micro_step(whole, tensors, whole_handles, step, batch_gradient);
    ASSERT_TRUE(whole.step().updated);
  }
  EXPECT_EQ(micro.global_step(), 3);
  EXPECT_EQ(whole.global_step(), 3);
  EXPECT_LE(relative_difference(micro.global_grad_norm(), whole.global_grad_norm()), 1e-6);
  const double worst =
      worst_relative_difference(micro.consolidated_parameters(), whole.consolidated_parameters());
  EXPECT_LE(worst, 1e-6) << case_name(GetParam()) << " world " << micro.world_size();
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, GradientAccumulation,
                         ::testing::ValuesIn(all_precision_cases()),
                         [](const auto& info) { return case_name(info.param); });

// --- memory --------------------------------------------------------------------------------------

// Multiples of 16 elements summing to a multiple of 16 x {1,2,3,4}: no padding, so the formulas
// hold exactly (as in engine_memory_test).
std::vector<ToyTensor> aligned_tensors() {
  return {{"a.weight", 160}, {"a.bias", 32}, {"b.weight", 160}, {"b.bias", 32}};
}
constexpr std::int64_t kP = 384;

class MixedPrecisionMemory : public ::testing::TestWithParam<MixedCase> {};

TEST_P(MixedPrecisionMemory, ModelStateBytesMatchTheZeroFormulas) {
  const int stage = std::get<0>(GetParam());
  const Precision precision = std::get<1>(GetParam());
  Config config = mixed_config(stage, precision);
  config.zero_optimization.param_persistence_threshold = 0;
  config.zero_optimization.max_reuse_distance = 0;
  config.zero_optimization.reduce_bucket_size = 200;
  AdamWOptions options;
  options.lr = 1e-3;
  Engine engine = make_engine(config, make_adamw(options));
  const auto tensors = aligned_tensors();
  const auto handles = register_toy(engine, tensors);
  ASSERT_EQ(engine.padded_numel(), kP);
  const std::int64_t n = engine.world_size();
  // The ZeRO paper's mixed-precision Adam: 2 bytes of 16-bit parameters, 2 of 16-bit gradients
  // (4 with an fp32 accumulation shard, 2 + 4 with the whole gradients' fp32 accumulator), 4 of
  // fp32 master weights and 8 of Adam states per element, each divided by N from the stage that
  // partitions it.
  const std::int64_t grad_bytes = precision == Precision::kBf16Fp32Accum ? 4 : 2;
  const std::int64_t params = stage <= 2 ? 2 * kP : 2 * kP / n;
  const std::int64_t grads = stage <= 1 ? (grad_bytes == 4 ? 2 + 4 : 2) * kP : grad_bytes * kP / n;
  const std::int64_t master = stage == 0 ? 4 * kP : 4 * kP / n;
  const std::int64_t states = stage == 0 ? 8 * kP : 8 * kP / n;
  if (grad_bytes == 2) {
    const std::int64_t paper[] = {16 * kP, 4 * kP + 12 * kP / n, 2 * kP + 14 * kP / n, 16 * kP / n};
    ASSERT_EQ(params + grads + master + states, paper[stage]);
  }
  const GradientFn gradient = exact_sum_gradient(model_dtype_of(precision));
  const MemoryLocation where = engine_memory(engine);
  for (std::int64_t step = 0; step < 2; ++step) {
    micro_step(engine, tensors, handles, step, gradient);
    ASSERT_TRUE(engine.step().updated);
    const MemoryReport report = engine.memory_report();
    EXPECT_EQ(report.at(MemoryCategory::kParameters, where).current, params);
    EXPECT_EQ(report.at(MemoryCategory::kGradients, where).current, grads);
    EXPECT_EQ(report.at(MemoryCategory::kMasterWeights, where).current, master);
    EXPECT_EQ(report.at(MemoryCategory::kOptimizerStates, where).current, states);
    EXPECT_EQ(report.model_state_bytes(where), params + grads + master + states);
  }
  // Outside the model states, and bounded: at most two buckets in flight, each an input area
  // (stages 2-3) and a receive area of at most one bucket (stage 0 too on several ranks), in the
  // model's type; plus the fp32 chunk 16-bit gradients are widened in, at most 2^16 elements
  // (2^25 on a GPU) and never more than the elements this rank updates.
  const std::int64_t bucket = 200;
  const bool receives = stage >= 1 || n > 1;
  const std::int64_t per_slot = (stage >= 2 ? bucket : 0) + (receives ? bucket : 0);
  const std::int64_t owned = stage == 0 ? kP : kP / n;
  const std::int64_t widening =
      std::min<std::int64_t>(owned, engine.device().is_cuda() ? 1 << 25 : 1 << 16) * 4;
  EXPECT_LE(engine.memory_report().at(MemoryCategory::kCommunication, where).peak,
            2 * per_slot * 2 + widening + backend_workspace_allowance(engine));
}

INSTANTIATE_TEST_SUITE_P(StagesAndPrecisions, MixedPrecisionMemory,
                         ::testing::ValuesIn(mixed_cases()),
                         [](const auto& info) { return case_name(info.param); });

// --- grad_accum_dtype fp32 at stages 0-1 (DeepSpeed's BF16_Optimizer) ----------------------------

constexpr int kWindow = 3;  // micro-steps per accumulation window

// The ranks' gradients are small integers times 2^4, 2^0 and 2^-4 in a window's three
// micro-steps: every micro-step's sum over up to four ranks is exact in bf16, so stage 2 reduces
// each exactly, but a window's sum, on one rank or over the ranks, needs up to 12 significant
// bits: fp32 keeps them, a bf16 accumulation rounds them away.
float window_spanning_gradient(float /*param*/, int tensor, std::int64_t i, int rank,
                               std::int64_t sample) {
  constexpr int kExponent[kWindow] = {4, 0, -4};
  const auto small = static_cast<int>((7 * i + 3 * tensor + 5 * rank + sample) % 5) - 2;
  return static_cast<float>(std::ldexp(small, kExponent[sample % kWindow]));
}

struct AccumulatedRun {
  std::vector<float> master;
  std::vector<double> norms;
};

AccumulatedRun train_windows(Config config) {
  config.gradient_accumulation_steps = kWindow;
  Engine engine = make_engine(config, sgd());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  AccumulatedRun run;
  for (std::int64_t window = 0; window < 3; ++window) {
    for (int m = 0; m < kWindow; ++m) {
      micro_step(engine, tensors, handles, window * kWindow + m, window_spanning_gradient);
      const StepResult result = engine.step();
      EXPECT_EQ(result.updated, m == kWindow - 1) << "window " << window << " micro-step " << m;
    }
    run.norms.push_back(engine.global_grad_norm());
  }
  run.master = engine.consolidated_parameters();
  return run;
}

class Fp32AccumulationAtStagesZeroAndOne : public ::testing::TestWithParam<std::tuple<int, bool>> {
};

TEST_P(Fp32AccumulationAtStagesZeroAndOne, EqualsStageTwosFp32GradientShardBitForBit) {
  const int stage = std::get<0>(GetParam());
  const bool fp32_communication = std::get<1>(GetParam());
  Config config = mixed_config(stage, Precision::kBf16Fp32Accum);
  if (fp32_communication) config.communication_data_type = "fp32";
  Config stage2 = config;
  stage2.zero_optimization.stage = 2;
  const AccumulatedRun expected = train_windows(stage2);
  const AccumulatedRun actual = train_windows(config);
  EXPECT_EQ(actual.norms, expected.norms);
  ASSERT_EQ(actual.master.size(), expected.master.size());
  EXPECT_EQ(std::memcmp(actual.master.data(), expected.master.data(),
                        actual.master.size() * sizeof(float)),
            0)
      << "fp32 master weights differ";
  // The gradients tell the two accumulations apart: bf16 accumulation at the same stage trains
  // otherwise.
  const AccumulatedRun in_bf16 = train_windows(mixed_config(stage, Precision::kBf16));
  EXPECT_NE(in_bf16.master, expected.master);
}

INSTANTIATE_TEST_SUITE_P(Stages, Fp32AccumulationAtStagesZeroAndOne,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Bool()),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_fp32comm" : "");
                         });

// The accumulator is counted under gradients by the memory report and predicted by the estimator
// (zeroshard-estimate's formulas), to the byte, with the toy's padded layout.
TEST(Fp32AccumulationMemory, AccumulatorIsReportedAndEstimated) {
  for (int stage : {0, 1}) {
    for (Precision precision : {Precision::kBf16, Precision::kBf16Fp32Accum}) {
      SCOPED_TRACE(case_name({stage, precision}));
      const Config config = mixed_config(stage, precision);
      Engine engine = make_engine(config, adamw());
      const auto tensors = uneven_toy_tensors();
      const auto handles = register_toy(engine, tensors);
      micro_step(engine, tensors, handles, 0, exact_sum_gradient(DType::kBFloat16));
      ASSERT_TRUE(engine.step().updated);
      const std::int64_t padded = engine.padded_numel();
      const std::int64_t expected = (precision == Precision::kBf16Fp32Accum ? 2 + 4 : 2) * padded;
      const MemoryLocation where = engine_memory(engine);
      EXPECT_EQ(engine.memory_report().at(MemoryCategory::kGradients, where).current, expected);
      EstimateInput in = estimate_input_from_config(config, 0, engine.world_size());
      for (const ToyTensor& t : tensors) {
        if (t.trainable) in.tensors.push_back(t.numel);
      }
      in.frozen_params = 15;
      const MemoryEstimate estimate_of_config = estimate(in);
      ASSERT_TRUE(estimate_of_config.valid) << estimate_of_config.reason;
      EXPECT_EQ(estimate_of_config.at(MemoryCategory::kGradients, MemoryTier::kDevice), expected);
    }
  }
}

}  // namespace
}  // namespace zeroshard::testing
