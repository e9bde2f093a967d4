// The built-in update rules against plain double-precision references written from the PyTorch
// docs' algorithms, their fused entry point against apply() in separate passes, plus their
// validation and the config-to-rule mapping.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "optim/builtin_rule.h"
#include "precision/half_conversion.h"
#include "zeroshard/config.h"
#include "zeroshard/dtype.h"
#include "zeroshard/error.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;

// Not a multiple of 8 (nor of any vector width), so every slice has a scalar remainder.
constexpr std::int64_t kNumel = 1003;
// Slice boundaries inside the tensor: tiny, odd and large slices, as a shard cut produces.
const std::vector<std::int64_t> kCuts = {0, 1, 8, 261, 262, 777, kNumel};
constexpr int kSteps = 10;

/// One element's update in double: p, its gradient, its states, the 1-based step, lr, weight
/// decay.
using ReferenceStep = std::function<void(double& p, double g, std::span<double> states,
                                         std::int64_t step, double lr, double weight_decay)>;

/// A tensor and its states in fp32, as the engine holds a shard.
struct Fp32Tensor {
  std::vector<float> param;
  std::vector<std::vector<float>> states;

  Fp32Tensor(const std::vector<float>& initial, int state_count)
      : param(initial), states(state_count, std::vector<float>(initial.size(), 0.0f)) {}

  /// Applies `rule` to the elements [begin, end) as one slice.
  void apply(const UpdateRule& rule, const std::vector<float>& grad, std::int64_t begin,
             std::int64_t end, const StepContext& context) {
    std::vector<float*> state_ptrs;
    for (auto& state : states) state_ptrs.push_back(state.data() + begin);
    const ShardSlice slice{.param_name = "w",
                           .param_numel = static_cast<std::int64_t>(param.size()),
                           .offset_in_param = begin,
                           .size = end - begin,
                           .param = param.data() + begin,
                           .grad = grad.data() + begin,
                           .states = state_ptrs};
    rule.apply(slice, context);
  }
};

std::vector<float> random_values(std::mt19937& rng, std::int64_t n, float low, float high) {
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& value : values) value = dist(rng);
  return values;
}

StepContext context_at(std::int64_t step, double lr, double weight_decay) {
  StepContext context;
  context.step = step;
  context.lr = lr;
  context.weight_decay = weight_decay;
  return context;
}

/// Runs kSteps updates on random data three ways: the rule over several slices, the rule over the
/// whole tensor as one slice, and the reference in double. Slicing must not change a single bit;
/// the fp32 result must agree with the reference to 1e-6 relative to the parameters' scale (1).
void expect_matches_reference(const UpdateRule& rule, const ReferenceStep& reference, double lr,
                              double weight_decay) {
  std::mt19937 rng(1234);
  const std::vector<float> initial = random_values(rng, kNumel, -1.0f, 1.0f);
  Fp32Tensor sliced(initial, rule.state_count());
  Fp32Tensor whole(initial, rule.state_count());
  std::vector<double> ref_param(initial.begin(), initial.end());
  std::vector<std::vector<double>> ref_states(kNumel, std::vector<double>(rule.state_count(), 0.0));

  for (std::int64_t step = 1; step <= kSteps; ++step) {
    const std::vector<float> grad = random_values(rng, kNumel, -1.0f, 1.0f);
    const StepContext context = context_at(step, lr, weight_decay);
    for (std::size_t cut = 0; cut + 1 < kCuts.size(); ++cut) {
      sliced.apply(rule, grad, kCuts[cut], kCuts[cut + 1], context);
    }
    whole.apply(rule, grad, 0, kNumel, context);
    for (std::int64_t i = 0; i < kNumel; ++i) {
      reference(ref_param[i], grad[i], ref_states[i], step, lr, weight_decay);
    }
  }

  EXPECT_EQ(sliced.param, whole.param) << rule.name() << ": slicing changed the parameters";
  EXPECT_EQ(sliced.states, whole.states) << rule.name() << ": slicing changed the states";
  for (std::int64_t i = 0; i < kNumel; ++i) {
    ASSERT_NEAR(sliced.param[i], ref_param[i], 1e-6 * std::max(1.0, std::abs(ref_param[i])))
        << rule.name() << " element " << i;
  }
  // The update must have moved the parameters, or the comparison proves nothing.
  EXPECT_GT(std::abs(ref_param[0] - initial[0]), 1e-4);
}

