// zeroshard-check-mlp-checkpointing: compares zeroshard-train-mlp reports pairwise, each run
// without activation checkpointing followed by the same run with it: the same losses and
// parameters, bit for bit (checkpointing recomputes, it does not change the arithmetic, and
// dropout draws the same masks), and fewer activation bytes on the device at the peak.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "report_pairs.h"

int main(int argc, char** argv) {
  zeroshard::examples::ReportPairs pairs(
      "zeroshard-check-mlp-checkpointing",
      "Compares zeroshard-train-mlp reports pairwise, each run without activation checkpointing "
      "followed by the same run with it.",
      "PLAIN.json CHECKPOINTED.json [PLAIN.json CHECKPOINTED.json ...]");
  return pairs.run(
      argc, argv, [&](const nlohmann::json& plain_run, const nlohmann::json& checkpointed_run) {
        const int stage = checkpointed_run.at("stage").get<int>();
        const int every = checkpointed_run.at("checkpoint_every").get<int>();
        const double dropout = checkpointed_run.at("dropout").get<double>();
        const std::vector<double> plain = plain_run.at("losses").get<std::vector<double>>();
        const std::vector<double> checkpointed =
            checkpointed_run.at("losses").get<std::vector<double>>();
        char line[256];
        std::snprintf(
            line, sizeof line,
            "stage %d, checkpoint every %d, dropout %g: %zu losses equal the %zu without, "
            "bit for bit (final %.9f and %.9f)",
            stage, every, dropout, checkpointed.size(), plain.size(), checkpointed.back(),
            plain.back());
        pairs.expect(plain_run.at("stage").get<int>() == stage && every > 0 &&
                         plain_run.at("checkpoint_every").get<int>() == 0 &&
                         plain_run.at("dropout").get<double>() == dropout && plain == checkpointed,
                     line);
        pairs.expect(plain_run.at("param_checksum") == checkpointed_run.at("param_checksum"),
                     "stage " + std::to_string(stage) + ": the parameter checksums are equal");
        const nlohmann::json& checkpointing = checkpointed_run.at("checkpointing");
        const bool cpu_checkpointing = checkpointing.at("cpu_checkpointing").get<bool>();
        const std::int64_t before =
            zeroshard::examples::rank0_bytes(plain_run, "activations", "peak");
        // cpu_checkpointing saves device memory by holding the kept inputs in pinned host memory
        // until backward ends (on CPU ranks the same memory, counted in the same place): those
        // are taken out, so that what is compared is what stays on the device.
        const std::int64_t after =
            zeroshard::examples::rank0_bytes(checkpointed_run, "activations", "peak") -
            (cpu_checkpointing ? checkpointing.at("peak_kept_host").get<std::int64_t>() : 0);
        std::snprintf(line, sizeof line,
                      "stage %d: rank 0's activations peak %lld bytes on the device, %lld without",
                      stage, static_cast<long long>(after), static_cast<long long>(before));
        pairs.expect(after < before, line);
        if (cpu_checkpointing) {
          const auto device = checkpointing.at("peak_kept_device").get<std::int64_t>();
          const auto host = checkpointing.at("peak_kept_host").get<std::int64_t>();
          std::snprintf(line, sizeof line,
                        "stage %d, cpu_checkpointing: kept inputs peak %lld bytes in pinned host "
                        "memory, %lld on the device",
                        stage, static_cast<long long>(host), static_cast<long long>(device));
          pairs.expect(host > 0 && device == 0, line);
        }
      });
}
