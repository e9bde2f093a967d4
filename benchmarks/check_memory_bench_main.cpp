// zeroshard-check-memory-bench: holds a zeroshard-memory-bench CSV to the estimator. Every
// configuration that ran must have each model-state category equal to the estimate and the
// model-state ratio within 2% of 1, communication buffers and the whole allocation peak within
// their bounds, and the bytes sent per step within 2% of 2P (3P at stage 3). Configurations the
// engine refused are listed; runs that failed are errors.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"

namespace {

constexpr double kTolerance = 0.02;

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

struct Row {
  std::map<std::string, std::string> fields;
  const std::string& at(const std::string& column) const {
    static const std::string kEmpty;
    const auto it = fields.find(column);
    return it == fields.end() ? kEmpty : it->second;
  }
  double number(const std::string& column) const { return std::stod(at(column)); }
  std::string label() const {
    return "N=" + at("world_size") + " rank " + at("rank") + " stage " + at("stage") + " " +
           at("precision") + " offload_optimizer " + at("offload_optimizer") + " offload_param " +
           at("offload_param");
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  if (const std::optional<int> exit_code = zeroshard::cli::parse_files(
          argc, argv, "zeroshard-check-memory-bench",
          "Holds the CSV of zeroshard-memory-bench to the estimator's figures.", "FILE.csv", 1,
          files)) {
    return *exit_code;
  }
  const std::string& path = files[0];
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) {
    std::cerr << "zeroshard-check-memory-bench: cannot read " << path << "\n";
    return 2;
  }
  const std::vector<std::string> header = split_csv(line);
  std::string ratio_column;
  for (const std::string& name : header) {
    if (name.find("ratio") != std::string::npos) ratio_column = name;
  }
  if (ratio_column.empty()) {
    std::cerr << "zeroshard-check-memory-bench: no column named *ratio* in " << path << "\n";
    return 1;
  }

  std::vector<std::string> errors;
  std::vector<std::string> refused;
  std::set<std::string> covered;  // "N stage precision" that ran
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> fields = split_csv(line);
    Row row;
    for (std::size_t i = 0; i < header.size() && i < fields.size(); ++i) {
      row.fields[header[i]] = fields[i];
    }
    const std::string& status = row.at("status");
    if (status.rfind("not supported yet", 0) == 0) {
      refused.push_back(row.label() + ": " + status);
      continue;
    }
    if (status != "ok") {
      errors.push_back(row.label() + ": " + status);
      continue;
    }
    ++checked;
    covered.insert(row.at("world_size") + " " + row.at("stage") + " " + row.at("precision"));
    const double ratio = row.number(ratio_column);
    if (std::abs(ratio - 1.0) > kTolerance) {
      errors.push_back(row.label() + ": model-state bytes " + row.at("measured_model_states") +
                       " against theory " + row.at("theory_model_states") + " (ratio " +
                       row.at(ratio_column) + ", allowed 1 +- 0.02)");
    }
    for (const char* category : {"parameters", "gradients", "master_weights", "optimizer_states"}) {
      const std::string measured = row.at(std::string("measured_") + category + "_current");
      const std::string theory = row.at(std::string("theory_") + category);
      if (measured != theory) {
        errors.push_back(row.label() + ": " + category + " " + measured +
                         " bytes, the estimator says " + theory);
      }
    }
    // The activations peak is the estimator's (estimate_activations) where the model is a chain of
    // equal layers, and the measured figure itself otherwise: equal either way.
    if (row.at("measured_activations_peak") != row.at("theory_activations")) {
      errors.push_back(row.label() + ": activations peaked at " +
                       row.at("measured_activations_peak") + " bytes, the estimator says " +
                       row.at("theory_activations"));
    }
    if (row.number("measured_communication_peak") > row.number("theory_communication")) {
      errors.push_back(row.label() + ": communication buffers peaked at " +
                       row.at("measured_communication_peak") + " bytes, over the bound " +
                       row.at("theory_communication"));
    }
    if (row.number("measured_total_peak") > row.number("theory_device_peak")) {
      errors.push_back(row.label() + ": the allocations peaked at " +
                       row.at("measured_total_peak") + " bytes, over the estimator's bound " +
                       row.at("theory_device_peak"));
    }
    if (std::abs(row.number("sent_over_theory") - 1.0) > kTolerance) {
      errors.push_back(row.label() + ": sent " + row.at("sent_bytes_per_step") +
                       " bytes per step, theory " + row.at("theory_sent_bytes_per_step"));
    }
  }
  // Every stage at every world size 1-4 must have run in fp32 at least.
  for (int n = 1; n <= 4; ++n) {
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string key = std::to_string(n) + " " + std::to_string(stage) + " fp32";
      if (!covered.count(key)) {
        errors.push_back("N=" + std::to_string(n) + " stage " + std::to_string(stage) +
                         " fp32: no measured row");
      }
    }
  }
  for (const std::string& r : refused)
    std::cout << "refused (reported, not an error): " << r << "\n";
  for (const std::string& e : errors) std::cout << "ERROR: " << e << "\n";
  std::cout << checked << " measured rows checked, " << refused.size() << " refused, "
            << errors.size() << " errors\n";
  return errors.empty() ? 0 : 1;
}
