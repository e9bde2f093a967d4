// Turns DeepSpeed-style JSON text into a validated Config: reading (duplicate keys are errors),
// resolving aliases and "auto", checking every key against the key table, cross-key checks
// and derived values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config_schema.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"

namespace zeroshard {

/// One parse; Config's friend, so that it can hand over the notices.
class ConfigParser {
 public:
  /// Throws UsageError when `world_size` < 1.
  ConfigParser(int world_size, const ConfigOverrides& overrides);

  Config parse(const std::string& text);

 private:
  void read_deprecated_zero_switch(nlohmann::json& document);
  void resolve_aliases(nlohmann::json& document);
  void read_section(const nlohmann::json& object, const std::string& prefix);
  void read_key(const detail::KeySpec& spec, const nlohmann::json& value);
  /// Checks a scalar against its kind, range and choices; returns it with a string choice in
  /// its canonical spelling.
  nlohmann::json check_scalar(const std::string& path, detail::ValueKind kind,
                              const detail::Range& range, const std::string& choices,
                              bool fold_case, const std::string& refused_choices,
                              const nlohmann::json& value);
  void read_optimizer_params(const nlohmann::json& params);
  void read_scheduler_params(const nlohmann::json& params);
  void check_combinations(const nlohmann::json& document);
  /// The NVMe swap knobs given with device cpu, where they have no effect.
  void check_nvme_only_keys() const;
  /// Remembers the first request for something zeroshard does not implement; it is raised only
  /// after every other check, so that mistakes in the file are reported first.
  void refuse(const std::string& path, const std::string& message);

  int world_size_;
  const ConfigOverrides& overrides_;
  Config config_;
  std::vector<std::string> notices_;
  std::optional<ConfigError> refusal_;
};

}  // namespace zeroshard
