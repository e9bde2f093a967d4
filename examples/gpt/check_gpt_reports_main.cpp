// zeroshard-check-gpt: compares the --report-json files of zeroshard-train-gpt runs.
//   learns RATIO REPORT...      each run's last validation loss is below RATIO x the text's
//                               unigram entropy
//   same REPORT REPORT...       every run has the first one's losses (training, per step, and
//                               validation) bit for bit, matched by step (a resumed run is
//                               compared from the step it resumed at, a shorter run up to where it
//                               ends), and when it ends at the same step, its final parameters
//   close TOLERANCE REPORT REPORT...  the same within a relative TOLERANCE; exits 77 (skipped)
//                               when a later report is missing because its run was skipped
//   final TOLERANCE REPORT REPORT...  each run's last validation loss within a relative
//                               TOLERANCE of the first run's at that step (for curves that are
//                               not aligned step by step)
//   sharded REPORT...           stage 0 first: each later run holds 1/world of its optimizer
//                               states on rank 0 (plus at most the padding's share)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
  if (!ok) ++failures;
}

nlohmann::json read(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot read " + path);
  return nlohmann::json::parse(file);
}

// Step number (1-based) -> loss, for the training and the validation losses.
std::map<int, double> training_losses(const nlohmann::json& report) {
  std::map<int, double> by_step;
  const int first = report.at("first_step").get<int>();
  const auto losses = report.at("losses").get<std::vector<double>>();
  for (std::size_t i = 0; i < losses.size(); ++i)
    by_step[first + 1 + static_cast<int>(i)] = losses[i];
  return by_step;
}

std::map<int, double> validation_losses(const nlohmann::json& report) {
  std::map<int, double> by_step;
  for (const nlohmann::json& entry : report.at("validation")) {
    by_step[entry.at("step").get<int>()] = entry.at("loss").get<double>();
  }
  return by_step;
}

// Compares `run`'s losses at the steps it has with `reference`'s; tolerance 0 means bit for bit.
void compare_curves(const char* what, const std::map<int, double>& reference,
                    const std::map<int, double>& run, double tolerance, const std::string& name) {
  int compared = 0;
  int differing = 0;
  double worst = 0.0;
  int worst_step = 0;
  for (const auto& [step, loss] : run) {
    const auto it = reference.find(step);
    if (it == reference.end()) {
      expect(false, name + ": " + what + " loss of step " + std::to_string(step) +
                        " is missing from the first run");
      return;
    }
    ++compared;
    if (loss != it->second) ++differing;
    const double relative = std::fabs(loss - it->second) / std::fabs(it->second);
    if (relative >= worst) {
      worst = relative;
      worst_step = step;
    }
  }
  char line[256];
  if (tolerance == 0.0) {
    std::snprintf(line, sizeof line,
                  "%s: %d %s losses equal the first run's bit for bit (%d differ, worst %.2e at "
                  "step %d)",
                  name.c_str(), compared, what, differing, worst, worst_step);
    expect(differing == 0 && compared > 0, line);
  } else {
    std::snprintf(line, sizeof line,
                  "%s: %d %s losses within %.1e of the first run's (worst %.2e at step %d)",
                  name.c_str(), compared, what, tolerance, worst, worst_step);
    expect(worst <= tolerance && compared > 0, line);
  }
}

// Rank 0's optimizer-state bytes, wherever they live.
std::int64_t rank0_optimizer_states(const nlohmann::json& report) {
  std::int64_t bytes = 0;
  const nlohmann::json& memory = report.at("memory").at(0);
  for (const char* location : {"host", "device"}) {
    if (memory.contains(location)) {
      bytes += memory.at(location).at("optimizer_states").at("current").get<std::int64_t>();
    }
  }
  return bytes;
}

std::string describe(const nlohmann::json& report) {
  return "stage " + std::to_string(report.at("stage").get<int>()) + " " +
         report.at("precision").get<std::string>() + " on " +
         report.at("device").get<std::string>() + " x" +
         std::to_string(report.at("world_size").get<int>());
}

