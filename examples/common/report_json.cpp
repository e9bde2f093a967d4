// The example trainers' shared report fields and the writing of the --report-json file.
#include "report_json.h"

#include <cmath>
#include <filesystem>
#include <fstream>

namespace zeroshard::examples {

Checksum checksum(Engine& engine) {
  Checksum c;
  engine.visit_consolidated_parameters([&c](const ConsolidatedChunk& chunk) {
    for (float p : chunk.values) {
      c.sum += p;
      c.abs_sum += std::fabs(p);
    }
  });
  return c;
}

GatheredMemory gather_memory(Communicator& communicator, const MemoryReport& report) {
  GatheredMemory gathered;
  gathered.tables = communicator.all_gather_text(report.to_table());
  gathered.json = communicator.all_gather_text(report.to_json());
  return gathered;
}

nlohmann::json run_report(const Engine& engine, const Config& config, const Device& device,
                          const RunSummary& run) {
  nlohmann::json out;
  out["final_loss"] = run.losses.back();
  out["losses"] = run.losses;
  out["param_checksum"] = {{"sum", run.final.sum}, {"abs_sum", run.final.abs_sum}};
  out["initial_param_checksum"] = {{"sum", run.initial.sum}, {"abs_sum", run.initial.abs_sum}};
  out["first_step"] = run.first_step;
  out["stage"] = engine.stage();
  out["precision"] = to_string(engine.model_dtype());
  out["world_size"] = run.world;
  out["device"] = device.to_string();
  out["parameters"] = run.parameters;
  out["padded_parameters"] = engine.padded_numel();
  out["checkpoint_every"] = run.checkpoint_every;
  if (run.checkpointer != nullptr) {
    out["checkpointing"] = {
        {"cpu_checkpointing", config.activation_checkpointing.cpu_checkpointing},
        {"recomputes", run.checkpointer->profile().recomputes},
        {"peak_kept_device", run.checkpointer->memory().peak_kept_device},
        {"peak_kept_host", run.checkpointer->memory().peak_kept_host}};
  }
  return out;
}

void write_report_json(const std::string& path, nlohmann::json report,
                       const GatheredMemory& memory) {
  report["memory"] = nlohmann::json::array();
  for (const std::string& text : memory.json)
    report["memory"].push_back(nlohmann::json::parse(text));
  // A report in a folder of its own (a test's work folder, cleaned before the run) needs no
  // separate step to make it.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ignored;
  if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
  std::ofstream file(path);
  file << report.dump(2) << '\n';
  if (!file) throw IoError("cannot write --report-json file " + path);
}

}  // namespace zeroshard::examples
