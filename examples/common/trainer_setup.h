// What an example trainer does before it trains: read the config with the command line's stage
// and precision, and pick the device --device names.
#pragma once

#include "trainer_options.h"
#include "zeroshard/zeroshard.h"

namespace zeroshard::examples {

/// The config --config names for `world` ranks, with --stage overriding its
/// zero_optimization.stage and --precision its fp16/bf16 sections.
Config load_trainer_config(const TrainerOptions& options, int world);

/// Rank 0 prints the notes the config parser left (as "note: ...").
void print_config_notices(const Config& config, int rank);

/// The device --device names; `cuda` without a usable GPU is an error that says why.
Device choose_device(const std::string& choice);

}  // namespace zeroshard::examples
