// "auto" resolution, rule for rule as transformers' trainer_config_process and
// trainer_config_finalize (integrations/deepspeed.py).
#include "config/auto_values.h"

#include <optional>
#include <string>

#include "config/config_schema.h"
#include "config/config_values.h"
#include "util/text.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

using nlohmann::json;

bool is_auto(const json& value) { return value.is_string() && value.get<std::string>() == "auto"; }

bool starts_with(const std::string& path, const char* prefix) { return path.rfind(prefix, 0) == 0; }

// A key whose own values include "auto" (offload_optimizer.ratio) keeps it: no default replaces
// it and nothing fills it.
bool takes_auto_itself(const KeySpec& spec) {
  for (const std::string& choice : split_choices(spec.choices)) {
    if (choice == "auto") return true;
  }
  return false;
}

// DeepSpeed reads these sections through pydantic models (DeepSpeedConfigModel, config_utils.py),
// which drop every "auto" before validation, so its default applies; every other section passes
// "auto" on as a string, which DeepSpeed then refuses or misreads. The Trainer fills the
// precision flags itself.
bool deepspeed_drops_auto(const KeySpec& spec) {
  if (spec.kind == ValueKind::kSection || !spec.alias_of.empty()) return false;
  if (spec.path == "fp16.enabled" || spec.path == "bf16.enabled") return false;
  if (takes_auto_itself(spec)) return false;
  for (const char* section :
       {"zero_optimization.", "fp16.", "bf16.", "tensorboard.", "wandb.", "csv_monitor."}) {
    if (starts_with(spec.path, section)) return true;
  }
  return false;
}

std::string default_text(const std::string& path) {
  const KeySpec* spec = find_key_spec(path);
  const std::string value = spec != nullptr ? spec->default_json : "null";
  return value == "null" ? "DeepSpeed's default (unset, derived)" : "DeepSpeed's default " + value;
}

// The value at a dotted path, or nullptr.
json* find(json& document, const std::string& path) {
  json* node = &document;
  std::size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object() || !node->contains(key)) return nullptr;
    node = &(*node)[key];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

// Overrides by their ConfigOverrides field names ('|'-separated) and command-line flags:
// "ConfigOverrides::learning_rate (--learning-rate)".
std::string override_name(const std::string& fields) {
  std::string text;
  std::size_t start = 0;
  while (start <= fields.size()) {
    auto bar = fields.find('|', start);
    if (bar == std::string::npos) bar = fields.size();
    const std::string field = fields.substr(start, bar - start);
    std::string flag = field;
    for (char& c : flag) c = c == '_' ? '-' : c;
    text += (text.empty() ? "" : " and ") + ("ConfigOverrides::" + field + " (--" + flag + ")");
    start = bar + 1;
  }
  return text;
}

class Resolver {
 public:
  Resolver(json& document, const ConfigOverrides& overrides, int world_size,
           std::vector<std::string>& notices)
      : document_(document), overrides_(overrides), world_size_(world_size), notices_(notices) {}

