// Override flags: one per ConfigOverrides field, named after it (--learning-rate for
// learning_rate), as the Trainer's arguments are.
#include "tools/config_override_flags.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zeroshard/error.h"

namespace zeroshard::tools {
namespace {

std::string bad_value(std::string_view flag, std::string_view value, const char* expected) {
  return std::string(flag) + ": got '" + std::string(value) + "', expected " + expected;
}

std::int64_t integer_at_least(std::string_view flag, std::string_view value, std::int64_t min,
                              const char* expected) {
  std::int64_t number = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size() || number < min) {
    throw UsageError(bad_value(flag, value, expected));
  }
  return number;
}

std::int64_t positive_integer(std::string_view flag, std::string_view value) {
  return integer_at_least(flag, value, 1, "an integer > 0");
}

// The Trainer's warmup_steps defaults to 0.
std::int64_t non_negative_integer(std::string_view flag, std::string_view value) {
  return integer_at_least(flag, value, 0, "an integer >= 0");
}

double finite_number(std::string_view flag, std::string_view value) {
  double number = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size() || !std::isfinite(number)) {
    throw UsageError(bad_value(flag, value, "a finite number"));
  }
  return number;
}

bool boolean(std::string_view flag, std::string_view value) {
  if (value == "true") return true;
  if (value == "false") return false;
  throw UsageError(bad_value(flag, value, "true or false"));
}

// Adds `flag`, whose text `read` turns into `field`; `fills` names the config keys it fills.
template <class T>
void add_flag(CLI::App& group, const char* flag, std::optional<T>& field,
              T (*read)(std::string_view, std::string_view), const char* type, const char* fills) {
  cli::add_read_option(
      group, flag, [flag, &field, read](const std::string& text) { field = read(flag, text); },
      fills)
      ->type_name(type);
}

}  // namespace

void add_override_flags(CLI::App& app, ConfigOverrides& overrides) {
  CLI::App& group = *app.add_option_group(
      "Values for \"auto\" in the config (as the Hugging Face Trainer fills them)");
  add_flag(group, "--per-device-train-batch-size", overrides.per_device_train_batch_size,
           positive_integer, "N", "train_micro_batch_size_per_gpu (and train_batch_size)");
  add_flag(group, "--gradient-accumulation-steps", overrides.gradient_accumulation_steps,
           positive_integer, "N", "gradient_accumulation_steps (and train_batch_size)");
  add_flag(group, "--max-grad-norm", overrides.max_grad_norm, finite_number, "X",
           "gradient_clipping");
  add_flag(group, "--learning-rate", overrides.learning_rate, finite_number, "X",
           "optimizer.params.lr, scheduler.params.warmup_max_lr");
  add_flag(group, "--adam-beta1", overrides.adam_beta1, finite_number, "X",
           "optimizer.params.betas[0]");
  add_flag(group, "--adam-beta2", overrides.adam_beta2, finite_number, "X",
           "optimizer.params.betas[1]");
  add_flag(group, "--adam-epsilon", overrides.adam_epsilon, finite_number, "X",
           "optimizer.params.eps");
  add_flag(group, "--weight-decay", overrides.weight_decay, finite_number, "X",
           "optimizer.params.weight_decay");
  add_flag(group, "--num-training-steps", overrides.num_training_steps, positive_integer, "N",
           "scheduler.params.total_num_steps");
  add_flag(group, "--warmup-steps", overrides.warmup_steps, non_negative_integer, "N",
           "scheduler.params.warmup_num_steps");
  add_flag(group, "--fp16", overrides.fp16, boolean, "true|false", "fp16.enabled");
  add_flag(group, "--bf16", overrides.bf16, boolean, "true|false", "bf16.enabled");
  add_flag(group, "--hidden-size", overrides.hidden_size, positive_integer, "H",
           "reduce_bucket_size = H*H; at stage 3 also stage3_prefetch_bucket_size = 0.9*H*H and "
           "stage3_param_persistence_threshold = 10*H");
}

}  // namespace zeroshard::tools
