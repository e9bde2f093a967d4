// The command-line flags that fill a config's "auto" values (ConfigOverrides), shared by the
// tools that load configs.
#pragma once

#include <string_view>

#include "zeroshard/config.h"

namespace zeroshard::tools {

/// The flags' lines for a tool's --help.
extern const char* const kOverrideFlagsHelp;

/// Whether `flag` ("--learning-rate") is an override flag.
bool is_override_flag(std::string_view flag);

/// Stores `value` for override flag `flag`; throws UsageError naming the flag on a bad value.
void apply_override_flag(std::string_view flag, std::string_view value, ConfigOverrides& overrides);

}  // namespace zeroshard::tools