// --- References, from the pseudo-code in the PyTorch docs (torch.optim.*) -----------------------

ReferenceStep adam_reference(double beta1, double beta2, double eps, bool amsgrad, bool decoupled) {
  return [=](double& p, double g, std::span<double> s, std::int64_t t, double lr, double wd) {
    if (decoupled) {
      p *= 1.0 - lr * wd;
    } else {
      g += wd * p;
    }
    double& m = s[0];
    double& v = s[1];
    m = beta1 * m + (1.0 - beta1) * g;
    v = beta2 * v + (1.0 - beta2) * g * g;
    const double m_hat = m / (1.0 - std::pow(beta1, static_cast<double>(t)));
    double v_used = v;
    if (amsgrad) {
      s[2] = std::max(s[2], v);
      v_used = s[2];
    }
    const double v_hat = v_used / (1.0 - std::pow(beta2, static_cast<double>(t)));
    p -= lr * m_hat / (std::sqrt(v_hat) + eps);
  };
}

ReferenceStep sgd_reference(double momentum, double dampening, bool nesterov) {
  return [=](double& p, double g, std::span<double> s, std::int64_t t, double lr, double wd) {
    g += wd * p;
    if (momentum != 0.0) {
      double& buf = s[0];
      buf = t == 1 ? g : momentum * buf + (1.0 - dampening) * g;
      g = nesterov ? g + momentum * buf : buf;
    }
    p -= lr * g;
  };
}

ReferenceStep lion_reference(double beta1, double beta2) {
  return [=](double& p, double g, std::span<double> s, std::int64_t, double lr, double wd) {
    double& m = s[0];
    const double c = beta1 * m + (1.0 - beta1) * g;
    p *= 1.0 - lr * wd;
    p -= lr * static_cast<double>((c > 0.0) - (c < 0.0));
    m = beta2 * m + (1.0 - beta2) * g;
  };
}

ReferenceStep adagrad_reference(double lr_decay, double initial_accumulator_value, double eps) {
  return [=](double& p, double g, std::span<double> s, std::int64_t t, double lr, double wd) {
    g += wd * p;
    const double clr = lr / (1.0 + static_cast<double>(t - 1) * lr_decay);
    double& sum = s[0];
    if (t == 1) sum = initial_accumulator_value;
    sum += g * g;
    p -= clr * g / (std::sqrt(sum) + eps);
  };
}

// --- Each rule against its reference ------------------------------------------------------------

TEST(AdamW, MatchesReferenceOverTenStepsInSlices) {
  AdamWOptions options;
  options.beta1 = 0.8;
  options.beta2 = 0.95;
  expect_matches_reference(*make_adamw(options), adam_reference(0.8, 0.95, 1e-8, false, true), 1e-2,
                           0.1);
}

TEST(AdamW, WithAmsgradMatchesReferenceAndKeepsThreeStates) {
  AdamWOptions options;
  options.amsgrad = true;
  const auto rule = make_adamw(options);
  EXPECT_EQ(rule->state_count(), 3);
  expect_matches_reference(*rule, adam_reference(0.9, 0.999, 1e-8, true, true), 1e-2, 0.1);
}

TEST(Adam, MatchesReferenceOverTenStepsInSlices) {
  expect_matches_reference(*make_adam(), adam_reference(0.9, 0.999, 1e-8, false, false), 1e-2, 0.1);
}

TEST(Adam, WithAmsgradMatchesReference) {
  AdamOptions options;
  options.amsgrad = true;
  options.eps = 1e-3;
  expect_matches_reference(*make_adam(options), adam_reference(0.9, 0.999, 1e-3, true, false), 1e-2,
                           0.05);
}

TEST(Sgd, WithoutMomentumMatchesReferenceAndKeepsNoState) {
  const auto rule = make_sgd();
  EXPECT_EQ(rule->state_count(), 0);
  expect_matches_reference(*rule, sgd_reference(0.0, 0.0, false), 0.1, 0.01);
}

