// Damage for the checkpoint manifest fuzz tests: every leaf of a manifest, and the values put in
// each one in turn (numbers far out of any range, negative and fractional ones, and values of the
// wrong JSON type).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zeroshard::testing {

inline std::vector<nlohmann::json> manifest_mutations() {
  return {std::numeric_limits<std::int64_t>::max(),
          std::numeric_limits<std::int64_t>::min(),
          std::numeric_limits<std::uint64_t>::max(),
          std::int64_t{1} << 53,
          std::int64_t{1} << 32,
          std::int64_t{1} << 31,
          -1,
          0,
          0.5,
          1e300,
          -1e300,
          "x",
          nullptr,
          true,
          nlohmann::json::array(),
          nlohmann::json::object()};
}

/// The JSON pointers of the leaves of `manifest`; with `first_elements`, of the first element of
/// each array only (every element of an array is read alike).
inline std::vector<nlohmann::json::json_pointer> manifest_leaves(const nlohmann::json& manifest,
                                                                 bool first_elements) {
  std::vector<nlohmann::json::json_pointer> leaves;
  const nlohmann::json flat = manifest.flatten();
  for (const auto& [pointer, value] : flat.items()) {
    nlohmann::json::json_pointer path(pointer);
    bool first = true;
    for (nlohmann::json::json_pointer p = path; !p.empty(); p = p.parent_pointer()) {
      const std::string& token = p.back();
      first =
          first && !(token.find_first_not_of("0123456789") == std::string::npos && token != "0");
    }
    if (!first_elements || first) leaves.push_back(path);
  }
  return leaves;
}

}  // namespace zeroshard::testing
