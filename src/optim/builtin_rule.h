// zeroshard's own update rules expose their options, so that a backend that cannot call a rule's
// host code (the GPU runs each as a fused kernel) can tell them from a user's rule and read them.
#pragma once

#include <optional>
#include <variant>

#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

using BuiltinRuleOptions =
    std::variant<AdamWOptions, AdamOptions, SgdOptions, LionOptions, AdagradOptions>;

/// The base of every rule the make_* factories build.
class BuiltinRule : public UpdateRule {
 public:
  virtual BuiltinRuleOptions options() const = 0;
};

/// The options `rule` was built with when it is one of the built-in rules; nullopt for a user's
/// own UpdateRule.
inline std::optional<BuiltinRuleOptions> builtin_rule_options(const UpdateRule& rule) {
  if (const auto* builtin = dynamic_cast<const BuiltinRule*>(&rule)) return builtin->options();
  return std::nullopt;
}

}  // namespace zeroshard::detail
