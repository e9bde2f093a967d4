// Lion (Chen et al. 2023) as lion-pytorch and DeepSpeed's FusedLion compute it: decoupled weight
// decay, a step of lr * sign(interpolated momentum), then the momentum update; fp32 per element.
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_optimizer.h"
#include "optim/builtin_rule.h"
#include "optim/rule_checks.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

class LionRule final : public detail::BuiltinRule {
 public:
  explicit LionRule(const LionOptions& options) : options_(options) {}

  std::string name() const override { return "lion"; }
  int state_count() const override { return 1; }
  double default_lr() const override { return options_.lr; }
  double default_weight_decay() const override { return options_.weight_decay; }
  detail::BuiltinRuleOptions options() const override { return options_; }
  std::optional<double> beta1() const override { return options_.beta1; }

  void apply(const ShardSlice& slice, const StepContext& context) const override {
    apply_fused(slice, detail::unfused_io(slice), context);
  }

  void apply_fused(const ShardSlice& slice, const detail::FusedStepIo& io,
                   const StepContext& context) const override {
    detail::check_apply_arguments(slice, io, context, state_count(), name());
    const double beta1 = context.momentum.value_or(options_.beta1);
    detail::cpu_optimizer::lion(
        detail::cpu_optimizer::active_isa(), detail::rule_arrays(slice, io), slice.size,
        {.weight_factor = static_cast<float>(1.0 - context.lr * context.weight_decay),
         .lr = static_cast<float>(context.lr),
         .beta1 = static_cast<float>(beta1),
         .one_minus_beta1 = static_cast<float>(1.0 - beta1),
         .beta2 = static_cast<float>(options_.beta2),
         .one_minus_beta2 = static_cast<float>(1.0 - options_.beta2)});
  }

 private:
  LionOptions options_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_lion(const LionOptions& options) {
  detail::require_option(options.lr >= 0.0, "lr", "Invalid learning rate", options.lr);
  detail::require_option(options.beta1 >= 0.0 && options.beta1 < 1.0, "betas",
                         "Invalid beta parameter at index 0", options.beta1);
  detail::require_option(options.beta2 >= 0.0 && options.beta2 < 1.0, "betas",
                         "Invalid beta parameter at index 1", options.beta2);
  detail::require_option(options.weight_decay >= 0.0, "weight_decay", "Invalid weight_decay value",
                         options.weight_decay);
  return std::make_unique<LionRule>(options);
}

}  // namespace zeroshard
