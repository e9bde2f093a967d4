// What the built-in update rules share: option validation in PyTorch's words, thrown as
// ConfigError on the DeepSpeed key the option comes from; the contract of apply(); and a slice as
// the CPU optimizer's loops take it.
#pragma once

#include <string_view>

#include "optim/builtin_rule.h"
#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

namespace cpu_optimizer {
struct RuleArrays;
}  // namespace cpu_optimizer

/// Throws ConfigError("optimizer.params.<param>", "<what>: <value>") unless `ok`, e.g.
/// require_option(lr >= 0.0, "lr", "Invalid learning rate", lr) gives "Invalid learning rate: -1".
/// Write `ok` so that NaN fails it.
void require_option(bool ok, std::string_view param, std::string_view what, double value);

/// Throws UsageError unless `slice` carries `state_count` state arrays and valid pointers, and
/// `context.step` is at least 1.
void check_apply_arguments(const ShardSlice& slice, const StepContext& context, int state_count,
                           std::string_view rule);
/// The same for apply_fused(), which reads the gradient through `io` instead of slice.grad.
void check_apply_arguments(const ShardSlice& slice, const FusedStepIo& io,
                           const StepContext& context, int state_count, std::string_view rule);

/// The master weights and states of `slice` with the gradient and parameter copy of `io`.
cpu_optimizer::RuleArrays rule_arrays(const ShardSlice& slice, const FusedStepIo& io);

/// What apply() passes to apply_fused(): slice.grad as it is, no copy.
inline FusedStepIo unfused_io(const ShardSlice& slice) {
  return {.grad = slice.grad,
          .grad_dtype = DType::kFloat32,
          .grad_factor = 1.0f,
          .param_copy = nullptr,
          .param_copy_dtype = DType::kFloat32};
}

}  // namespace zeroshard::detail
