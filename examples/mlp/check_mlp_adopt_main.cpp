// zeroshard-check-mlp-adopt: compares zeroshard-train-mlp reports pairwise, each run with
// engine-owned buffers followed by the same run with --adopt-memory: the same losses and
// parameters bit for bit, the model's blocks listed as adopted, and at stages 0-1 no parameter or
// gradient buffer of the engine's beside them. Prints the bytes per rank of every run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "report_pairs.h"

namespace {

using zeroshard::examples::most_per_rank;

std::string row(const nlohmann::json& r) {
  char line[256];
  std::snprintf(line, sizeof line,
                "| %d | %s | %s | %lld (%lld adopted) | %lld (%lld adopted) | %lld | %lld | %lld |",
                r.at("stage").get<int>(), r.at("grad_handover").get<std::string>().c_str(),
                r.at("adopt_memory").get<bool>() ? "adopted" : "owned",
                static_cast<long long>(most_per_rank(r, "parameters", "peak")),
                static_cast<long long>(most_per_rank(r, "parameters", "adopted")),
                static_cast<long long>(most_per_rank(r, "gradients", "peak")),
                static_cast<long long>(most_per_rank(r, "gradients", "adopted")),
                static_cast<long long>(most_per_rank(r, "optimizer_states", "peak")),
                static_cast<long long>(most_per_rank(r, "communication", "peak")),
                static_cast<long long>(most_per_rank(r, "total_peak")));
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  zeroshard::examples::ReportPairs pairs(
      "zeroshard-check-mlp-adopt",
      "Compares zeroshard-train-mlp reports pairwise, each run with engine-owned buffers followed "
      "by the same run with --adopt-memory.",
      "OWNED.json ADOPTED.json [OWNED.json ADOPTED.json ...]");
  std::vector<std::string> rows;
  const int code =
      pairs.run(argc, argv, [&](const nlohmann::json& owned, const nlohmann::json& adopted) {
        const int stage = adopted.at("stage").get<int>();
        const std::string handover = adopted.at("grad_handover").get<std::string>();
        char line[320];
        std::snprintf(line, sizeof line,
                      "stage %d, %s: the pair is an owned run and its adopted twin", stage,
                      handover.c_str());
        pairs.expect(
            owned.at("stage").get<int>() == stage && owned.at("grad_handover") == handover &&
                !owned.at("adopt_memory").get<bool>() && adopted.at("adopt_memory").get<bool>(),
            line);
        std::snprintf(line, sizeof line,
                      "stage %d, %s: losses and parameter checksum in the model's memory equal the "
                      "engine-owned run's, bit for bit (final loss %.9f)",
                      stage, handover.c_str(), adopted.at("final_loss").get<double>());
        pairs.expect(adopted.at("losses") == owned.at("losses") &&
                         adopted.at("param_checksum") == owned.at("param_checksum"),
                     line);
        const std::int64_t block = adopted.at("padded_parameters").get<std::int64_t>() * 4;
        const std::int64_t params_adopted = most_per_rank(adopted, "parameters", "adopted");
        const std::int64_t grads_adopted = most_per_rank(adopted, "gradients", "adopted");
        std::snprintf(line, sizeof line,
                      "stage %d, %s: the report lists the model's blocks as adopted (%lld and %lld "
                      "bytes, %lld each expected)",
                      stage, handover.c_str(), static_cast<long long>(params_adopted),
                      static_cast<long long>(grads_adopted), static_cast<long long>(block));
        pairs.expect(params_adopted == block && grads_adopted == block, line);
        if (stage <= 1) {
          const std::int64_t params = most_per_rank(adopted, "parameters", "peak");
          const std::int64_t grads = most_per_rank(adopted, "gradients", "peak");
          std::snprintf(line, sizeof line,
                        "stage %d, %s: no copy: parameter and gradient peaks (%lld, %lld) are the "
                        "model's blocks alone",
                        stage, handover.c_str(), static_cast<long long>(params),
                        static_cast<long long>(grads));
          pairs.expect(params == block && grads == block, line);
        }
        rows.push_back(row(owned));
        rows.push_back(row(adopted));
      });
  std::printf(
      "\n| stage | handover | memory | parameters | gradients | optimizer states | communication "
      "| total peak per rank |\n|---|---|---|---|---|---|---|---|\n");
  for (const std::string& r : rows) std::printf("%s\n", r.c_str());
  std::printf("\n(bytes, peaks over the training steps, the most any rank held)\n");
  return code;
}