TEST(Sgd, WithMomentumAndDampeningMatchesReference) {
  SgdOptions options;
  options.momentum = 0.9;
  options.dampening = 0.3;
  const auto rule = make_sgd(options);
  EXPECT_EQ(rule->state_count(), 1);
  expect_matches_reference(*rule, sgd_reference(0.9, 0.3, false), 0.1, 0.01);
}

TEST(Sgd, WithNesterovMatchesReference) {
  SgdOptions options;
  options.momentum = 0.9;
  options.nesterov = true;
  expect_matches_reference(*make_sgd(options), sgd_reference(0.9, 0.0, true), 0.05, 0.01);
}

TEST(Lion, MatchesReferenceOverTenStepsInSlices) {
  expect_matches_reference(*make_lion(), lion_reference(0.9, 0.99), 1e-3, 0.1);
}

TEST(Adagrad, MatchesReferenceOverTenStepsInSlices) {
  AdagradOptions options;
  options.lr_decay = 0.05;
  options.initial_accumulator_value = 0.1;
  expect_matches_reference(*make_adagrad(options), adagrad_reference(0.05, 0.1, 1e-10), 0.1, 0.01);
}

// --- The fused entry point ----------------------------------------------------------------------

/// Every built-in rule variant, built with options that make each term count.
std::vector<std::unique_ptr<UpdateRule>> every_rule_variant() {
  std::vector<std::unique_ptr<UpdateRule>> rules;
  AdamWOptions adamw_amsgrad;
  adamw_amsgrad.amsgrad = true;
  AdamOptions adam_amsgrad;
  adam_amsgrad.amsgrad = true;
  SgdOptions momentum;
  momentum.momentum = 0.9;
  momentum.dampening = 0.3;
  SgdOptions nesterov;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  AdagradOptions adagrad;
  adagrad.lr_decay = 0.05;
  adagrad.initial_accumulator_value = 0.1;
  rules.push_back(make_adamw());
  rules.push_back(make_adamw(adamw_amsgrad));
  rules.push_back(make_adam());
  rules.push_back(make_adam(adam_amsgrad));
  rules.push_back(make_sgd());
  rules.push_back(make_sgd(momentum));
  rules.push_back(make_sgd(nesterov));
  rules.push_back(make_lion());
  rules.push_back(make_adagrad(adagrad));
  return rules;
}

/// Three steps (the first is special for SGD's buffer and Adagrad's sum) of `rule`'s apply_fused()
/// on a stored gradient, against apply() on that gradient widened and scaled in a pass of its own,
/// followed by a conversion of the weights. Everything must agree bit for bit.
void expect_fused_equals_apply(const UpdateRule& rule, DType grad_dtype,
                               std::optional<DType> copy_dtype, float factor) {
  const auto* builtin = dynamic_cast<const detail::BuiltinRule*>(&rule);
  ASSERT_NE(builtin, nullptr) << rule.name();
  const std::string what = rule.name() + ", grad " + to_string(grad_dtype) + ", copy " +
                           (copy_dtype ? to_string(*copy_dtype) : "none") + ", factor " +
                           std::to_string(factor);
  // Past several conversion chunks (1024 elements), and not a multiple of any vector width.
  constexpr std::int64_t kSize = 5003;
  std::mt19937 rng(99);
  const std::vector<float> initial = random_values(rng, kSize, -1.0f, 1.0f);
  Fp32Tensor separate(initial, rule.state_count());
  Fp32Tensor fused(initial, rule.state_count());
  const DType copy_type = copy_dtype.value_or(DType::kFloat32);
  std::vector<unsigned char> separate_copy(kSize * size_of(copy_type));
  std::vector<unsigned char> fused_copy(separate_copy.size());
  for (std::int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grad = random_values(rng, kSize, -1.0f, 1.0f);
    std::vector<unsigned char> stored(kSize * size_of(grad_dtype));
    detail::convert_from_float(grad.data(), stored.data(), grad_dtype, kSize);
    std::vector<float> widened(kSize);
    detail::convert_to_float(stored.data(), grad_dtype, widened.data(), kSize);
    for (float& g : widened) g = g * factor;
    const StepContext context = context_at(step, 1e-2, 0.01);
    separate.apply(rule, widened, 0, kSize, context);
    if (copy_dtype) {
      detail::convert_from_float(separate.param.data(), separate_copy.data(), copy_type, kSize);
    }
    std::vector<float*> state_ptrs;
    for (auto& state : fused.states) state_ptrs.push_back(state.data());
    const ShardSlice slice{.param_name = "w",
                           .param_numel = kSize,
                           .offset_in_param = 0,
                           .size = kSize,
                           .param = fused.param.data(),
                           .grad = nullptr,  // read through the io, not here
                           .states = state_ptrs};
    builtin->apply_fused(slice,
                         {.grad = stored.data(),
                          .grad_dtype = grad_dtype,
                          .grad_factor = factor,
                          .param_copy = copy_dtype ? fused_copy.data() : nullptr,
                          .param_copy_dtype = copy_type},
                         context);
  }
  EXPECT_EQ(0, std::memcmp(fused.param.data(), separate.param.data(), kSize * sizeof(float)))
      << what << ": parameters differ";
  EXPECT_EQ(fused.states, separate.states) << what << ": states differ";
  EXPECT_EQ(fused_copy, separate_copy) << what << ": the parameter copy differs";
  EXPECT_NE(fused.param, initial) << what << ": the update changed nothing";
}

