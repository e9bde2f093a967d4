// torch.optim.SGD (foreach=False reference algorithm): L2 weight decay, optional momentum with
// dampening and Nesterov, in fp32 per element.
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_optimizer.h"
#include "optim/builtin_rule.h"
#include "optim/rule_checks.h"
#include "util/check.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

class SgdRule final : public detail::BuiltinRule {
 public:
  explicit SgdRule(const SgdOptions& options) : options_(options) {}

  std::string name() const override { return "sgd"; }
  int state_count() const override { return options_.momentum != 0.0 ? 1 : 0; }
  double default_lr() const override { return options_.lr; }
  double default_weight_decay() const override { return options_.weight_decay; }
  detail::BuiltinRuleOptions options() const override { return options_; }

  void apply(const ShardSlice& slice, const StepContext& context) const override {
    apply_fused(slice, detail::unfused_io(slice), context);
  }

  void apply_fused(const ShardSlice& slice, const detail::FusedStepIo& io,
                   const StepContext& context) const override {
    detail::check_apply_arguments(slice, io, context, state_count(), name());
    detail::cpu_optimizer::SgdScalars scalars{
        .neg_lr = static_cast<float>(-context.lr),
        .weight_decay = static_cast<float>(context.weight_decay),
        .keep = 0.0f,
        .take = 1.0f,
        .momentum = 0.0f,
    };
    const detail::cpu_optimizer::RuleArrays arrays = detail::rule_arrays(slice, io);
    const auto isa = detail::cpu_optimizer::active_isa();
    if (state_count() == 0) {
      // Without a buffer a scheduled momentum would be dropped without a word.
      ZEROSHARD_CHECK_USAGE(!context.momentum.has_value(),
                            "sgd was built with momentum 0 and keeps no momentum buffer, so it "
                            "cannot follow a momentum schedule; give it a non-zero momentum");
      detail::cpu_optimizer::sgd(isa, arrays, slice.size, scalars,
                                 detail::cpu_optimizer::SgdKind::kPlain);
      return;
    }
    // buf = keep * buf + take * g. PyTorch starts the buffer as a copy of g on the first step;
    // with keep 0 and take 1 that is exact, since the buffer arrives zeroed.
    const double momentum = context.momentum.value_or(options_.momentum);
    const bool first_step = context.step == 1;
    scalars.keep = static_cast<float>(first_step ? 0.0 : momentum);
    scalars.take = static_cast<float>(first_step ? 1.0 : 1.0 - options_.dampening);
    scalars.momentum = static_cast<float>(momentum);
    detail::cpu_optimizer::sgd(isa, arrays, slice.size, scalars,
                               options_.nesterov ? detail::cpu_optimizer::SgdKind::kNesterov
                                                 : detail::cpu_optimizer::SgdKind::kMomentum);
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