// Reads the command line into `mode`, `number` and `paths`; returns as cli::parse() does.
std::optional<int> parse_command_line(int argc, char** argv, std::string& mode, double& number,
                                      std::vector<std::string>& paths) {
  struct Mode {
    const char* name;
    const char* number;   ///< the number before the reports, if the mode takes one
    std::size_t reports;  ///< at least
    const char* description;
  };
  const Mode modes[] = {
      {"learns", "RATIO", 1,
       "each run's last validation loss is below RATIO x the text's unigram entropy"},
      {"same", nullptr, 2,
       "every run has the first one's losses (training and validation) bit for bit, matched by "
       "step, and when it ends at the same step, its final parameters"},
      {"close", "TOLERANCE", 2,
       "the same within a relative TOLERANCE; exits 77 (skipped) when a later report is missing "
       "because its run was skipped"},
      {"final", "TOLERANCE", 2,
       "each run's last validation loss within a relative TOLERANCE of the first run's at that "
       "step"},
      {"sharded", nullptr, 2,
       "stage 0 first: each later run holds 1/world of its optimizer states on rank 0 (plus at "
       "most the padding's share)"},
  };
  CLI::App app("Compares the --report-json files of zeroshard-train-gpt runs.",
               "zeroshard-check-gpt");
  app.require_subcommand(1);
  for (const Mode& m : modes) {
    CLI::App* sub = app.add_subcommand(m.name, m.description);
    if (m.number != nullptr) sub->add_option(m.number, number)->required();
    sub->add_option("REPORTS", paths)
        ->type_name("REPORT")
        ->required()
        ->expected(static_cast<int>(m.reports), CLI::detail::expected_max_vector_size);
    sub->callback([&mode, name = m.name] { mode = name; });
  }
  return zeroshard::cli::parse(app, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  double number = 0.0;
  std::vector<std::string> paths;
  if (const std::optional<int> exit_code = parse_command_line(argc, argv, mode, number, paths)) {
    return *exit_code;
  }
  if (mode == "close") {
    for (const std::string& path : paths) {
      if (!std::filesystem::exists(path)) {
        std::printf("SKIPPED: %s does not exist (its run was skipped: no GPU)\n", path.c_str());
        return 77;
      }
    }
  }
  try {
    std::vector<nlohmann::json> reports;
    for (const std::string& path : paths) reports.push_back(read(path));
    const nlohmann::json& first = reports.front();
    if (mode == "learns") {
      for (std::size_t i = 0; i < reports.size(); ++i) {
        const double entropy = reports[i].at("unigram_entropy").get<double>();
        const double validation = reports[i].at("validation").back().at("loss").get<double>();
        const double initial = reports[i].at("losses").at(0).get<double>();
        char line[256];
        std::snprintf(line, sizeof line,
                      "%s: validation loss %.4f < %.2f x unigram entropy %.4f = %.4f (first "
                      "training loss %.4f)",
                      describe(reports[i]).c_str(), validation, number, entropy, number * entropy,
                      initial);
        expect(validation < number * entropy, line);
      }
    } else if (mode == "same" || mode == "close") {
      for (std::size_t i = 1; i < reports.size(); ++i) {
        const std::string name = describe(reports[i]) + " (" + paths[i] + ")";
        compare_curves("training", training_losses(first), training_losses(reports[i]), number,
                       name);
        compare_curves("validation", validation_losses(first), validation_losses(reports[i]),
                       number, name);
        const auto last_step = [](const nlohmann::json& report) {
          return report.at("first_step").get<int>() + static_cast<int>(report.at("losses").size());
        };
        // A shorter run ends elsewhere: its curve is compared, its final parameters are not.
        if (mode == "same" && last_step(reports[i]) == last_step(first)) {
          expect(reports[i].at("param_checksum") == first.at("param_checksum"),
                 name + ": final parameter checksum " + reports[i].at("param_checksum").dump() +
                     " equals the first run's " + first.at("param_checksum").dump());
        }
      }
    } else if (mode == "final") {
      const std::map<int, double> reference = validation_losses(first);
      for (std::size_t i = 1; i < reports.size(); ++i) {
        const int step = reports[i].at("validation").back().at("step").get<int>();
        const double got = reports[i].at("validation").back().at("loss").get<double>();
        const auto want = reference.find(step);
        if (want == reference.end()) {
          expect(false, describe(reports[i]) + ": the first run has no validation loss at step " +
                            std::to_string(step));
          continue;
        }
        const double relative = std::fabs(got - want->second) / want->second;
        char line[256];
        std::snprintf(line, sizeof line,
                      "%s: validation loss %.6f at step %d within %.1e of the first run's %.6f "
                      "(relative %.2e)",
                      describe(reports[i]).c_str(), got, step, number, want->second, relative);
        expect(relative <= number, line);
      }
    } else if (mode == "sharded") {
      const std::int64_t states0 = rank0_optimizer_states(first);
      const int world = first.at("world_size").get<int>();
      for (std::size_t i = 1; i < reports.size(); ++i) {
        const std::int64_t states = rank0_optimizer_states(reports[i]);
        const std::int64_t parameters = reports[i].at("parameters").get<std::int64_t>();
        const std::int64_t padded = reports[i].at("padded_parameters").get<std::int64_t>();
        const double per_element = static_cast<double>(states0) / parameters;
        const double ideal = static_cast<double>(states0) / world;
        const double slack = per_element * (padded - parameters);
        char line[256];
        std::snprintf(line, sizeof line,
                      "%s: rank 0 holds %lld optimizer-state bytes, stage 0's / %d = %.0f "
                      "(padding allows %.0f more)",
                      describe(reports[i]).c_str(), static_cast<long long>(states), world, ideal,
                      slack);
        expect(states >= ideal - per_element && states <= ideal + slack, line);
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zeroshard-check-gpt: %s\n", error.what());
    return 1;
  }
  if (failures != 0) std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
