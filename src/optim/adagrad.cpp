// torch.optim.Adagrad (foreach=False reference algorithm): L2 weight decay, a decaying step size
// and a running sum of squared gradients, in fp32 per element.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_optimizer.h"
#include "optim/builtin_rule.h"
#include "optim/rule_checks.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

class AdagradRule final : public detail::BuiltinRule {
 public:
  explicit AdagradRule(const AdagradOptions& options) : options_(options) {}

  std::string name() const override { return "adagrad"; }
  int state_count() const override { return 1; }
  double default_lr() const override { return options_.lr; }
  double default_weight_decay() const override { return options_.weight_decay; }
  detail::BuiltinRuleOptions options() const override { return options_; }

  void apply(const ShardSlice& slice, const StepContext& context) const override {
    apply_fused(slice, detail::unfused_io(slice), context);
  }

  void apply_fused(const ShardSlice& slice, const detail::FusedStepIo& io,
                   const StepContext& context) const override {
    detail::check_apply_arguments(slice, io, context, state_count(), name());
    const auto step = static_cast<double>(context.step);
    // PyTorch starts the sum at initial_accumulator_value; ours arrives zeroed, so step 1 adds the
    // start value (0 + v is exact) and later steps add 0 (also exact).
    const double sum_start = context.step == 1 ? options_.initial_accumulator_value : 0.0;
    detail::cpu_optimizer::adagrad(
        detail::cpu_optimizer::active_isa(), detail::rule_arrays(slice, io), slice.size,
        {.neg_clr = static_cast<float>(-context.lr / (1.0 + (step - 1.0) * options_.lr_decay)),
         .weight_decay = static_cast<float>(context.weight_decay),
         .sum_start = static_cast<float>(sum_start),
         .eps = static_cast<float>(options_.eps)});
  }

 private:
  AdagradOptions options_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_adagrad(const AdagradOptions& options) {
  detail::require_option(options.lr >= 0.0, "lr", "Invalid learning rate", options.lr);
  detail::require_option(options.lr_decay >= 0.0, "lr_decay", "Invalid lr_decay value",
                         options.lr_decay);
  detail::require_option(options.weight_decay >= 0.0, "weight_decay", "Invalid weight_decay value",
                         options.weight_decay);
  detail::require_option(options.initial_accumulator_value >= 0.0, "initial_accumulator_value",
                         "Invalid initial_accumulator_value value",
                         options.initial_accumulator_value);
  detail::require_option(options.eps >= 0.0, "eps", "Invalid epsilon value", options.eps);
  return std::make_unique<AdagradRule>(options);
}

}  // namespace zeroshard