TEST(BuiltinRule, ApplyFusedEqualsApplyOnAWidenedScaledGradientThenAConversion) {
  for (const auto& rule : every_rule_variant()) {
    for (DType grad_dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (std::optional<DType> copy :
           {std::optional<DType>{}, std::optional<DType>{DType::kFloat16},
            std::optional<DType>{DType::kBFloat16}, std::optional<DType>{DType::kFloat32}}) {
        for (float factor : {1.0f, 0.37f})
          expect_fused_equals_apply(*rule, grad_dtype, copy, factor);
      }
    }
  }
}

TEST(BuiltinRule, ApplyFusedChecksItsGradientInsteadOfTheSlices) {
  const auto rule = make_adamw();
  const auto& builtin = dynamic_cast<const detail::BuiltinRule&>(*rule);
  float param = 1.0f;
  float state[2] = {0.0f, 0.0f};
  float* states[] = {&state[0], &state[1]};
  const ShardSlice slice{.param_name = "w",
                         .param_numel = 1,
                         .offset_in_param = 0,
                         .size = 1,
                         .param = &param,
                         .grad = nullptr,
                         .states = states};
  EXPECT_THROW(builtin.apply_fused(slice, {.grad = nullptr}, context_at(1, 0.1, 0.0)), UsageError);
  const std::uint16_t one_bf16 = 0x3F80;
  builtin.apply_fused(slice, {.grad = &one_bf16, .grad_dtype = DType::kBFloat16},
                      context_at(1, 0.1, 0.0));
  EXPECT_FLOAT_EQ(param, 0.9f);  // Adam's first step moves by lr whatever the gradient's scale
}

// --- First-step special cases -------------------------------------------------------------------

/// One element through one update; returns {param, states...}.
std::vector<float> one_update(const UpdateRule& rule, float param, float grad,
                              const StepContext& context) {
  Fp32Tensor tensor({param}, rule.state_count());
  tensor.apply(rule, {grad}, 0, 1, context);
  std::vector<float> result = {tensor.param[0]};
  for (const auto& state : tensor.states) result.push_back(state[0]);
  return result;
}

TEST(Sgd, StartsTheMomentumBufferAsACopyOfTheGradient) {
  SgdOptions options;
  options.momentum = 0.9;
  options.dampening = 0.5;
  // PyTorch: buf = g on step 1, not momentum * 0 + (1 - dampening) * g = 0.5 * g.
  const auto result = one_update(*make_sgd(options), 1.0f, 0.25f, context_at(1, 0.5, 0.0));
  EXPECT_EQ(result[1], 0.25f);
  EXPECT_EQ(result[0], 1.0f - 0.5f * 0.25f);
}

