// The command-line flags that fill a config's "auto" values (ConfigOverrides), shared by the
// tools that load configs.
#pragma once

#include "tools/command_line.h"
#include "zeroshard/config.h"

namespace zeroshard::tools {

/// Adds the flags, one per ConfigOverrides field, that store their values into `overrides`; a
/// bad value is rejected naming the flag ("--learning-rate: got 'fast', expected a finite
/// number").
void add_override_flags(CLI::App& app, ConfigOverrides& overrides);

}  // namespace zeroshard::tools
