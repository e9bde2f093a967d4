// Config's public entry points: parsing from a file or a string, and the resolved dump.
#include "zeroshard/config.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/config_parser.h"
#include "config/config_schema.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using detail::KeySpec;
using detail::KeyStatus;
using detail::ValueKind;
using nlohmann::ordered_json;

// The optimizer and scheduler sections read as null when no type was given, like DeepSpeed's
// default; their keys are then left out.
bool in_absent_section(const KeySpec& spec, const Config& config) {
  auto inside = [&spec](std::string_view section) {
    return spec.path == section || spec.path.starts_with(std::string(section) + ".");
  };
  return (inside("optimizer") && config.optimizer.type.empty()) ||
         (inside("scheduler") && config.scheduler.type.empty());
}

// Scheduler params are held as doubles; the dump shows integers and booleans as such, so that
// the dump parses again.
ordered_json scheduler_param_json(const std::string& type, const std::string& name, double value) {
  for (const detail::SchedulerParamSpec& param : detail::find_scheduler_spec(type)->params) {
    if (param.name != name) continue;
    if (param.kind == ValueKind::kInteger) return static_cast<std::int64_t>(value);
    if (param.kind == ValueKind::kBool) return value != 0.0;
  }
  return value;
}

ordered_json::json_pointer pointer_to(const std::string& dotted_path) {
  std::string pointer = "/" + dotted_path;
  for (char& c : pointer) c = c == '.' ? '/' : c;
  return ordered_json::json_pointer(pointer);
}

}  // namespace

const char* to_string(OffloadDevice device) noexcept {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "none";
}

Config Config::from_json_file(const std::string& path, int world_size,
                              const ConfigOverrides& overrides) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw IoError("cannot read config file '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open config file '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw IoError("cannot read config file '" + path + "': " + std::strerror(errno));
  return from_json_string(text.str(), world_size, overrides);
}

Config Config::from_json_string(const std::string& text, int world_size,
                                const ConfigOverrides& overrides) {
  return ConfigParser(world_size, overrides).parse(text);
}

std::string Config::resolved_json(int indent) const {
  // The key table's accessors take a mutable Config, so they read from a copy.
  Config view = *this;
  ordered_json out = ordered_json::object();
  for (const KeySpec& spec : detail::key_specs()) {
    if (spec.status == KeyStatus::kAlias || spec.status == KeyStatus::kDeprecatedAlias ||
        spec.status == KeyStatus::kNoEffect || spec.status == KeyStatus::kRemoved) {
      continue;
    }
    if (in_absent_section(spec, view)) {
      if (spec.parent().empty()) out[spec.path] = nullptr;
      continue;
    }
    ordered_json& slot = out[pointer_to(spec.path)];
    switch (spec.kind) {
      case ValueKind::kSection:
        slot = ordered_json::object();
        break;
      case ValueKind::kOpaqueSection:
        slot = ordered_json::parse(spec.default_json);
        break;
      case ValueKind::kOptimizerParams:
        slot = ordered_json::object();
        for (const auto& [name, value] : view.optimizer.params) slot[name] = value;
        for (const auto& [name, values] : view.optimizer.array_params) slot[name] = values;
        break;
      case ValueKind::kSchedulerParams:
        slot = ordered_json::object();
        for (const auto& [name, value] : view.scheduler.params) {
          slot[name] = scheduler_param_json(view.scheduler.type, name, value);
        }
        for (const auto& [name, value] : view.scheduler.string_params) slot[name] = value;
        break;
      default:
        slot = std::holds_alternative<std::monostate>(spec.field)
                   ? ordered_json::parse(spec.default_json)
                   : ordered_json::parse(detail::read_field(spec.field, view).dump());
        break;
    }
  }
  // The stored 0 of steps_per_print is DeepSpeed's null.
  if (steps_per_print == 0) out["steps_per_print"] = nullptr;
  return out.dump(indent);
}

}  // namespace zeroshard
