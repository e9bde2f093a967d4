// The checks a whole Config must pass before the engine builds from it (see config_checks.h).
#include "config/config_checks.h"

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "config/config_schema.h"
#include "util/text.h"
#include "zeroshard/error.h"
#include "zeroshard/lr_scheduler.h"  // make_lr_scheduler
#include "zeroshard/optimizer.h"     // make_update_rule

namespace zeroshard {
namespace {

// Keys accepted only at their default that have a field, so that a Config built in code can ask
// for them too.
void check_refused_fields(const Config& config) {
  Config view = config;  // the key table's accessors take a mutable Config
  for (const detail::KeySpec& spec : detail::key_specs()) {
    if (std::holds_alternative<std::monostate>(spec.field)) continue;
    const nlohmann::json value = detail::read_field(spec.field, view);
    if (spec.refuses(value)) throw ConfigError(spec.path, spec.refusal(value));
  }
}

std::string quoted(OffloadDevice device) { return std::string("\"") + to_string(device) + "\""; }

void check_precision(const Config& config) {
  if (config.fp16.enabled && config.bf16.enabled) {
    throw ConfigError("bf16.enabled",
                      "fp16.enabled and bf16.enabled are both true; enable at most one");
  }
}

// Without a folder the swapper would write its files into the working directory.
void check_nvme_paths(const ZeroConfig& zero) {
  for (const OffloadSection& offload : offload_sections(zero)) {
    if (offload.config.device == OffloadDevice::kNvme && offload.config.nvme_path.empty()) {
      throw ConfigError(std::string(offload.path) + ".nvme_path",
                        "missing; required when device is \"nvme\"");
    }
  }
}

// Parameters are partitioned, and so can leave the device, at stage 3 only; stage 0 keeps the
// whole optimizer state on every rank, which has no shard to offload.
void check_offload_stages(const ZeroConfig& zero) {
  const std::string stage = "zero_optimization.stage " + std::to_string(zero.stage);
  if (zero.offload_param.device != OffloadDevice::kNone && zero.stage < 3) {
    throw ConfigError("zero_optimization.offload_param.device",
                      "got " + quoted(zero.offload_param.device) + " at " + stage +
                          "; parameter offload needs stage 3");
  }
  if (zero.offload_optimizer.device != OffloadDevice::kNone && zero.stage == 0) {
    throw ConfigError("zero_optimization.offload_optimizer.device",
                      "got " + quoted(zero.offload_optimizer.device) + " at " + stage +
                          "; optimizer offload needs stage 1, 2 or 3");
  }
}

// Integer keys in their table range, as the parser holds a file's values to it. A field left at
// its default is not checked: some defaults stand for "derived" (train_batch_size 0).
void check_integer_ranges(const Config& config) {
  Config view = config;  // the key table's accessors take a mutable Config
  Config defaults;
  for (const detail::KeySpec& spec : detail::key_specs()) {
    if (spec.kind != detail::ValueKind::kInteger ||
        std::holds_alternative<std::monostate>(spec.field)) {
      continue;
    }
    const nlohmann::json value = detail::read_field(spec.field, view);
    if (!value.is_number_integer() || value == detail::read_field(spec.field, defaults)) continue;
    const double number = value.get<double>();
    if (!spec.range.contains(number)) {
      throw ConfigError(spec.path, "got " + value.dump() + ", expected " + spec.range.describe());
    }
  }
}

void check_offload_devices(const ZeroConfig& zero) {
  if (zero.offload_param.device != OffloadDevice::kNvme ||
      zero.offload_optimizer.device == OffloadDevice::kNvme) {
    return;
  }
  // The update writes the parameter shard's swap file as it goes; only a master and states on
  // NVMe can go back to the step's start when one of those writes fails on some rank.
  throw ConfigError("zero_optimization.offload_param.device",
                    "got \"nvme\" with offload_optimizer.device " +
                        quoted(zero.offload_optimizer.device) +
                        "; parameters on NVMe need the optimizer states on NVMe too, so that a "
                        "failed write rolls the whole step back: set "
                        "zero_optimization.offload_optimizer.device to \"nvme\", or keep the "
                        "parameters in CPU memory with \"cpu\"");
}

// The ZeRO++ keys work on what only stage 3 has: qwZ quantizes its per-module parameter gathers,
// the frozen weights are decoded when their module is gathered (below stage 3 the model reads
// them whenever it likes, so they would stay decoded and nothing would be saved), hpZ keeps a
// secondary partition of the gathered parameters, and qgZ quantizes the gradient reduce-scatter
// (DeepSpeed offers it at stage 3 only).
void check_stage_three_keys(const ZeroConfig& zero) {
  if (zero.stage == 3) return;
  struct StageThreeKey {
    bool set;
    const char* name;
    std::string value;
    const char* needs;
    const char* off;
  };
  const StageThreeKey keys[] = {
      {zero.quantized_weights, "zero_quantized_weights", "true",
       "quantized weight gathers need stage 3", "remove the key"},
      {zero.quantized_nontrainable_weights, "zero_quantized_nontrainable_weights", "true",
       "frozen weights are decoded when their module is gathered, which needs stage 3",
       "remove the key"},
      {zero.hpz_partition_size != 1, "zero_hpz_partition_size",
       std::to_string(zero.hpz_partition_size), "the secondary parameter partition needs stage 3",
       "set the key to 1"},
      {zero.quantized_gradients, "zero_quantized_gradients", "true",
       "quantized gradient reduction needs stage 3", "remove the key"},
  };
  for (const StageThreeKey& key : keys) {
    if (!key.set) continue;
    throw ConfigError(std::string("zero_optimization.") + key.name,
                      "got " + key.value + " at zero_optimization.stage " +
                          std::to_string(zero.stage) + "; " + key.needs +
                          ": set the stage to 3, or " + key.off);
  }
}

// The engine sizes the contiguous buffer from number_checkpoints when it keeps its first input.
void check_activation_checkpointing(const ActivationCheckpointingConfig& checkpointing) {
  if (checkpointing.contiguous_memory_optimization && !checkpointing.number_checkpoints) {
    throw ConfigError("activation_checkpointing.number_checkpoints",
                      "missing; required by contiguous_memory_optimization, whose buffer holds "
                      "that many kept inputs");
  }
  if (!checkpointing.contiguous_memory_optimization && checkpointing.number_checkpoints) {
    throw ConfigError("activation_checkpointing.number_checkpoints",
                      "applies only with contiguous_memory_optimization: true (it sizes that "
                      "buffer); remove it or enable the optimization");
  }
}

void check_required_scheduler_params(const SchedulerConfig& scheduler) {
  const detail::SchedulerSpec* spec = detail::find_scheduler_spec(scheduler.type);
  if (spec == nullptr) return;
  for (const detail::SchedulerParamSpec& param : spec->params) {
    if (param.required && !scheduler.params.contains(param.name)) {
      throw ConfigError("scheduler.params." + param.name, "missing; required by " + spec->type);
    }
  }
}

// The parser holds the key to [0, 1]; a Config built in code is held to (0, 1] here. Below 1
// the device keeps the rest of the shard, which swap files cannot roll back with the host's part
// when a write fails: NVMe takes the whole shard.
void check_offload_ratio(const OffloadConfig& offload) {
  const char* const path = "zero_optimization.offload_optimizer.ratio";
  const std::string given =
      offload.ratio ? "got " + detail::format_number(*offload.ratio) : std::string("got \"auto\"");
  if (offload.ratio && !(*offload.ratio > 0.0 && *offload.ratio <= 1.0)) {
    throw ConfigError(path, given +
                                ", expected the share of the optimizer offloaded, in (0, 1], or "
                                "\"auto\"; to keep all of it on the device, set "
                                "offload_optimizer.device to \"none\"");
  }
  if (offload.ratio.value_or(0.0) < 1.0 && offload.device == OffloadDevice::kNvme) {
    throw ConfigError(path, given +
                                " with device \"nvme\": a share below 1 is offloaded to CPU "
                                "memory only. Set device to \"cpu\", or ratio to 1");
  }
  if (!(offload.auto_ratio_margin >= 0.0 && offload.auto_ratio_margin < 1.0)) {
    throw ConfigError("zero_optimization.offload_optimizer.auto_ratio_margin",
                      "got " + detail::format_number(offload.auto_ratio_margin) +
                          ", expected the share of the device's memory kept free, in [0, 1)");
  }
}

// The parser holds the key to its range; a Config built in code is held to it here, since a share
// of 0 or NaN would leave the update no thread.
void check_cores_share(const OffloadConfig& offload) {
  const double share = offload.cpuadam_cores_perc;
  if (share > 0.0 && share <= 1.0) return;
  throw ConfigError(
      "zero_optimization.offload_optimizer.cpuadam_cores_perc",
      "got " + detail::format_number(share) + ", expected a share of the rank's cores in (0, 1]");
}

void check_super_offload(const OffloadConfig& offload) {
  if (!offload.super_offload || offload.device == OffloadDevice::kCpu) return;
  // NVMe's pipelined step reads each sub-group's record once, in order; updating as buckets
  // arrive would read them in the reductions' order and hold a second copy of the states.
  throw ConfigError("zero_optimization.offload_optimizer.super_offload",
                    "got true with offload_optimizer.device " + quoted(offload.device) +
                        "; the update overlaps backward only with the optimizer states in CPU "
                        "memory: set offload_optimizer.device to \"cpu\", or remove the key");
}

// The engine reduces gradients in the parameters' type or in fp32, and accumulates them in either
// (fp32: a gradient shard at stages 2-3, an accumulator of the whole gradients at stages 0-1).
void check_gradient_types(const Config& config) {
  const std::string model = config.fp16.enabled ? "fp16" : config.bf16.enabled ? "bf16" : "fp32";
  const std::string& comm = config.communication_data_type;
  if (!comm.empty() && comm != "fp32" && comm != model) {
    throw ConfigError("communication_data_type",
                      "got " + comm + " with " + model +
                          " parameters; zeroshard reduces gradients in the parameters' type (" +
                          model + ", the default) or in fp32");
  }
  const std::string& accum = config.grad_accum_dtype;
  if (accum.empty() || accum == model) return;
  if (accum != "fp32") {
    throw ConfigError("data_types.grad_accum_dtype", "got " + accum + " with " + model +
                                                         " parameters; expected " + model +
                                                         " (the default) or fp32");
  }
  // At stages 0-1 the fp32 sums of the whole gradients are reduced as they are; narrowing them
  // for the reduction would undo what the accumulation keeps.
  const int stage = config.zero_optimization.stage;
  if (stage <= 1 && comm == model) {
    throw ConfigError("communication_data_type",
                      "got " + comm +
                          " with data_types.grad_accum_dtype fp32 at "
                          "zero_optimization.stage " +
                          std::to_string(stage) +
                          "; stages 0-1 reduce the fp32 sums of the gradients in fp32. Set it to "
                          "fp32 or leave it unset");
  }
}

// Builds what the engine builds from the optimizer and scheduler sections, for their checks.
void check_rule_and_schedule(const Config& config) {
  std::unique_ptr<UpdateRule> rule;
  if (!config.optimizer.type.empty()) rule = make_update_rule(config);
  // Without an optimizer section the program brings its rule: check the schedule as for one
  // with betas, so that nothing it might accept is refused here.
  constexpr double kAnyLr = 0.0;
  constexpr double kAnyBeta1 = 0.0;
  make_lr_scheduler(config.scheduler, rule ? rule->default_lr() : kAnyLr,
                    rule ? rule->beta1() : std::optional<double>(kAnyBeta1));
}

}  // namespace

void check_aio(const AioConfig& aio) {
  if (aio.use_gds) {
    const detail::KeySpec& spec = *detail::find_key_spec("aio.use_gds");
    throw ConfigError(spec.path, spec.refusal(true));
  }
  if (aio.block_size <= 0 || aio.block_size % kAioBlockAlignment != 0 ||
      aio.block_size > kAioMaxBlockSize) {
    throw ConfigError("aio.block_size", "got " + std::to_string(aio.block_size) +
                                            ", expected a multiple of 4096 (O_DIRECT) up to 1 GiB");
  }
  if (aio.queue_depth < 1 || aio.queue_depth > kAioMaxInFlight) {
    throw ConfigError("aio.queue_depth", "got " + std::to_string(aio.queue_depth) +
                                             ", expected 1.." + std::to_string(kAioMaxInFlight));
  }
  // Divided rather than multiplied: the product of two 64-bit values from the file can overflow.
  if (aio.intra_op_parallelism < 1 ||
      aio.intra_op_parallelism > kAioMaxInFlight / aio.queue_depth) {
    throw ConfigError("aio.intra_op_parallelism",
                      "got " + std::to_string(aio.intra_op_parallelism) +
                          ", expected at least 1 and queue_depth * intra_op_parallelism <= " +
                          std::to_string(kAioMaxInFlight));
  }
}

void check_key_combinations(const Config& config) {
  check_precision(config);
  check_nvme_paths(config.zero_optimization);
  check_offload_stages(config.zero_optimization);
  check_activation_checkpointing(config.activation_checkpointing);
  check_required_scheduler_params(config.scheduler);
}

std::array<OffloadSection, 2> offload_sections(const ZeroConfig& zero) {
  return {{{"zero_optimization.offload_optimizer", zero.offload_optimizer},
           {"zero_optimization.offload_param", zero.offload_param}}};
}

void check_config(const Config& config) {
  check_integer_ranges(config);
  check_key_combinations(config);
  check_offload_devices(config.zero_optimization);
  check_super_offload(config.zero_optimization.offload_optimizer);
  check_cores_share(config.zero_optimization.offload_optimizer);
  check_stage_three_keys(config.zero_optimization);
  check_aio(config.aio);
  check_gradient_types(config);
  check_rule_and_schedule(config);
  check_refused_fields(config);
  check_offload_ratio(config.zero_optimization.offload_optimizer);
}

}  // namespace zeroshard
