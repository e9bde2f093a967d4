// zeroshard's own update rules expose their options, so that a backend that cannot call a rule's
// host code (the GPU runs each as a fused kernel) can tell them from a user's rule and read them,
// and a fused entry point that reads the gradient as stored and writes the model's 16-bit copy in
// the same pass over memory.
#pragma once

#include <optional>
#include <variant>

#include "zeroshard/dtype.h"
#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

using BuiltinRuleOptions =
    std::variant<AdamWOptions, AdamOptions, SgdOptions, LionOptions, AdagradOptions>;

/// What a fused update reads and writes besides the slice's master weights and states. Neither
/// array may overlap the master weights or the states; 16-bit arrays are 2-byte aligned.
struct FusedStepIo {
  const void* grad = nullptr;  ///< slice.size elements of grad_dtype, as reduced (not unscaled)
  DType grad_dtype = DType::kFloat32;
  /// The step's one gradient factor (unscale x average x clip): the rule sees
  /// float(grad[i]) * grad_factor, rounded to fp32 once.
  float grad_factor = 1.0f;
  /// When set, receives the updated master weights rounded to nearest even in param_copy_dtype,
  /// the bits convert_from_float (precision/half_conversion.h) would write.
  void* param_copy = nullptr;
  DType param_copy_dtype = DType::kFloat32;
  /// When set, `grad` itself, writable: it is zero when the update returns (the CPU rules zero
  /// each chunk as they read it).
  void* grad_to_clear = nullptr;
};

/// The base of every rule the make_* factories build.
class BuiltinRule : public UpdateRule {
 public:
  virtual BuiltinRuleOptions options() const = 0;
  /// The same update as apply(), bit for bit, with the gradient read through `io` (slice.grad is
  /// not used) and the parameter copy written as each element is updated.
  virtual void apply_fused(const ShardSlice& slice, const FusedStepIo& io,
                           const StepContext& context) const = 0;
};

/// The options `rule` was built with when it is one of the built-in rules; nullopt for a user's
/// own UpdateRule.
inline std::optional<BuiltinRuleOptions> builtin_rule_options(const UpdateRule& rule) {
  if (const auto* builtin = dynamic_cast<const BuiltinRule*>(&rule)) return builtin->options();
  return std::nullopt;
}

}  // namespace zeroshard::detail