TEST(Adagrad, StartsTheSumAtTheInitialAccumulatorValue) {
  AdagradOptions options;
  options.initial_accumulator_value = 0.75;
  options.eps = 0.0;
  const auto result = one_update(*make_adagrad(options), 1.0f, 0.5f, context_at(1, 0.1, 0.0));
  EXPECT_EQ(result[1], 0.75f + 0.25f);
  EXPECT_FLOAT_EQ(result[0], 1.0f - 0.1f * 0.5f);  // sqrt(1) = 1
}

// --- Weight decay: L2 (Adam) versus decoupled (AdamW) -------------------------------------------

TEST(AdamW, DecaysWeightsDirectlyWhileAdamFoldsDecayIntoTheGradient) {
  const StepContext context = context_at(1, 0.1, 0.1);
  // With a zero gradient AdamW's moments stay 0, so only the decay moves p: 2 * (1 - 0.1 * 0.1).
  const auto adamw = one_update(*make_adamw(), 2.0f, 0.0f, context);
  EXPECT_FLOAT_EQ(adamw[0], 1.98f);
  EXPECT_EQ(adamw[1], 0.0f);
  // Adam sees g = wd * p = 0.2; the bias-corrected step is lr * 0.2 / sqrt(0.2^2) = 0.1.
  const auto adam = one_update(*make_adam(), 2.0f, 0.0f, context);
  EXPECT_FLOAT_EQ(adam[0], 1.9f);
  EXPECT_FLOAT_EQ(adam[1], 0.1f * 0.2f);
}

// --- Momentum from a schedule -------------------------------------------------------------------

/// Runs three steps of `scheduled` with context.momentum = 0.85 and of `built` without; they must
/// agree bit for bit.
void expect_momentum_replaces(const UpdateRule& scheduled, const UpdateRule& built) {
  std::mt19937 rng(7);
  const std::vector<float> initial = random_values(rng, 37, -1.0f, 1.0f);
  Fp32Tensor a(initial, scheduled.state_count());
  Fp32Tensor b(initial, built.state_count());
  for (std::int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grad = random_values(rng, 37, -1.0f, 1.0f);
    StepContext with_momentum = context_at(step, 1e-2, 0.01);
    with_momentum.momentum = 0.85;
    a.apply(scheduled, grad, 0, 37, with_momentum);
    b.apply(built, grad, 0, 37, context_at(step, 1e-2, 0.01));
  }
  EXPECT_EQ(a.param, b.param) << scheduled.name();
  EXPECT_EQ(a.states, b.states) << scheduled.name();
}

TEST(StepContext, MomentumReplacesBeta1OrSgdMomentum) {
  AdamWOptions adamw_085;
  adamw_085.beta1 = 0.85;
  expect_momentum_replaces(*make_adamw(), *make_adamw(adamw_085));
  AdamOptions adam_085;
  adam_085.beta1 = 0.85;
  expect_momentum_replaces(*make_adam(), *make_adam(adam_085));
  LionOptions lion_085;
  lion_085.beta1 = 0.85;
  expect_momentum_replaces(*make_lion(), *make_lion(lion_085));
  SgdOptions sgd;
  sgd.momentum = 0.9;
  SgdOptions sgd_085;
  sgd_085.momentum = 0.85;
  expect_momentum_replaces(*make_sgd(sgd), *make_sgd(sgd_085));
}

TEST(Sgd, WithoutMomentumRefusesAMomentumSchedule) {
  StepContext context = context_at(1, 0.1, 0.0);
  context.momentum = 0.9;
  EXPECT_THROW(one_update(*make_sgd(), 1.0f, 1.0f, context), UsageError);
}

TEST(UpdateRule, RefusesASliceWithTheWrongNumberOfStates) {
  const auto rule = make_adamw();
  Fp32Tensor tensor({1.0f}, 1);
  EXPECT_THROW(tensor.apply(*rule, {1.0f}, 0, 1, context_at(1, 0.1, 0.0)), UsageError);
}

TEST(UpdateRule, RefusesStepZero) {
  EXPECT_THROW(one_update(*make_adamw(), 1.0f, 1.0f, context_at(0, 0.1, 0.0)), UsageError);
}

// --- Validation in PyTorch's words --------------------------------------------------------------

