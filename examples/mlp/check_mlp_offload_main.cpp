// zeroshard-check-mlp-offload: compares zeroshard-train-mlp reports pairwise, each run without
// offload followed by the same run with it: the same losses at every step, bit for bit (offload
// moves the optimizer, not its arithmetic), and the offloaded run's optimizer states in host
// memory only.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "report_pairs.h"

int main(int argc, char** argv) {
  zeroshard::examples::ReportPairs pairs(
      "zeroshard-check-mlp-offload",
      "Compares zeroshard-train-mlp reports pairwise, each run without offload followed by the "
      "same run with it.",
      "RESIDENT.json OFFLOADED.json [RESIDENT.json OFFLOADED.json ...]");
  return pairs.run(
      argc, argv, [&](const nlohmann::json& resident, const nlohmann::json& offloaded) {
        const int stage = offloaded.at("stage").get<int>();
        const auto resident_losses = resident.at("losses").get<std::vector<double>>();
        const auto offloaded_losses = offloaded.at("losses").get<std::vector<double>>();
        char line[256];
        std::snprintf(line, sizeof line,
                      "stage %d: %zu losses with offload equal the %zu without, bit for bit (final "
                      "%.9f and %.9f)",
                      stage, offloaded_losses.size(), resident_losses.size(),
                      offloaded_losses.back(), resident_losses.back());
        pairs.expect(
            resident.at("stage").get<int>() == stage && resident_losses == offloaded_losses, line);
        // A CPU run keeps every buffer in host memory, so where the states live says nothing there;
        // a GPU run must hold none on the device.
        const std::int64_t device =
            zeroshard::examples::rank0_bytes(offloaded, "optimizer_states", "current", {"device"});
        const std::int64_t host =
            zeroshard::examples::rank0_bytes(offloaded, "optimizer_states", "current", {"host"});
        std::snprintf(line, sizeof line,
                      "stage %d: rank 0's offloaded optimizer states: %lld bytes on the host, %lld "
                      "on the device",
                      stage, static_cast<long long>(host), static_cast<long long>(device));
        pairs.expect(host > 0 && device == 0, line);
      });
}
