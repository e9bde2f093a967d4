// The config parser: from JSON text to a validated Config, in DeepSpeed's terms.
#include "config/config_parser.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <set>

#include "config/auto_values.h"
#include "config/batch_sizes.h"
#include "config/config_checks.h"
#include "config/config_values.h"
#include "config/key_suggestion.h"
#include "util/text.h"

namespace zeroshard {
namespace {

using detail::KeySpec;
using detail::KeyStatus;
using detail::ValueKind;
using nlohmann::json;

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : ", ") + word;
  return text;
}

// A string from the file as messages show it: "cpu".
std::string quoted_text(std::string_view text) {
  return "\"" + detail::printable_text(text) + "\"";
}

ConfigError type_error(const std::string& path, const json& value, const std::string& expected) {
  return ConfigError(path, "got " + detail::describe_value(value) + ", expected " + expected);
}

// The value has the right type but lies outside `range`: "got 4, expected 0..3".
ConfigError range_error(const std::string& path, const json& value, const detail::Range& range) {
  return ConfigError(path,
                     "got " + detail::describe_value(value) + ", expected " + range.describe());
}

// Deeper than any DeepSpeed config goes (optimizer.params.betas, an array in an object in an
// object in the document, is 4) and shallow enough that every recursive walk of the document
// (nlohmann's copy and comparison, drop_auto, read_section) stays far from the end of the stack.
constexpr std::size_t kMaxNesting = 32;

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest is the useful
// part ("parse error at line 2, column 5: ..."). It may quote the token being read after
// `token_marker` ("; last read: '"); that token is the file's own text, possibly megabytes of
// any bytes, so it is escaped and cut like every value in a message.
std::string nlohmann_message(const std::string& message, std::string_view token_marker) {
  auto id_end = message.find("] ");
  std::string text = id_end == std::string::npos ? message : message.substr(id_end + 2);
  auto begin = text.find(token_marker);
  if (begin == std::string::npos) return text;
  begin += token_marker.size();
  // The token ends at its closing quote, which is followed by "; expected ..." or nothing.
  auto end = text.rfind("'; expected ");
  if (end == std::string::npos || end < begin) end = text.rfind('\'');
  if (end == std::string::npos || end < begin) end = text.size();
  return text.substr(0, begin) +
         detail::printable_text(std::string_view(text).substr(begin, end - begin)) +
         text.substr(end);
}

