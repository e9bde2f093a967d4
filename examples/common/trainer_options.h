// The command-line flags every example trainer shares (config, ZeRO stage, steps, device,
// precision, activation checkpointing, report and checkpoint files).
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <string_view>

#include "command_line.h"

namespace zeroshard::examples {

/// Parses all of `text` as a number; false when it is not one or has more after it.
template <typename T>
bool parse_number(std::string_view text, T& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

struct TrainerOptions {
  std::string config_path;
  std::optional<int> stage;  ///< empty: as the config says
  int steps = 0;
  std::string precision;  ///< empty: as the config says
  std::string device = "auto";
  int checkpoint_every = 0;
  std::string report_json;
  std::string save_dir;
  int save_every = 0;  ///< 0: only at the end
  std::string resume_dir;
};

/// Adds the shared flags to `app`, storing into `options`; --steps is required when
/// `steps_required`, and otherwise keeps the value `options.steps` has.
void add_trainer_flags(CLI::App& app, TrainerOptions& options, bool steps_required);

}  // namespace zeroshard::examples
