// Renders the key table as the Markdown reference in docs/config.md, so the docs cannot drift
// from what the parser accepts.
#include <sstream>

#include "config/config_schema.h"

namespace zeroshard::detail {
namespace {

std::string type_text(const KeySpec& spec) {
  std::string text = describe_expected(spec.kind, spec.range, spec.choices);
  for (const char* article : {"an ", "a "}) {
    if (text.starts_with(article)) text = text.substr(std::string_view(article).size());
  }
  return spec.fold_case ? text + " (any case)" : text;
}

std::string code_list(const std::string& choices) {
  std::string text;
  for (const std::string& choice : split_choices(choices)) {
    text += (text.empty() ? "`" : ", `") + choice + "`";
  }
  return text;
}

std::string status_text(const KeySpec& spec) {
  switch (spec.status) {
    case KeyStatus::kImplemented:
      return spec.kind == ValueKind::kSection ? "—" : "yes";
    case KeyStatus::kNoEffect:
      return "accepted, no effect (" + spec.no_effect_reason + ")";
    case KeyStatus::kRefused:
      return "default only; other values refused (not implemented in zeroshard)";
    case KeyStatus::kNotYet:
      return "default only; other values refused (not implemented yet)";
    case KeyStatus::kAlias:
      return "alias of " + code_list(spec.alias_of);
    case KeyStatus::kRemoved:
      return "rejected at any value (removed in DeepSpeed 0.19.8)";
    case KeyStatus::kDeprecatedAlias:
      if (!spec.alias_value.empty()) {
        return "deprecated: `true` means " + code_list(spec.alias_of) + " = `" + spec.alias_value +
               "`";
      }
      return "deprecated alias of " + code_list(spec.alias_of);
  }
  return "";
}

std::string meaning_text(const KeySpec& spec) {
  std::string text = spec.meaning;
  if (!spec.refused_choices.empty()) {
    text += " DeepSpeed's " + code_list(spec.refused_choices) + " are refused.";
  }
  return text;
}

std::string scheduler_param_text(const SchedulerParamSpec& param) {
  std::string text =
      "`" + param.name + "` (" + describe_expected(param.kind, param.range, param.choices);
  return text + (param.required ? ", required)" : ")");
}

}  // namespace
}  // namespace zeroshard::detail

namespace zeroshard {

std::string config_reference_markdown() {
  using namespace detail;  // the key table and the cell helpers above
  std::ostringstream os;
  os << "| key | type | default | in zeroshard | meaning |\n";
  os << "| --- | --- | --- | --- | --- |\n";
  for (const KeySpec& spec : key_specs()) {
    const bool is_alias =
        spec.status == KeyStatus::kAlias || spec.status == KeyStatus::kDeprecatedAlias;
    os << "| `" << spec.path << "` | " << type_text(spec) << " | "
       << (is_alias ? "—" : "`" + spec.default_json + "`") << " | " << status_text(spec) << " | "
       << meaning_text(spec) << " |\n";
  }
  os << "\n";
  os << "| scheduler.type | scheduler.params |\n";
  os << "| --- | --- |\n";
  for (const SchedulerSpec& scheduler : scheduler_specs()) {
    os << "| `" << scheduler.type << "` | ";
    for (std::size_t i = 0; i < scheduler.params.size(); ++i) {
      os << (i ? ", " : "") << scheduler_param_text(scheduler.params[i]);
    }
    os << " |\n";
  }
  return os.str();
}

}  // namespace zeroshard
