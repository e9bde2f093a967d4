// The one table of every config key zeroshard knows: path, type, DeepSpeed's default, meaning
// and whether zeroshard implements it. Validation, the resolved dump and docs/config.md read it.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "zeroshard/config.h"

namespace zeroshard::detail {

/// The JSON shape a key takes.
enum class ValueKind {
  kSection,        ///< an object whose keys are in the table
  kOpaqueSection,  ///< an object zeroshard does not look inside (tensorboard, ...)
  kBool,
  kInteger,  ///< an integral number; 5e8 counts, 1.5 and true do not
  kNumber,   ///< any finite number
  kString,
  kStringList,       ///< an array of strings, each one of the choices when there are any
  kOptimizerParams,  ///< optimizer.params: numbers, booleans and number arrays
  kSchedulerParams,  ///< scheduler.params: checked against the scheduler type's parameters
};

/// What zeroshard does with a key.
enum class KeyStatus {
  kImplemented,      ///< read and honoured
  kNoEffect,         ///< accepted with a notice, ignored (Python-side integrations)
  kRefused,          ///< accepted at its default only; other values are "not implemented"
  kNotYet,           ///< as kRefused, for a feature that is planned ("not implemented yet")
  kAlias,            ///< another accepted spelling of `alias_of`
  kDeprecatedAlias,  ///< an old spelling of `alias_of`; reading it adds a notice
  kRemoved,          ///< removed from the newest DeepSpeed, which rejects it at any value
};

/// Allowed numeric values: [min, max], or (min, max] when `min_exclusive`.
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;

  bool contains(double value) const;
  /// "0..3", "> 0", ">= 0", or "" when unbounded.
  std::string describe() const;
};

inline constexpr Range kAnyValue{};
inline constexpr Range kPositive{.min = 0, .min_exclusive = true};
inline constexpr Range kNonNegative{.min = 0};

/// Where a key's value lives in Config. The accessors take a mutable Config so that one table
/// serves both reading (the resolved dump) and writing (parsing).
using FieldRef =
    std::variant<std::monostate, bool& (*)(Config&), int& (*)(Config&), std::int64_t& (*)(Config&),
                 double& (*)(Config&), std::string& (*)(Config&), OffloadDevice& (*)(Config&),
                 std::optional<std::int64_t>& (*)(Config&), std::vector<std::string>& (*)(Config&),
                 std::optional<double>& (*)(Config&)>;

/// One key of the table.
struct KeySpec {
  std::string path;  ///< dotted, e.g. "zero_optimization.offload_optimizer.device"
  ValueKind kind;
  std::string default_json{};  ///< DeepSpeed's default as JSON text; "null" = none or derived
  std::string meaning;
  KeyStatus status = KeyStatus::kImplemented;
  FieldRef field{};
  Range range = kAnyValue;
  /// Allowed strings, '|'-separated; stored in this spelling. A kNumber key with choices takes
  /// them beside numbers (an std::optional<double> field, std::nullopt for "auto").
  std::string choices{};
  std::string refused_choices{};   ///< strings DeepSpeed knows that zeroshard refuses
  bool fold_case = false;          ///< choices match ignoring ASCII case
  std::string alias_of{};          ///< aliases: the target path(s), '|'-separated
  std::string alias_value{};       ///< when set, the alias is a boolean whose true sets the target
                                   ///< to this JSON value
  std::string no_effect_reason{};  ///< kNoEffect: why, for the notice
  /// kRefused/kNotYet: whether a value asks for the feature; unset = differs from the default.
  bool (*is_active)(const nlohmann::json& value) = nullptr;

  std::string name() const;    ///< the last path component
  std::string parent() const;  ///< the path without its last component ("" at the top)
  /// Whether this kRefused/kNotYet key refuses `value`, which asks for what zeroshard lacks; false
  /// for every other status.
  bool refuses(const nlohmann::json& value) const;
  /// The message refusing `value`: "got true; not implemented in zeroshard (only the default
  /// false is accepted)".
  std::string refusal(const nlohmann::json& value) const;
};

/// Every key, parents before children, in the order the docs and the dump list them.
const std::vector<KeySpec>& key_specs();
const KeySpec* find_key_spec(std::string_view path);
/// The keys directly inside `parent` ("" for the top level).
std::vector<const KeySpec*> child_specs(std::string_view parent);

/// The parameters one DeepSpeed scheduler type takes (deepspeed/runtime/lr_schedules.py).
struct SchedulerParamSpec {
  std::string name;
  ValueKind kind;  ///< kNumber, kInteger, kBool or kString
  bool required = false;
  Range range = kAnyValue;
  std::string choices{};  ///< for kString
};

struct SchedulerSpec {
  std::string type;
  std::vector<SchedulerParamSpec> params;
};

const std::vector<SchedulerSpec>& scheduler_specs();
const SchedulerSpec* find_scheduler_spec(std::string_view type);

/// Whether DeepSpeed validates the key with a pydantic model (zero_optimization, fp16, bf16),
/// whose lax mode coerces "2" to 2 and 1 or "true" to true.
bool validated_by_pydantic(std::string_view path);

/// The choices of a key as a list.
std::vector<std::string> split_choices(std::string_view choices);

/// "an integer > 0", "a boolean", "one of none, cpu, nvme": what a key accepts, for messages
/// and docs.
std::string describe_expected(ValueKind kind, const Range& range, std::string_view choices);

/// Reads a field's current value as JSON (an empty string and an unset optional read as null).
nlohmann::json read_field(const FieldRef& field, Config& config);
/// Stores an already validated JSON value into a field.
void write_field(const FieldRef& field, Config& config, const nlohmann::json& value);

}  // namespace zeroshard::detail
