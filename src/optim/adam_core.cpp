// Adam and AdamW as torch.optim computes them (foreach=False reference algorithm), in fp32 per
// element with the bias corrections computed once per call in double; the loop is the CPU
// optimizer's (offload/cpu_rule_kernels.inc).
#include "optim/adam_core.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_optimizer.h"
#include "optim/builtin_rule.h"
#include "optim/rule_checks.h"

namespace zeroshard::detail {
namespace {

class AdamRule final : public BuiltinRule {
 public:
  AdamRule(const AdamCoreOptions& options, AdamWeightDecay weight_decay)
      : options_(options), weight_decay_mode_(weight_decay) {}

  std::string name() const override {
    return weight_decay_mode_ == AdamWeightDecay::kL2 ? "adam" : "adamw";
  }
  int state_count() const override { return options_.amsgrad ? 3 : 2; }
  double default_lr() const override { return options_.lr; }
  double default_weight_decay() const override { return options_.weight_decay; }
  std::optional<double> beta1() const override { return options_.beta1; }
  BuiltinRuleOptions options() const override {
    if (weight_decay_mode_ == AdamWeightDecay::kDecoupled) return public_options<AdamWOptions>();
    return public_options<AdamOptions>();
  }

  void apply(const ShardSlice& slice, const StepContext& context) const override {
    apply_fused(slice, unfused_io(slice), context);
  }

  void apply_fused(const ShardSlice& slice, const FusedStepIo& io,
                   const StepContext& context) const override {
    check_apply_arguments(slice, io, context, state_count(), name());
    const double beta1 = context.momentum.value_or(options_.beta1);
    const double beta2 = options_.beta2;
    const auto step = static_cast<double>(context.step);
    const bool decoupled = weight_decay_mode_ == AdamWeightDecay::kDecoupled;
    const cpu_optimizer::AdamScalars scalars{
        .weight_factor =
            static_cast<float>(decoupled ? 1.0 - context.lr * context.weight_decay : 1.0),
        .l2 = static_cast<float>(decoupled ? 0.0 : context.weight_decay),
        .beta1 = static_cast<float>(beta1),
        .one_minus_beta1 = static_cast<float>(1.0 - beta1),
        .beta2 = static_cast<float>(beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - beta2),
        .step_size = static_cast<float>(context.lr / (1.0 - std::pow(beta1, step))),
        .inv_bias_correction2_sqrt =
            static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2, step))),
        .eps = static_cast<float>(options_.eps),
    };
    cpu_optimizer::adam(cpu_optimizer::active_isa(), rule_arrays(slice, io), slice.size, scalars,
                        options_.amsgrad);
  }

 private:
  // AdamOptions and AdamWOptions have the same fields; only their defaults differ.
  template <class Options>
  Options public_options() const {
    return {.lr = options_.lr,
            .beta1 = options_.beta1,
            .beta2 = options_.beta2,
            .eps = options_.eps,
            .weight_decay = options_.weight_decay,
            .amsgrad = options_.amsgrad};
  }

  AdamCoreOptions options_;
  AdamWeightDecay weight_decay_mode_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_adam_core(const AdamCoreOptions& options,
                                           AdamWeightDecay weight_decay) {
  require_option(options.lr >= 0.0, "lr", "Invalid learning rate", options.lr);
  require_option(options.eps >= 0.0, "eps", "Invalid epsilon value", options.eps);
  require_option(options.beta1 >= 0.0 && options.beta1 < 1.0, "betas",
                 "Invalid beta parameter at index 0", options.beta1);
  require_option(options.beta2 >= 0.0 && options.beta2 < 1.0, "betas",
                 "Invalid beta parameter at index 1", options.beta2);
  require_option(options.weight_decay >= 0.0, "weight_decay", "Invalid weight_decay value",
                 options.weight_decay);
  return std::make_unique<AdamRule>(options, weight_decay);
}

}  // namespace zeroshard::detail