/// Runs `make`, expecting a ConfigError with `key_path` and exactly `message` after the key.
void expect_config_error(const std::function<void()>& make, const std::string& key_path,
                         const std::string& message) {
  try {
    make();
    ADD_FAILURE() << "no ConfigError; expected " << key_path << ": " << message;
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), key_path);
    EXPECT_EQ(std::string(error.what()), key_path + ": " + message);
  }
}

TEST(UpdateRuleOptions, AreValidatedWithPyTorchMessages) {
  AdamWOptions adamw;
  adamw.lr = -1;
  expect_config_error([&] { make_adamw(adamw); }, "optimizer.params.lr",
                      "Invalid learning rate: -1");
  AdamOptions adam;
  adam.eps = -1e-8;
  expect_config_error([&] { make_adam(adam); }, "optimizer.params.eps",
                      "Invalid epsilon value: -1e-08");
  adam = {};
  adam.beta1 = 1.0;
  expect_config_error([&] { make_adam(adam); }, "optimizer.params.betas",
                      "Invalid beta parameter at index 0: 1");
  adam = {};
  adam.beta2 = -0.5;
  expect_config_error([&] { make_adam(adam); }, "optimizer.params.betas",
                      "Invalid beta parameter at index 1: -0.5");
  adam = {};
  adam.weight_decay = -0.1;
  expect_config_error([&] { make_adam(adam); }, "optimizer.params.weight_decay",
                      "Invalid weight_decay value: -0.1");
  SgdOptions sgd;
  sgd.nesterov = true;
  sgd.momentum = 0.9;
  sgd.dampening = 0.1;
  expect_config_error([&] { make_sgd(sgd); }, "optimizer.params.nesterov",
                      "Nesterov momentum requires a momentum and zero dampening");
  sgd = {};
  sgd.momentum = -0.9;
  expect_config_error([&] { make_sgd(sgd); }, "optimizer.params.momentum",
                      "Invalid momentum value: -0.9");
  LionOptions lion;
  lion.beta2 = 1.5;
  expect_config_error([&] { make_lion(lion); }, "optimizer.params.betas",
                      "Invalid beta parameter at index 1: 1.5");
  AdagradOptions adagrad;
  adagrad.initial_accumulator_value = -1;
  expect_config_error([&] { make_adagrad(adagrad); }, "optimizer.params.initial_accumulator_value",
                      "Invalid initial_accumulator_value value: -1");
  adagrad = {};
  adagrad.lr_decay = -0.5;
  expect_config_error([&] { make_adagrad(adagrad); }, "optimizer.params.lr_decay",
                      "Invalid lr_decay value: -0.5");
}

TEST(UpdateRuleOptions, RejectNaN) {
  AdamWOptions adamw;
  adamw.lr = std::nan("");
  EXPECT_THROW(make_adamw(adamw), ConfigError);
}

// --- make_update_rule ---------------------------------------------------------------------------

Config config_with_optimizer(const std::string& type) {
  Config config;
  config.optimizer.type = type;
  return config;
}

TEST(MakeUpdateRule, MapsAdamToAdamWUnlessAdamWModeIsFalse) {
  EXPECT_EQ(make_update_rule(config_with_optimizer("Adam"))->name(), "adamw");
  Config config = config_with_optimizer("adam");
  config.optimizer.params["adam_w_mode"] = 0.0;
  EXPECT_EQ(make_update_rule(config)->name(), "adam");
  // As in DeepSpeed, the name AdamW forces decoupled decay.
  config.optimizer.type = "adamw";
  EXPECT_EQ(make_update_rule(config)->name(), "adamw");
}

TEST(MakeUpdateRule, AcceptsDeepSpeedNamesInAnyCase) {
  EXPECT_EQ(make_update_rule(config_with_optimizer("AdamW"))->name(), "adamw");
  EXPECT_EQ(make_update_rule(config_with_optimizer("SGD"))->name(), "sgd");
  EXPECT_EQ(make_update_rule(config_with_optimizer("Lion"))->name(), "lion");
  EXPECT_EQ(make_update_rule(config_with_optimizer("adagrad"))->name(), "adagrad");
}

