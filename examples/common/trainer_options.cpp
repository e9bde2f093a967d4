// The example trainers' shared flags, read in the order they appear on the command line; the
// first problem found is the one reported.
#include "trainer_options.h"

namespace zeroshard::examples {

std::optional<std::string> parse_positive(std::string_view flag, std::string_view value,
                                          int& target) {
  if (!parse_number(value, target) || target <= 0) {
    return std::string(flag) + ": expected a positive integer, got '" + std::string(value) + "'";
  }
  return std::nullopt;
}

namespace {

// Reads one shared flag; nothing when `flag` is not one of them.
std::optional<std::optional<std::string>> parse_shared_flag(std::string_view flag,
                                                            std::string_view value,
                                                            TrainerOptions& options) {
  std::optional<std::string> problem;
  if (flag == "--config") {
    options.config_path = value;
  } else if (flag == "--steps") {
    problem = parse_positive(flag, value, options.steps);
    options.steps_given = true;
  } else if (flag == "--precision") {
    if (value != "fp32" && value != "fp16" && value != "bf16") {
      problem = "--precision: expected fp32, fp16 or bf16, got '" + std::string(value) + "'";
    }
    options.precision = value;
  } else if (flag == "--device") {
    if (value != "cpu" && value != "cuda" && value != "auto") {
      problem = "--device: expected cpu, cuda or auto, got '" + std::string(value) + "'";
    }
    options.device = value;
  } else if (flag == "--checkpoint-every") {
    if (!parse_number(value, options.checkpoint_every) || options.checkpoint_every < 0) {
      problem =
          "--checkpoint-every: expected a non-negative integer, got '" + std::string(value) + "'";
    }
  } else if (flag == "--report-json") {
    options.report_json = value;
  } else if (flag == "--save-dir") {
    options.save_dir = value;
  } else if (flag == "--save-every") {
    problem = parse_positive(flag, value, options.save_every);
  } else if (flag == "--resume") {
    options.resume_dir = value;
  } else {
    return std::nullopt;
  }
  return problem;
}

}  // namespace

std::optional<std::string> parse_trainer_options(int argc, char** argv, TrainerOptions& options,
                                                 const TrainerFlags& flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flags.is_switch(flag)) {
      const OwnFlag own = flags.own(flag, {});
      if (own.problem) return own.problem;
      continue;
    }
    if (i + 1 >= argc) return "missing value after " + std::string(flag);
    const std::string_view value = argv[++i];
    if (std::optional<std::optional<std::string>> shared =
            parse_shared_flag(flag, value, options)) {
      if (*shared) return *shared;
      continue;
    }
    const OwnFlag own = flags.own(flag, value);
    if (!own.known) return "unknown flag " + std::string(flag);
    if (own.problem) return own.problem;
  }
  if (options.config_path.empty()) return "--config is required";
  if (flags.steps_required && !options.steps_given) return "--steps is required";
  if (std::optional<std::string> problem = flags.check()) return problem;
  if (options.save_every > 0 && options.save_dir.empty()) return "--save-every needs --save-dir";
  return std::nullopt;
}

}  // namespace zeroshard::examples
