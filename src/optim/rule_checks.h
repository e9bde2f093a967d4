// Input checks shared by the built-in update rules: option validation in PyTorch's words, thrown
// as ConfigError on the DeepSpeed key the option comes from, and the contract of apply().
#pragma once

#include <string_view>

#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

/// Throws ConfigError("optimizer.params.<param>", "<what>: <value>") unless `ok`, e.g.
/// require_option(lr >= 0.0, "lr", "Invalid learning rate", lr) gives "Invalid learning rate: -1".
/// Write `ok` so that NaN fails it.
void require_option(bool ok, std::string_view param, std::string_view what, double value);

/// Throws UsageError unless `slice` carries `state_count` state arrays and valid pointers, and
/// `context.step` is at least 1.
void check_apply_arguments(const ShardSlice& slice, const StepContext& context, int state_count,
                           std::string_view rule);

}  // namespace zeroshard::detail
