// torch.optim.SGD (foreach=False reference algorithm): L2 weight decay, optional momentum with
// dampening and Nesterov, in fp32 per element.
#include <cstdint>
#include <string>

#include "check.h"
#include "update_rules/builtin_rule.h"
#include "update_rules/rule_checks.h"
#include "update_rules/simd.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

void sgd_plain_loop(const ShardSlice& slice, float neg_lr, float weight_decay) {
  float* param = slice.param;
  const float* grad = slice.grad;
  const std::int64_t n = slice.size;
  ZEROSHARD_SIMD_LOOP
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * param[i];
    param[i] = param[i] + neg_lr * g;
  }
}

/// buf = keep * buf + take * g. PyTorch starts the buffer as a copy of g on the first step; with
/// keep 0 and take 1 that is exact, since the buffer arrives zeroed.
template <bool kNesterov>
void sgd_momentum_loop(const ShardSlice& slice, float neg_lr, float weight_decay, float keep,
                       float take, float momentum) {
  float* param = slice.param;
  const float* grad = slice.grad;
  float* momentum_buffer = slice.states[0];
  const std::int64_t n = slice.size;
  ZEROSHARD_SIMD_LOOP
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * param[i];
    const float buf = keep * momentum_buffer[i] + take * g;
    momentum_buffer[i] = buf;
    const float direction = kNesterov ? g + momentum * buf : buf;
    param[i] = param[i] + neg_lr * direction;
  }
}

class SgdRule final : public detail::BuiltinRule {
 public:
  explicit SgdRule(const SgdOptions& options) : options_(options) {}

  std::string name() const override { return "sgd"; }
  int state_count() const override { return options_.momentum != 0.0 ? 1 : 0; }
  double default_lr() const override { return options_.lr; }
  double default_weight_decay() const override { return options_.weight_decay; }
  detail::BuiltinRuleOptions options() const override { return options_; }

  void apply(const ShardSlice& slice, const StepContext& context) const override {
    detail::check_apply_arguments(slice, context, state_count(), name());
    const auto neg_lr = static_cast<float>(-context.lr);
    const auto weight_decay = static_cast<float>(context.weight_decay);
    if (state_count() == 0) {
      // Without a buffer a scheduled momentum would be dropped without a word.
      ZEROSHARD_CHECK_USAGE(!context.momentum.has_value(),
                            "sgd was built with momentum 0 and keeps no momentum buffer, so it "
                            "cannot follow a momentum schedule; give it a non-zero momentum");
      sgd_plain_loop(slice, neg_lr, weight_decay);
      return;
    }
    const double momentum = context.momentum.value_or(options_.momentum);
    const bool first_step = context.step == 1;
    const auto keep = static_cast<float>(first_step ? 0.0 : momentum);
    const auto take = static_cast<float>(first_step ? 1.0 : 1.0 - options_.dampening);
    if (options_.nesterov) {
      sgd_momentum_loop<true>(slice, neg_lr, weight_decay, keep, take,
                              static_cast<float>(momentum));
    } else {
      sgd_momentum_loop<false>(slice, neg_lr, weight_decay, keep, take,
                               static_cast<float>(momentum));
    }
  }

 private:
  SgdOptions options_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_sgd(const SgdOptions& options) {
  detail::require_option(options.lr >= 0.0, "lr", "Invalid learning rate", options.lr);
  detail::require_option(options.momentum >= 0.0, "momentum", "Invalid momentum value",
                         options.momentum);
  detail::require_option(options.weight_decay >= 0.0, "weight_decay", "Invalid weight_decay value",
                         options.weight_decay);
  if (options.nesterov && (options.momentum <= 0.0 || options.dampening != 0.0)) {
    throw ConfigError("optimizer.params.nesterov",
                      "Nesterov momentum requires a momentum and zero dampening");
  }
  return std::make_unique<SgdRule>(options);
}

}  // namespace zeroshard