// Parses JSON, rejecting a key given twice in one object as DeepSpeed does
// (dict_raise_error_on_duplicate_keys) rather than silently keeping the last value, and nesting
// deeper than kMaxNesting while it is read, before a deep value is built.
json read_json(const std::string& text) {
  // One per open object or array: the length `path` had when it opened, and an object's keys.
  struct Open {
    std::size_t path_length;
    std::set<std::string> keys;
  };
  std::vector<Open> open;
  // The key being read, as messages show it. Each key replaces the previous one at its level,
  // so a key costs its own length, not the depth.
  std::string path;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (open.size() == kMaxNesting) {
          throw ConfigError(path, "objects and arrays nested more than " +
                                      std::to_string(kMaxNesting) +
                                      " deep; no DeepSpeed key needs more than 4, so look for "
                                      "a bracket opened too often");
        }
        open.push_back({path.size(), {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        path.resize(open.back().path_length);
        open.pop_back();
        break;
      case json::parse_event_t::key: {
        path.resize(open.back().path_length);
        if (!path.empty()) path += '.';
        path += detail::printable_text(parsed.get_ref<const std::string&>());
        if (!open.back().keys.insert(parsed.get_ref<const std::string&>()).second) {
          throw ConfigError(path, "given twice in one object");
        }
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  json document;
  try {
    document = json::parse(text, on_event);
  } catch (const json::parse_error& error) {
    throw ConfigError("", "invalid JSON: " + nlohmann_message(error.what(), "; last read: '"));
  } catch (const json::out_of_range& error) {
    // A number too large for a double (1e999). JSON itself has no inf or nan, so after this
    // every number the parser sees is finite. `path` still names the key being read.
    throw ConfigError(path,
                      nlohmann_message(error.what(), "parsing '") + "; expected a finite number");
  }
  if (!document.is_object()) {
    throw ConfigError("", "got " + detail::describe_value(document) +
                              " at the top level, expected a JSON object");
  }
  return document;
}

// DeepSpeed's pydantic models validate in lax mode: "2" is read as 2, 1 and "yes" as true,
// "5e-4" as 0.0005. Returns the value as the key's kind, or nullopt when pydantic refuses it too.
std::optional<json> coerce_like_pydantic(ValueKind kind, const json& value) {
  auto trimmed = [&value] {
    std::string text = value.get<std::string>();
    const auto begin = text.find_first_not_of(" \t\n\r");
    if (begin == std::string::npos) return std::string();
    return text.substr(begin, text.find_last_not_of(" \t\n\r") - begin + 1);
  };
  switch (kind) {
    case ValueKind::kBool:
      if (value.is_number()) {
        const double number = value.get<double>();
        if (number == 0.0 || number == 1.0) return json(number == 1.0);
      } else if (value.is_string()) {
        const std::string text = detail::ascii_lower(trimmed());
        for (const char* word : {"1", "on", "t", "true", "y", "yes"}) {
          if (text == word) return json(true);
        }
        for (const char* word : {"0", "off", "f", "false", "n", "no"}) {
          if (text == word) return json(false);
        }
      }
      return std::nullopt;
    case ValueKind::kInteger: {
      if (!value.is_string()) return std::nullopt;
      const std::string text = trimmed();
      std::int64_t number = 0;
      const char* begin = text.data() + (text.starts_with('+') ? 1 : 0);
      auto [end, error] = std::from_chars(begin, text.data() + text.size(), number);
      if (error != std::errc() || end != text.data() + text.size() || begin == end) {
        return std::nullopt;
      }
      return json(number);
    }
    case ValueKind::kNumber: {
      if (!value.is_string()) return std::nullopt;
      const std::string text = trimmed();
      double number = 0;
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), number);
      if (error != std::errc() || end != text.data() + text.size() || text.empty() ||
          !std::isfinite(number)) {
        return std::nullopt;
      }
      return json(number);
    }
    default:
      return std::nullopt;
  }
}

// The value at a dotted path, or nullptr when a step is missing or not an object. A template
// so that it serves both const and mutable documents.
template <typename Json>
Json* find_path(Json& document, const std::string& path) {
  Json* node = &document;
  std::size_t start = 0;
  while (true) {
    auto dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

// Sets the value at a dotted path, creating sections that are missing or null.
void set_path(json& document, const std::string& path, json value) {
  json* node = &document;
  std::size_t start = 0;
  while (true) {
    auto dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (dot == std::string::npos) {
      (*node)[key] = std::move(value);
      return;
    }
    json& child = (*node)[key];
    if (child.is_null()) child = json::object();
    if (!child.is_object()) throw type_error(path.substr(0, dot), child, "an object");
    node = &child;
    start = dot + 1;
  }
}

// An integer must be held exactly by its field, so that the resolved dump reads back the same.
void check_fits_field(const KeySpec& spec, std::int64_t number) {
  if (std::holds_alternative<int& (*)(Config&)>(spec.field) &&
      (number < INT_MIN || number > INT_MAX)) {
    throw ConfigError(
        spec.path, "got " + std::to_string(number) + ", expected an integer that fits in 32 bits");
  }
  // A double holds every integer up to 2^53 and rounds some above it.
  constexpr std::int64_t kExactInDouble = std::int64_t{1} << 53;
  if (std::holds_alternative<double& (*)(Config&)>(spec.field) &&
      (number < -kExactInDouble || number > kExactInDouble)) {
    throw ConfigError(
        spec.path, "got " + std::to_string(number) + ", expected an integer up to 2^53 = " +
                       std::to_string(kExactInDouble) + " (zeroshard holds this key as a double)");
  }
}

bool is_alias(const KeySpec& spec) {
  return spec.status == KeyStatus::kAlias || spec.status == KeyStatus::kDeprecatedAlias;
}

ConfigError unknown_key(const std::string& prefix, const std::string& key) {
  const std::string path = join_path(prefix, detail::printable_text(key));
  std::vector<std::string> names;
  std::vector<std::string> listed;
  for (const KeySpec* child : detail::child_specs(prefix)) {
    names.push_back(child->name());
    if (!is_alias(*child) && child->status != KeyStatus::kRemoved) listed.push_back(child->name());
  }
  std::string message = "unknown key" + (prefix.empty() ? "" : " in " + prefix);
  if (auto suggestion = detail::closest_match(key, names)) {
    return ConfigError(path, message + "; did you mean '" + *suggestion + "'?");
  }
  // A key at the wrong level, e.g. offload_optimizer at the top instead of in
  // zero_optimization.
  for (const KeySpec& spec : detail::key_specs()) {
    if (spec.name() == key && spec.parent() != prefix) {
      return ConfigError(path, message + "; did you mean '" + spec.path + "'? (it belongs in " +
                                   (spec.parent().empty() ? "the top level" : spec.parent()) + ")");
    }
  }
  return ConfigError(path, message + "; expected one of: " + join(listed));
}

std::string optimizer_choices() {
  return detail::describe_expected(ValueKind::kString, detail::kAnyValue,
                                   detail::find_key_spec("optimizer.type")->choices);
}

std::string scheduler_choices() {
  return detail::describe_expected(ValueKind::kString, detail::kAnyValue,
                                   detail::find_key_spec("scheduler.type")->choices);
}

}  // namespace

ConfigParser::ConfigParser(int world_size, const ConfigOverrides& overrides)
    : world_size_(world_size), overrides_(overrides) {
  if (world_size < 1) {
    throw UsageError("world_size must be at least 1, got " + std::to_string(world_size));
  }
}

Config ConfigParser::parse(const std::string& text) {
  json document = read_json(text);
  read_deprecated_zero_switch(document);
  resolve_aliases(document);
  detail::resolve_auto_values(document, overrides_, world_size_, notices_);
  read_section(document, "");
  check_combinations(document);
  config_.notices_ = std::move(notices_);
  return std::move(config_);
}

// DeepSpeed's read_zero_config_deprecated: "zero_optimization": true is stage 1 with the
// top-level allgather_size (default 5e8) as allgather_bucket_size; false is stage 0.
void ConfigParser::read_deprecated_zero_switch(json& document) {
  auto zero = document.find("zero_optimization");
  if (zero == document.end() || !zero->is_boolean()) {
    if (document.contains("allgather_size")) {
      throw ConfigError("allgather_size",
                        "applies only to the old form \"zero_optimization\": true; give "
                        "zero_optimization.allgather_bucket_size instead");
    }
    return;
  }
  const bool enabled = zero->get<bool>();
  json section = {{"stage", enabled ? 1 : 0}};
  if (auto size = document.find("allgather_size"); size != document.end()) {
    if (enabled) section["allgather_bucket_size"] = *size;
    document.erase(size);
  }
  *zero = std::move(section);
  notices_.push_back(std::string("zero_optimization: deprecated boolean form; ") +
                     (enabled ? "true means {\"stage\": 1}" : "false means {\"stage\": 0}"));
}

void ConfigParser::resolve_aliases(json& document) {
  for (const KeySpec& spec : detail::key_specs()) {
    if (!is_alias(spec)) continue;
    json* parent = spec.parent().empty() ? &document : find_path(document, spec.parent());
    if (parent == nullptr || !parent->is_object() || !parent->contains(spec.name())) continue;
    json value = std::move((*parent)[spec.name()]);
    parent->erase(spec.name());
    const bool is_switch = !spec.alias_value.empty();
    if (is_switch && !value.is_boolean()) throw type_error(spec.path, value, "a boolean");
    const std::vector<std::string> targets = detail::split_choices(spec.alias_of);
    for (const std::string& target : targets) {
      if (find_path(document, target) != nullptr) {
        throw ConfigError(spec.path,
                          std::string("given together with ") + target + ", " +
                              (spec.status == KeyStatus::kAlias ? "another spelling of the same key"
                                                                : "its new name") +
                              "; give only one");
      }
      if (!is_switch) {
        set_path(document, target, value);
      } else if (value.get<bool>()) {
        set_path(document, target, json::parse(spec.alias_value));
      }
    }
    if (spec.status == KeyStatus::kDeprecatedAlias) {
      notices_.push_back(spec.path + ": deprecated; " +
                         (is_switch ? "true means " + spec.alias_of + " " + spec.alias_value
                                    : "read as " + join(targets)));
    }
  }
}

void ConfigParser::read_section(const json& object, const std::string& prefix) {
  const std::vector<const KeySpec*> children = detail::child_specs(prefix);
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (const KeySpec* child : children) known = known || child->name() == key;
    if (!known) throw unknown_key(prefix, key);
  }
  // Table order, not file order: a section's type is read before the params that depend on it.
  for (const KeySpec* child : children) {
    auto it = object.find(child->name());
    if (it != object.end()) read_key(*child, *it);
  }
}

void ConfigParser::read_key(const KeySpec& spec, const json& value) {
  if (spec.status == KeyStatus::kRemoved) {
    throw ConfigError(spec.path,
                      "removed in DeepSpeed 0.19.8, which rejects it at any value; remove the key");
  }
  if (value.is_null()) {
    if (spec.default_json == "null") return;
    throw type_error(spec.path, value,
                     detail::describe_expected(spec.kind, spec.range, spec.choices));
  }
  switch (spec.kind) {
    case ValueKind::kSection:
    case ValueKind::kOpaqueSection:
      if (!value.is_object()) throw type_error(spec.path, value, "an object");
      if (spec.kind == ValueKind::kSection) read_section(value, spec.path);
      break;
    case ValueKind::kOptimizerParams:
      read_optimizer_params(value);
      break;
    case ValueKind::kStringList: {
      const std::string expected = detail::describe_expected(spec.kind, spec.range, spec.choices);
      if (!value.is_array()) throw type_error(spec.path, value, expected);
      json checked = json::array();
      for (std::size_t i = 0; i < value.size(); ++i) {
        checked.push_back(check_scalar(spec.path + "[" + std::to_string(i) + "]",
                                       ValueKind::kString, spec.range, spec.choices, spec.fold_case,
                                       spec.refused_choices, value[i]));
      }
      detail::write_field(spec.field, config_, checked);
      break;
    }
    case ValueKind::kSchedulerParams:
      read_scheduler_params(value);
      break;
    case ValueKind::kBool:
    case ValueKind::kInteger:
    case ValueKind::kNumber:
    case ValueKind::kString: {
      json checked = check_scalar(spec.path, spec.kind, spec.range, spec.choices, spec.fold_case,
                                  spec.refused_choices, value);
      if (spec.kind == ValueKind::kInteger) check_fits_field(spec, *detail::integer_value(checked));
      detail::write_field(spec.field, config_, checked);
      if (spec.refuses(checked)) refuse(spec.path, spec.refusal(checked));
      break;
    }
  }
  if (spec.kind == ValueKind::kOpaqueSection && spec.status == KeyStatus::kRefused) {
    if (!spec.is_active) {
      refuse(spec.path, "got an object; not implemented in zeroshard (only null is accepted)");
    } else if (spec.is_active(value)) {
      refuse(spec.path + ".enabled", "got " + detail::describe_value(value["enabled"]) +
                                         "; not implemented in zeroshard (only false is accepted)");
    }
  }
  if (spec.status == KeyStatus::kNoEffect) {
    notices_.push_back(spec.path + ": accepted, has no effect in zeroshard (" +
                       spec.no_effect_reason + ")");
  }
}

json ConfigParser::check_scalar(const std::string& path, ValueKind kind, const detail::Range& range,
                                const std::string& choices, bool fold_case,
                                const std::string& refused_choices, const json& given) {
  const std::string expected = detail::describe_expected(kind, range, choices);
  std::optional<json> coerced;
  if (detail::validated_by_pydantic(path)) coerced = coerce_like_pydantic(kind, given);
  const json& value = coerced ? *coerced : given;
  switch (kind) {
    case ValueKind::kBool:
      if (!value.is_boolean()) throw type_error(path, value, expected);
      return value;
    case ValueKind::kInteger: {
      auto number = detail::integer_value(value);
      if (!number) throw type_error(path, value, expected);
      if (!range.contains(static_cast<double>(*number))) throw range_error(path, value, range);
      return *number;
    }
    case ValueKind::kNumber: {
      for (const std::string& choice : detail::split_choices(choices)) {
        if (value.is_string() && value.get<std::string>() == choice) return value;
      }
      if (!value.is_number()) throw type_error(path, value, expected);
      if (!range.contains(value.get<double>())) throw range_error(path, value, range);
      return value;
    }
    case ValueKind::kString: {
      if (!value.is_string()) throw type_error(path, value, expected);
      const std::string text = value.get<std::string>();
      if (choices.empty()) return value;
      auto same = [fold_case](const std::string& a, const std::string& b) {
        if (a.size() != b.size()) return false;
        return fold_case ? detail::ascii_lower(a) == detail::ascii_lower(b) : a == b;
      };
      const std::vector<std::string> allowed = detail::split_choices(choices);
      for (const std::string& choice : allowed) {
        if (same(choice, text)) return choice;
      }
      for (const std::string& choice : detail::split_choices(refused_choices)) {
        if (same(choice, text)) {
          refuse(path, "got " + quoted_text(text) + "; " + choice +
                           " is not implemented in zeroshard (expected " + expected + ")");
          return choice;
        }
      }
      std::string message = "got " + quoted_text(text) + ", expected " + expected;
      if (auto suggestion = detail::closest_match(text, allowed)) {
        message += "; did you mean '" + *suggestion + "'?";
      }
      throw ConfigError(path, message);
    }
    default:
      throw type_error(path, value, expected);
  }
}

void ConfigParser::read_optimizer_params(const json& params) {
  if (!params.is_object()) throw type_error("optimizer.params", params, "an object");
  if (config_.optimizer.type.empty()) {
    throw ConfigError("optimizer.type",
                      "missing, but optimizer.params is given; expected " + optimizer_choices());
  }
  for (const auto& [name, value] : params.items()) {
    const std::string path = "optimizer.params." + detail::printable_text(name);
    const std::string expected = "a number, a boolean or an array of numbers";
    if (value.is_boolean()) {
      config_.optimizer.params[name] = value.get<bool>() ? 1.0 : 0.0;
    } else if (value.is_number()) {
      config_.optimizer.params[name] =
          check_scalar(path, ValueKind::kNumber, detail::kAnyValue, "", false, "", value)
              .get<double>();
    } else if (value.is_array()) {
      std::vector<double> numbers;
      for (const json& element : value) {
        if (!element.is_number()) {
          throw ConfigError(path, "got an array holding " + detail::describe_value(element) +
                                      ", expected " + expected);
        }
        numbers.push_back(element.get<double>());
      }
      config_.optimizer.array_params[name] = std::move(numbers);
    } else {
      throw type_error(path, value, expected);
    }
  }
}

void ConfigParser::read_scheduler_params(const json& params) {
  if (!params.is_object()) throw type_error("scheduler.params", params, "an object");
  const detail::SchedulerSpec* scheduler = detail::find_scheduler_spec(config_.scheduler.type);
  if (scheduler == nullptr) {
    throw ConfigError("scheduler.type",
                      "missing, but scheduler.params is given; expected " + scheduler_choices());
  }
  for (const auto& [name, value] : params.items()) {
    const std::string path = "scheduler.params." + detail::printable_text(name);
    const detail::SchedulerParamSpec* param = nullptr;
    std::vector<std::string> names;
    for (const detail::SchedulerParamSpec& candidate : scheduler->params) {
      names.push_back(candidate.name);
      if (candidate.name == name) param = &candidate;
    }
    if (param == nullptr) {
      std::string message = "unknown param of " + scheduler->type;
      if (auto suggestion = detail::closest_match(name, names)) {
        message += "; did you mean '" + *suggestion + "'?";
      }
      throw ConfigError(path, message + " (" + scheduler->type + " takes " + join(names) + ")");
    }
    json checked = check_scalar(path, param->kind, param->range, param->choices, false, "", value);
    if (checked.is_string()) {
      config_.scheduler.string_params[name] = checked.get<std::string>();
    } else if (checked.is_boolean()) {
      config_.scheduler.params[name] = checked.get<bool>() ? 1.0 : 0.0;
    } else {
      config_.scheduler.params[name] = checked.get<double>();
    }
  }
}

void ConfigParser::check_combinations(const json& document) {
  check_key_combinations(config_);
  ZeroConfig& zero = config_.zero_optimization;

  auto given = [&document](const char* key) -> std::optional<std::int64_t> {
    auto it = document.find(key);
    if (it == document.end() || it->is_null()) return std::nullopt;
    return *detail::integer_value(*it);
  };
  detail::BatchSizes batch = detail::resolve_batch_sizes(
      given("train_batch_size"), given("train_micro_batch_size_per_gpu"),
      given("gradient_accumulation_steps"), world_size_);
  config_.train_batch_size = batch.train_batch_size;
  config_.train_micro_batch_size_per_gpu = batch.train_micro_batch_size_per_gpu;
  config_.gradient_accumulation_steps = batch.gradient_accumulation_steps;

  // DeepSpeed ORs the profiler's switch into wall_clock_breakdown (config.py), so that the
  // profile has the step's timings beside it.
  const json* profiler = find_path(document, "flops_profiler.enabled");
  if (profiler != nullptr && *profiler == true) config_.wall_clock_breakdown = true;

  // DeepSpeed's overlap_comm_valid: unset means on for stage 3 only.
  const json* overlap = find_path(document, "zero_optimization.overlap_comm");
  if (overlap == nullptr || overlap->is_null()) zero.overlap_comm = zero.stage == 3;

  // DeepSpeed's stage 0 is not ZeRO: it all-reduces whatever reduce_scatter says, as DDP does.
  // Given at stage 0, true asks for stages 1-3's reduce-scatter followed by a gather of the sums,
  // which trains bit for bit as they do (docs/step-floor-results.md: within 5% of the all-reduce
  // on 2 ranks, 9-53% slower on 4 ranks sharing 2 cores).
  const json* scatter = find_path(document, "zero_optimization.reduce_scatter");
  if (zero.stage == 0 && (scatter == nullptr || scatter->is_null())) zero.reduce_scatter = false;

  if (refusal_) throw *refusal_;
  check_config(config_);
  check_nvme_only_keys();
}

// Kept out of check_config(): these ask to remove a key from the file. In a Config built in code
// the swap knobs have no effect with device cpu, and an OffloadConfig{} assigned to offload_param
// carries the optimizer's buffer_count.
void ConfigParser::check_nvme_only_keys() const {
  const ZeroConfig& zero = config_.zero_optimization;
  for (const OffloadSection& offload : offload_sections(zero)) {
    const std::string path(offload.path);
    if (offload.config.device != OffloadDevice::kCpu) continue;
    // With device cpu every element stays in CPU memory: the NVMe swap knobs have nothing to act
    // on. DeepSpeed ignores them there; zeroshard says so rather than pretend they took effect.
    const OffloadConfig defaults = &offload.config == &zero.offload_param
                                       ? ZeroConfig::param_offload_defaults()
                                       : OffloadConfig{};
    const auto nvme_only = [&](const char* key, bool differs) {
      if (differs) {
        throw ConfigError(path + "." + key,
                          "applies to device \"nvme\" only; with device \"cpu\" remove it "
                          "(every element stays in CPU memory, no swap buffers are used)");
      }
    };
    nvme_only("nvme_path", !offload.config.nvme_path.empty());
    nvme_only("buffer_count", offload.config.buffer_count != defaults.buffer_count);
    nvme_only("buffer_size", offload.config.buffer_size != defaults.buffer_size);
    nvme_only("pipeline_read", offload.config.pipeline_read);
    nvme_only("pipeline_write", offload.config.pipeline_write);
    nvme_only("fast_init", offload.config.fast_init);
  }
}

void ConfigParser::refuse(const std::string& path, const std::string& message) {
  if (!refusal_) refusal_.emplace(path, message);
}

}  // namespace zeroshard