  void run() {
    const std::optional<json> micro = number(overrides_.per_device_train_batch_size);
    const std::optional<json> steps = number(overrides_.gradient_accumulation_steps);
    fill_match("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size");
    fill_match("gradient_accumulation_steps", steps, "gradient_accumulation_steps");
    fill_train_batch_size();
    fill_match("gradient_clipping", number(overrides_.max_grad_norm), "max_grad_norm");
    fill_match("optimizer.params.lr", number(overrides_.learning_rate), "learning_rate");
    std::optional<json> betas;
    if (overrides_.adam_beta1 && overrides_.adam_beta2) {
      betas = json::array({*overrides_.adam_beta1, *overrides_.adam_beta2});
    }
    fill_match("optimizer.params.betas", betas, "adam_beta1|adam_beta2");
    fill_match("optimizer.params.eps", number(overrides_.adam_epsilon), "adam_epsilon");
    fill_match("optimizer.params.weight_decay", number(overrides_.weight_decay), "weight_decay");
    // Not a Trainer argument: the Trainer always fills 0.
    fill_only("scheduler.params.warmup_min_lr", json(0), "");
    fill_match("scheduler.params.warmup_max_lr", number(overrides_.learning_rate), "learning_rate");
    fill_match("scheduler.params.total_num_steps", number(overrides_.num_training_steps),
               "num_training_steps");
    fill_match("scheduler.params.warmup_num_steps", number(overrides_.warmup_steps),
               "warmup_steps");
    fill_match("fp16.enabled", flag(overrides_.fp16), "fp16");
    fill_match("bf16.enabled", flag(overrides_.bf16), "bf16");

    std::optional<json> bucket;
    std::optional<json> prefetch;
    std::optional<json> persistence;
    if (overrides_.hidden_size) {
      const std::int64_t h = *overrides_.hidden_size;
      bucket = h * h;
      // int(0.9 * h * h) in Python: the product in double, truncated.
      prefetch = static_cast<std::int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h));
      persistence = 10 * h;
    }
    fill_from_hidden_size("zero_optimization.reduce_bucket_size", bucket);
    // Below stage 3 the Trainer leaves the stage-3 sizes "auto" and DeepSpeed drops them, so
    // their defaults apply.
    if (stage() == 3) {
      fill_from_hidden_size("zero_optimization.stage3_prefetch_bucket_size", prefetch);
      fill_from_hidden_size("zero_optimization.stage3_param_persistence_threshold", persistence);
    } else {
      for (const char* path : {"zero_optimization.stage3_prefetch_bucket_size",
                               "zero_optimization.stage3_param_persistence_threshold"}) {
        drop_auto(path);
      }
    }
    for (const KeySpec& spec : key_specs()) {
      if (deepspeed_drops_auto(spec) && drop_auto(spec.path)) {
        notices_.push_back(spec.path + ": \"auto\" is " + default_text(spec.path) +
                           " (DeepSpeed drops \"auto\" in this section and the Trainer fills "
                           "nothing here)");
      }
    }
    refuse_remaining(document_, "");
  }

 private:
  template <typename T>
  static std::optional<json> number(const std::optional<T>& value) {
    return value ? std::optional<json>(*value) : std::nullopt;
  }
  static std::optional<json> flag(const std::optional<bool>& value) {
    return value ? std::optional<json>(*value) : std::nullopt;
  }

  // The Trainer's fill_match of train_batch_size with world_size * per_device_train_batch_size *
  // gradient_accumulation_steps. Each factor comes from the overrides or else the file's number;
  // once the program gives a batch override, an absent gradient_accumulation_steps is the
  // Trainer's default 1. Without a batch override a number is left to the batch-size identity.
  void fill_train_batch_size() {
    const char* const fields = "per_device_train_batch_size|gradient_accumulation_steps";
    const bool overridden =
        overrides_.per_device_train_batch_size || overrides_.gradient_accumulation_steps;
    auto factor = [this](const char* key, const std::optional<std::int64_t>& given) {
      if (given) return given;
      const json* value = find(document_, key);
      return value != nullptr ? integer_value(*value) : std::nullopt;
    };
    const auto micro =
        factor("train_micro_batch_size_per_gpu", overrides_.per_device_train_batch_size);
    auto steps = factor("gradient_accumulation_steps", overrides_.gradient_accumulation_steps);
    if (!steps && overridden && find(document_, "gradient_accumulation_steps") == nullptr)
      steps = 1;
    std::int64_t total = 0;
    if (!micro || !steps || __builtin_mul_overflow(*micro, *steps, &total) ||
        __builtin_mul_overflow(total, std::int64_t{world_size_}, &total)) {
      fill_only("train_batch_size", std::nullopt, fields);  // the identity reports an overflow
      return;
    }
    const json* given = find(document_, "train_batch_size");
    if (overridden && given != nullptr && given->is_number() && integer_value(*given) != total) {
      throw ConfigError("train_batch_size",
                        "got " + describe_value(*given) + ", but world size " +
                            std::to_string(world_size_) + " x per_device_train_batch_size " +
                            std::to_string(*micro) + " x gradient_accumulation_steps " +
                            std::to_string(*steps) + " = " + std::to_string(total) +
                            ", the Trainer's train_batch_size; give \"auto\" or sizes that agree "
                            "(an absent gradient_accumulation_steps is the Trainer's 1)");
    }
    fill_only("train_batch_size", json(total), fields);
  }

  int stage() const {
    const json* value = find(document_, "zero_optimization.stage");
    if (value == nullptr) return 0;
    // Narrowed only when it is a stage: 2^32 is no stage 0. The key's own check reports it.
    if (auto number = integer_value(*value)) {
      return *number >= 0 && *number <= 3 ? static_cast<int>(*number) : 0;
    }
    if (value->is_string()) {
      try {
        return std::stoi(value->get<std::string>());
      } catch (const std::exception&) {
      }
    }
    return 0;  // not a stage: the key's own check reports it
  }

  // Removes the key at `path` when it is "auto", so that its default applies; says whether it was.
  bool drop_auto(const std::string& path) {
    const json* value = find(document_, path);
    if (value == nullptr || !is_auto(*value)) return false;
    find(document_, path.substr(0, path.rfind('.')))->erase(path.substr(path.rfind('.') + 1));
    return true;
  }

  // fill_match: "auto" takes the override; a number must equal it.
  void fill_match(const std::string& path, const std::optional<json>& value,
                  const std::string& field) {
    json* slot = find(document_, path);
    if (slot == nullptr || !value) {
      fill_only(path, value, field);
      return;
    }
    if (is_auto(*slot)) {
      *slot = *value;
    } else if (slot->is_number() && value->is_number() &&
               slot->get<double>() != value->get<double>()) {
      throw ConfigError(path, "got " + describe_value(*slot) + ", but " + override_name(field) +
                                  " is " + describe_value(*value) +
                                  "; give \"auto\" or the same value (the Trainer's check)");
    } else if (slot->is_array() && value->is_array() && *slot != *value) {
      throw ConfigError(path, "got " + slot->dump() + ", but the overrides give " + value->dump() +
                                  "; give \"auto\" or the same value (the Trainer's check)");
    }
  }

  // The Trainer's hidden-size based sizes: without the model's hidden size to derive them from,
  // "auto" is DeepSpeed's default, as DeepSpeed alone takes it.
  void fill_from_hidden_size(const std::string& path, const std::optional<json>& value) {
    if (value) {
      fill_only(path, value, "hidden_size");
    } else if (drop_auto(path)) {
      notices_.push_back(path + ": \"auto\" is " + default_text(path) + " (no " +
                         override_name("hidden_size") +
                         " to derive it from as the Trainer does; DeepSpeed drops \"auto\")");
    }
  }

  // fill_only: "auto" takes the override; a number stays.
  void fill_only(const std::string& path, const std::optional<json>& value,
                 const std::string& field) {
    json* slot = find(document_, path);
    if (slot == nullptr || !is_auto(*slot)) return;
    if (!value) {
      throw ConfigError(path, "\"auto\" needs the program's value: pass " + override_name(field));
    }
    *slot = *value;
  }

  // Keys nothing fills, outside the sections where DeepSpeed takes its default for "auto".
  void refuse_remaining(const json& object, const std::string& prefix) {
    for (const auto& [key, value] : object.items()) {
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      // An unknown key is reported as such when the sections are read.
      const KeySpec* spec = find_key_spec(path);
      const bool known =
          spec != nullptr || prefix == "optimizer.params" || prefix == "scheduler.params";
      if (is_auto(value) && known && (spec == nullptr || !takes_auto_itself(*spec))) {
        throw ConfigError(printable_text(path),
                          "\"auto\", but no override fills this key (the Trainer fills only "
                          "batch sizes, clipping, optimizer and scheduler values, precision and "
                          "the hidden-size based sizes) and DeepSpeed's parser takes no default "
                          "for \"auto\" here (only in zero_optimization, fp16, bf16 and the "
                          "monitor sections); give a value");
      }
      if (value.is_object()) refuse_remaining(value, path);
    }
  }

  json& document_;
  const ConfigOverrides& overrides_;
  int world_size_;
  std::vector<std::string>& notices_;
};

}  // namespace

void resolve_auto_values(json& document, const ConfigOverrides& overrides, int world_size,
                         std::vector<std::string>& notices) {
  Resolver(document, overrides, world_size, notices).run();
}

}  // namespace zeroshard::detail
