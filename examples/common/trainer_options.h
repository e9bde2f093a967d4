// The command-line flags every example trainer shares (config, steps, device, precision,
// activation checkpointing, report and checkpoint files) and the loop that reads a command line,
// offering each flag it does not know to the trainer's own parser.
#pragma once

#include <charconv>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace zeroshard::examples {

/// Parses all of `text` as a number; false when it is not one or has more after it.
template <typename T>
bool parse_number(std::string_view text, T& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

/// `--flag: expected a positive integer, got 'text'` unless `value` reads as one into `target`.
std::optional<std::string> parse_positive(std::string_view flag, std::string_view value,
                                          int& target);

struct TrainerOptions {
  std::string config_path;
  int steps = 0;
  bool steps_given = false;
  std::string precision;  ///< empty: as the config says
  std::string device = "auto";
  int checkpoint_every = 0;
  std::string report_json;
  std::string save_dir;
  int save_every = 0;  ///< 0: only at the end
  std::string resume_dir;
};

/// What a trainer's own parser made of a flag the shared ones do not include.
struct OwnFlag {
  bool known = false;
  std::optional<std::string> problem;
};

struct TrainerFlags {
  /// Whether `flag` is one of the trainer's switches, which take no value.
  std::function<bool(std::string_view flag)> is_switch = [](std::string_view) { return false; };
  /// Reads one of the trainer's own flags (`value` is empty for a switch).
  std::function<OwnFlag(std::string_view flag, std::string_view value)> own;
  bool steps_required = false;
  /// The trainer's checks of the whole command line, run after --config (and --steps) are
  /// found present.
  std::function<std::optional<std::string>()> check = [] { return std::nullopt; };
};

/// Returns the problem with the command line, or nothing when it is usable.
std::optional<std::string> parse_trainer_options(int argc, char** argv, TrainerOptions& options,
                                                 const TrainerFlags& flags);

}  // namespace zeroshard::examples