TEST(MakeUpdateRule, UsesDeepSpeedDefaults) {
  // FusedAdam's weight_decay defaults to 0; torch.optim.AdamW's (torch_adam) to 0.01.
  EXPECT_EQ(make_update_rule(config_with_optimizer("adamw"))->default_weight_decay(), 0.0);
  Config torch_adam = config_with_optimizer("adamw");
  torch_adam.optimizer.params["torch_adam"] = 1.0;
  EXPECT_EQ(make_update_rule(torch_adam)->default_weight_decay(), 0.01);
  // FusedLion's lr defaults to 1e-3.
  EXPECT_EQ(make_update_rule(config_with_optimizer("lion"))->default_lr(), 1e-3);
}

TEST(MakeUpdateRule, PassesParamsToTheRule) {
  Config config = config_with_optimizer("AdamW");
  config.optimizer.params["lr"] = 0.02;
  config.optimizer.params["weight_decay"] = 0.05;
  config.optimizer.params["eps"] = 1e-6;
  config.optimizer.params["amsgrad"] = 1.0;
  config.optimizer.array_params["betas"] = {0.8, 0.9};
  const auto from_config = make_update_rule(config);
  EXPECT_EQ(from_config->default_lr(), 0.02);
  EXPECT_EQ(from_config->default_weight_decay(), 0.05);
  AdamWOptions options;
  options.lr = 0.02;
  options.weight_decay = 0.05;
  options.eps = 1e-6;
  options.amsgrad = true;
  options.beta1 = 0.8;
  options.beta2 = 0.9;
  const auto built = make_adamw(options);
  ASSERT_EQ(from_config->state_count(), built->state_count());
  // Step 2 from non-zero moments, so that beta1, beta2 and eps all show in the result.
  const StepContext context = context_at(2, 0.02, 0.05);
  Fp32Tensor a({0.5f}, built->state_count());
  Fp32Tensor b({0.5f}, built->state_count());
  a.states[0][0] = b.states[0][0] = 0.1f;
  a.states[1][0] = b.states[1][0] = 0.01f;
  a.apply(*from_config, {0.3f}, 0, 1, context);
  b.apply(*built, {0.3f}, 0, 1, context);
  EXPECT_EQ(a.param, b.param);
  EXPECT_EQ(a.states, b.states);

  Config sgd = config_with_optimizer("sgd");
  sgd.optimizer.params["momentum"] = 0.9;
  EXPECT_EQ(make_update_rule(sgd)->state_count(), 1);
}

TEST(MakeUpdateRule, RejectsAnUnknownParamListingTheAllowedOnes) {
  Config config = config_with_optimizer("adamw");
  config.optimizer.params["momentum"] = 0.9;
  try {
    make_update_rule(config);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "optimizer.params.momentum");
    EXPECT_THAT(error.what(), HasSubstr("allowed: lr, betas, eps, weight_decay"));
  }
}

TEST(MakeUpdateRule, RejectsBadValues) {
  Config config = config_with_optimizer("adam");
  config.optimizer.params["bias_correction"] = 0.0;
  expect_config_error([&] { make_update_rule(config); }, "optimizer.params.bias_correction",
                      "false is not implemented; zeroshard's Adam always corrects the bias");
  config = config_with_optimizer("adam");
  config.optimizer.array_params["betas"] = {0.9};
  expect_config_error([&] { make_update_rule(config); }, "optimizer.params.betas",
                      "expected an array of two numbers, got 1");
  config = config_with_optimizer("adam");
  config.optimizer.params["lr"] = -1;
  expect_config_error([&] { make_update_rule(config); }, "optimizer.params.lr",
                      "Invalid learning rate: -1");
  config = config_with_optimizer("sgd");
  config.optimizer.params["nesterov"] = 2;
  expect_config_error([&] { make_update_rule(config); }, "optimizer.params.nesterov",
                      "expected true or false, got 2");
}

TEST(MakeUpdateRule, RejectsAMissingOrUnknownType) {
  try {
    make_update_rule(Config{});
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "optimizer");
    EXPECT_THAT(error.what(), HasSubstr("pass an update rule in code"));
  }
  try {
    make_update_rule(config_with_optimizer("Lamb"));
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "optimizer.type");
    EXPECT_THAT(error.what(), HasSubstr("adam, adamw, sgd, lion, adagrad"));
  }
}

}  // namespace
}  // namespace zeroshard
