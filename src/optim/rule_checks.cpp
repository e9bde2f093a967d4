// Input checks shared by the built-in update rules, and their slices as the CPU loops take them.
#include "optim/rule_checks.h"

#include <string>

#include "kernels/cpu/cpu_optimizer.h"
#include "util/check.h"
#include "util/text.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

void require_option(bool ok, std::string_view param, std::string_view what, double value) {
  if (ok) return;
  throw ConfigError("optimizer.params." + std::string(param),
                    std::string(what) + ": " + format_number(value));
}

void check_apply_arguments(const ShardSlice& slice, const StepContext& context, int state_count,
                           std::string_view rule) {
  check_apply_arguments(slice, unfused_io(slice), context, state_count, rule);
}

void check_apply_arguments(const ShardSlice& slice, const FusedStepIo& io,
                           const StepContext& context, int state_count, std::string_view rule) {
  ZEROSHARD_CHECK_USAGE(context.step >= 1, rule << ": step must be 1 or more (1 on the first "
                                                   "update), got "
                                                << context.step);
  ZEROSHARD_CHECK_USAGE(slice.size >= 0, rule << ": slice of '" << slice.param_name
                                              << "' has negative size " << slice.size);
  ZEROSHARD_CHECK_USAGE(static_cast<int>(slice.states.size()) == state_count,
                        rule << " needs " << state_count << " state arrays, slice of '"
                             << slice.param_name << "' has " << slice.states.size());
  if (slice.size == 0) return;
  ZEROSHARD_CHECK_USAGE(
      slice.param != nullptr && io.grad != nullptr,
      rule << ": slice of '" << slice.param_name << "' has no parameter or gradient data");
  for (float* state : slice.states) {
    ZEROSHARD_CHECK_USAGE(state != nullptr,
                          rule << ": slice of '" << slice.param_name << "' has a null state array");
  }
}

cpu_optimizer::RuleArrays rule_arrays(const ShardSlice& slice, const FusedStepIo& io) {
  return {.param = slice.param,
          .grad = io.grad,
          .states = slice.states.data(),
          .grad_dtype = io.grad_dtype,
          .grad_factor = io.grad_factor,
          .param_copy = io.param_copy,
          .param_copy_dtype = io.param_copy_dtype,
          .grad_to_clear = io.grad_to_clear};
}

}  // namespace zeroshard::detail
