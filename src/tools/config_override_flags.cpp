// Override flags: one per ConfigOverrides field, named after it (--learning-rate for
// learning_rate), as the Trainer's arguments are.
#include "tools/config_override_flags.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::tools {
namespace {

std::string bad_value(std::string_view flag, std::string_view value, const char* expected) {
  return std::string(flag) + ": got '" + std::string(value) + "', expected " + expected;
}

std::int64_t positive_integer(std::string_view flag, std::string_view value) {
  std::int64_t number = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size() || number < 1) {
    throw UsageError(bad_value(flag, value, "an integer > 0"));
  }
  return number;
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

struct Flag {
  const char* name;
  void (*apply)(std::string_view flag, std::string_view value, ConfigOverrides& overrides);
};

// One line per ConfigOverrides field.
#define ZEROSHARD_OVERRIDE(flag, field, read)                                                     \
  Flag {                                                                                          \
    flag,                                                                                         \
        +[](std::string_view f, std::string_view v, ConfigOverrides& o) { o.field = read(f, v); } \
  }

const Flag kFlags[] = {
    ZEROSHARD_OVERRIDE("--per-device-train-batch-size", per_device_train_batch_size,
                       positive_integer),
    ZEROSHARD_OVERRIDE("--gradient-accumulation-steps", gradient_accumulation_steps,
                       positive_integer),
    ZEROSHARD_OVERRIDE("--max-grad-norm", max_grad_norm, finite_number),
    ZEROSHARD_OVERRIDE("--learning-rate", learning_rate, finite_number),
    ZEROSHARD_OVERRIDE("--adam-beta1", adam_beta1, finite_number),
    ZEROSHARD_OVERRIDE("--adam-beta2", adam_beta2, finite_number),
    ZEROSHARD_OVERRIDE("--adam-epsilon", adam_epsilon, finite_number),
    ZEROSHARD_OVERRIDE("--weight-decay", weight_decay, finite_number),
    ZEROSHARD_OVERRIDE("--num-training-steps", num_training_steps, positive_integer),
    ZEROSHARD_OVERRIDE("--warmup-steps", warmup_steps, positive_integer),
    ZEROSHARD_OVERRIDE("--fp16", fp16, boolean),
    ZEROSHARD_OVERRIDE("--bf16", bf16, boolean),
    ZEROSHARD_OVERRIDE("--hidden-size", hidden_size, positive_integer),
};

#undef ZEROSHARD_OVERRIDE

}  // namespace

const char* const kOverrideFlagsHelp =
    R"(Values for "auto" in the config (as the Hugging Face Trainer fills them):
  --per-device-train-batch-size N   train_micro_batch_size_per_gpu (and train_batch_size)
  --gradient-accumulation-steps N   gradient_accumulation_steps (and train_batch_size)
  --max-grad-norm X                 gradient_clipping
  --learning-rate X                 optimizer.params.lr, scheduler.params.warmup_max_lr
  --adam-beta1 X --adam-beta2 X     optimizer.params.betas
  --adam-epsilon X                  optimizer.params.eps
  --weight-decay X                  optimizer.params.weight_decay
  --num-training-steps N            scheduler.params.total_num_steps
  --warmup-steps N                  scheduler.params.warmup_num_steps
  --fp16 true|false, --bf16 true|false   fp16.enabled, bf16.enabled
  --hidden-size H                   reduce_bucket_size = H*H; at stage 3 also
                                    stage3_prefetch_bucket_size = 0.9*H*H and
                                    stage3_param_persistence_threshold = 10*H
)";

bool is_override_flag(std::string_view flag) {
  for (const Flag& known : kFlags) {
    if (flag == known.name) return true;
  }
  return false;
}

void apply_override_flag(std::string_view flag, std::string_view value,
                         ConfigOverrides& overrides) {
  for (const Flag& known : kFlags) {
    if (flag == known.name) return known.apply(flag, value, overrides);
  }
  throw UsageError("unknown option " + std::string(flag));
}

}  // namespace zeroshard::tools
