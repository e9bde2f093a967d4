// The key table itself, with DeepSpeed's defaults (deepspeed/runtime/zero/config.py,
// offload_config.py, constants.py, lr_schedules.py) and where each value lives in Config.
#include "config/config_schema.h"

#include <type_traits>

#include "config/config_values.h"
#include "util/text.h"

namespace zeroshard::detail {
namespace {

// A pointer to the Config member `member`, usable as a FieldRef.
#define ZEROSHARD_CONFIG_FIELD(member) +[](Config& c) -> decltype((c.member)) { return c.member; }

constexpr Range kStageRange{.min = 0, .max = 3};
constexpr Range kAtLeastOne{.min = 1};
// A count the engine holds in an int (a group size, a buffer count): 2^32 would narrow to 0.
constexpr Range kIntCount{.min = 1, .max = 2147483647};
constexpr Range kFraction{.min = 0, .max = 1};
constexpr Range kShare{.min = 0, .max = 1, .min_exclusive = true};

const char* const kIntegration = "a Python-side integration";

bool enables_autocast(const nlohmann::json& value) {
  const auto enabled = value.find("enabled");
  return enabled != value.end() && *enabled != false;
}

std::vector<KeySpec> make_key_specs() {
  using K = ValueKind;
  using S = KeyStatus;
  return {
      // --- batch size, clipping, logging -------------------------------------------------
      {.path = "train_batch_size",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "Samples per optimizer step over all ranks: micro batch x "
                  "gradient_accumulation_steps x world size. Derived when absent.",
       .field = ZEROSHARD_CONFIG_FIELD(train_batch_size),
       .range = kPositive},
      {.path = "train_micro_batch_size_per_gpu",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "Samples per rank in one forward/backward. Derived when absent.",
       .field = ZEROSHARD_CONFIG_FIELD(train_micro_batch_size_per_gpu),
       .range = kPositive},
      {.path = "gradient_accumulation_steps",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "Micro batches accumulated per optimizer step. Derived when absent; 1 when "
                  "only one batch size is given.",
       .field = ZEROSHARD_CONFIG_FIELD(gradient_accumulation_steps),
       .range = kPositive},
      {.path = "gradient_clipping",
       .kind = K::kNumber,
       .default_json = "1.0",
       .meaning = "Clip the global gradient norm to this value; 0 or less = no clipping (as "
                  "DeepSpeed's `> 0` test). Newest DeepSpeed's default (0.0 before #8068).",
       .field = ZEROSHARD_CONFIG_FIELD(gradient_clipping)},
      {.path = "steps_per_print",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "Print progress every this many steps; 0 or null = never (null is newest "
                  "DeepSpeed's default; older versions printed every 10). Config holds 0 for "
                  "null.",
       .field = ZEROSHARD_CONFIG_FIELD(steps_per_print),
       .range = kNonNegative},
      {.path = "wall_clock_breakdown",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Time forward, backward, reduction and step, and print the breakdown. True "
                  "also when flops_profiler.enabled is true, as in DeepSpeed.",
       .field = ZEROSHARD_CONFIG_FIELD(wall_clock_breakdown)},
      {.path = "memory_breakdown",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Print the memory held per category at each step.",
       .field = ZEROSHARD_CONFIG_FIELD(memory_breakdown)},
      {.path = "prescale_gradients",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Scale gradients before the reduction instead of after it.",
       .field = ZEROSHARD_CONFIG_FIELD(prescale_gradients)},
      {.path = "gradient_predivide_factor",
       .kind = K::kNumber,
       .default_json = "1.0",
       .meaning = "Divide gradients by this before the reduction and by world size / factor "
                  "after it (headroom against fp16 overflow).",
       .field = ZEROSHARD_CONFIG_FIELD(gradient_predivide_factor),
       .range = kPositive},
      {.path = "communication_data_type",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Element type of gradient communication; null = the parameters' type.",
       .field = ZEROSHARD_CONFIG_FIELD(communication_data_type),
       .choices = "fp16|bf16|fp32",
       .fold_case = true},
      {.path = "data_types",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "Data-type settings."},
      {.path = "data_types.grad_accum_dtype",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Element type gradients are accumulated in, with offload_optimizer as without; "
                  "null = the parameters' type (DeepSpeed's default under ZeRO); fp32 with 16-bit "
                  "parameters is an fp32 gradient shard at stages 2-3, an fp32 accumulator of the "
                  "whole gradients at stages 0-1.",
       .field = ZEROSHARD_CONFIG_FIELD(grad_accum_dtype),
       .choices = "fp16|bf16|fp32",
       .fold_case = true},
      {.path = "data_types.param_dtype",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Element type DeepSpeed casts the model's parameters to; in zeroshard each "
                  "parameter has the dtype it was registered with.",
       .status = S::kRefused},
      {.path = "gradient_allreduce_op",
       .kind = K::kString,
       .default_json = "\"mean\"",
       .meaning = "How gradients are combined over the data-parallel ranks: mean (zeroshard "
                  "always averages) or sum.",
       .status = S::kRefused,
       .choices = "mean|sum",
       .fold_case = true},
      {.path = "torch_autocast",
       .kind = K::kOpaqueSection,
       .default_json = "null",
       .meaning = "torch.autocast around the forward pass; only `enabled: false` is accepted.",
       .status = S::kRefused,
       .is_active = enables_autocast},
      {.path = "sparse_gradients",
       .kind = K::kBool,
       .default_json = "null",
       .meaning = "Sparse (CSR) gradients for embedding layers; removed in DeepSpeed 0.19.8.",
       .status = S::kRemoved},
      {.path = "dump_state",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Print the engine's state after initialisation.",
       .status = S::kRefused},
      {.path = "zero_allow_untested_optimizer",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Allow an optimizer DeepSpeed has not tested with ZeRO.",
       .status = S::kNoEffect,
       .no_effect_reason = "every update rule may be used with every stage"},
      {.path = "zero_force_ds_cpu_optimizer",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Require DeepSpeed's own CPU optimizer when offloading.",
       .status = S::kRefused},
      {.path = "checkpoint",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "Checkpoint loading and saving options."},
      {.path = "checkpoint.tag_validation",
       .kind = K::kString,
       .default_json = "\"Warn\"",
       .meaning = "What to do when ranks disagree on a checkpoint tag.",
       .status = S::kRefused,
       .choices = "Ignore|Warn|Fail",
       .fold_case = true},
      {.path = "checkpoint.load_universal",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Load a DeepSpeed universal checkpoint.",
       .status = S::kRefused},
      {.path = "checkpoint.use_node_local_storage",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Write checkpoints to node-local storage.",
       .status = S::kRefused},
      {.path = "checkpoint.parallel_write",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "Parallel checkpoint writing."},
      {.path = "checkpoint.parallel_write.pipeline_stage",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Write the checkpoint per pipeline stage.",
       .status = S::kRefused},
      {.path = "tensorboard",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "TensorBoard monitor: event files written by the library."},
      {.path = "tensorboard.enabled",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Write the training series (docs/monitoring.md).",
       .field = ZEROSHARD_CONFIG_FIELD(tensorboard.enabled)},
      {.path = "tensorboard.output_path",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Folder the job's folder is made in; null or \"\" (DeepSpeed's default) = the "
                  "current directory.",
       .field = ZEROSHARD_CONFIG_FIELD(tensorboard.output_path)},
      {.path = "tensorboard.job_name",
       .kind = K::kString,
       .default_json = "\"DeepSpeedJobName\"",
       .meaning = "The job's folder under output_path.",
       .field = ZEROSHARD_CONFIG_FIELD(tensorboard.job_name)},
      {.path = "wandb",
       .kind = K::kOpaqueSection,
       .default_json = "null",
       .meaning = "Weights & Biases monitor.",
       .status = S::kNoEffect,
       .no_effect_reason = kIntegration},
      {.path = "csv_monitor",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "CSV monitor: one file of step,value rows per series."},
      {.path = "csv_monitor.enabled",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Write the training series (docs/monitoring.md).",
       .field = ZEROSHARD_CONFIG_FIELD(csv_monitor.enabled)},
      {.path = "csv_monitor.output_path",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Folder the job's folder is made in; null or \"\" (DeepSpeed's default) = the "
                  "current directory.",
       .field = ZEROSHARD_CONFIG_FIELD(csv_monitor.output_path)},
      {.path = "csv_monitor.job_name",
       .kind = K::kString,
       .default_json = "\"DeepSpeedJobName\"",
       .meaning = "The job's folder under output_path.",
       .field = ZEROSHARD_CONFIG_FIELD(csv_monitor.job_name)},
      {.path = "flops_profiler",
       .kind = K::kOpaqueSection,
       .default_json = "null",
       .meaning = "PyTorch-module FLOPs profiler.",
       .status = S::kNoEffect,
       .no_effect_reason = kIntegration},
      {.path = "comms_logger",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "Times the engine's collectives per kind and message size; logs them at "
                  "steps_per_print and a summary when the engine ends."},
      {.path = "comms_logger.enabled",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Time and log the collectives.",
       .field = ZEROSHARD_CONFIG_FIELD(comms_logger.enabled)},
      {.path = "comms_logger.verbose",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Also log each collective as it completes.",
       .field = ZEROSHARD_CONFIG_FIELD(comms_logger.verbose)},
      {.path = "comms_logger.prof_all",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Time every kind of collective; false: only those in prof_ops.",
       .field = ZEROSHARD_CONFIG_FIELD(comms_logger.prof_all)},
      {.path = "comms_logger.prof_ops",
       .kind = K::kStringList,
       .default_json = "[]",
       .meaning = "The kinds timed when prof_all is false.",
       .field = ZEROSHARD_CONFIG_FIELD(comms_logger.prof_ops),
       .choices = "all_reduce|reduce_scatter|all_gather|broadcast|barrier|all_to_all"},
      {.path = "comms_logger.debug",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "The verbose lines also name each collective's sequence number and dtype.",
       .field = ZEROSHARD_CONFIG_FIELD(comms_logger.debug)},

      // --- optimizer and scheduler ----------------------------------------------------------
      {.path = "optimizer",
       .kind = K::kSection,
       .default_json = "null",
       .meaning = "The update rule; null = the program supplies its own."},
      {.path = "optimizer.type",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Update rule name, case-insensitive; stored in lower case.",
       .field = ZEROSHARD_CONFIG_FIELD(optimizer.type),
       .choices = "adam|adamw|sgd|lion|adagrad",
       .refused_choices = "lamb|onebitadam|zerooneadam|onebitlamb|muadam|muadamw|musgd",
       .fold_case = true},
      {.path = "optimizer.params",
       .kind = K::kOptimizerParams,
       .default_json = "{}",
       .meaning = "Rule options (lr, betas, eps, weight_decay, ...): numbers, booleans (held "
                  "as 0/1) and number arrays. Names are checked by the update rule."},
      {.path = "scheduler",
       .kind = K::kSection,
       .default_json = "null",
       .meaning = "The learning-rate schedule; null = constant learning rate."},
      {.path = "scheduler.type",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Schedule name (case-sensitive, as in DeepSpeed).",
       .field = ZEROSHARD_CONFIG_FIELD(scheduler.type),
       .choices = "WarmupLR|WarmupDecayLR|WarmupCosineLR|OneCycle|LRRangeTest"},
      {.path = "scheduler.params",
       .kind = K::kSchedulerParams,
       .default_json = "{}",
       .meaning = "The schedule's parameters; see the scheduler table below."},

      // --- mixed precision ------------------------------------------------------------------
      {.path = "fp16",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "fp16 training with loss scaling."},
      {.path = "fp16.enabled",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Train with fp16 parameters and gradients and fp32 master weights.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.enabled)},
      {.path = "fp16.auto_cast",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Cast the model's inputs to fp16.",
       .status = S::kRefused,
       .field = ZEROSHARD_CONFIG_FIELD(fp16.auto_cast)},
      {.path = "fp16.loss_scale",
       .kind = K::kNumber,
       .default_json = "0",
       .meaning = "0 = dynamic loss scaling; > 0 = this static scale.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.loss_scale),
       .range = kNonNegative},
      {.path = "fp16.initial_scale_power",
       .kind = K::kInteger,
       .default_json = "16",
       .meaning = "The dynamic scale starts at 2^this.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.initial_scale_power),
       .range = {.min = 0, .max = 127}},
      {.path = "fp16.loss_scale_window",
       .kind = K::kInteger,
       .default_json = "1000",
       .meaning = "Steps without overflow before the dynamic scale doubles.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.loss_scale_window),
       .range = kPositive},
      {.path = "fp16.hysteresis",
       .kind = K::kInteger,
       .default_json = "2",
       .meaning = "Overflows tolerated before the dynamic scale is halved; 0 = never halved "
                  "(overflowing steps are skipped), as DeepSpeed's counter never reaches 1.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.hysteresis),
       .range = kNonNegative},
      {.path = "fp16.consecutive_hysteresis",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Refill the hysteresis on every step without overflow.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.consecutive_hysteresis)},
      {.path = "fp16.min_loss_scale",
       .kind = K::kInteger,
       .default_json = "1",
       .meaning = "Floor of the dynamic scale; an overflow at the floor is an error.",
       .field = ZEROSHARD_CONFIG_FIELD(fp16.min_loss_scale),
       .range = kPositive},
      {.path = "fp16.fp16_master_weights_and_grads",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Keep master weights and gradients in fp16 (DeepSpeed: stage 2 only).",
       .status = S::kRefused,
       .field = ZEROSHARD_CONFIG_FIELD(fp16.fp16_master_weights_and_grads)},
      {.path = "bf16",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "bf16 training (no loss scaling)."},
      {.path = "bf16.enabled",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Train with bf16 parameters and gradients and fp32 master weights.",
       .field = ZEROSHARD_CONFIG_FIELD(bf16.enabled)},
      {.path = "bf16.immediate_grad_update",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Accumulate each gradient into the fp32 buffer as soon as it is ready.",
       .status = S::kRefused,
       .field = ZEROSHARD_CONFIG_FIELD(bf16.immediate_grad_update)},
      {.path = "bf16.check_grad_overflow",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Check bf16 gradients for inf/nan and skip the step when found.",
       .field = ZEROSHARD_CONFIG_FIELD(bf16.check_grad_overflow)},
      {.path = "bf16.bf16_master_weights_and_grads",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Keep master weights and gradients in bf16.",
       .status = S::kRefused},
      {.path = "bf16.bf16_optimizer_states",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Keep optimizer states in bf16 (needs bf16_master_weights_and_grads).",
       .status = S::kRefused},
      {.path = "bfloat16",
       .kind = K::kSection,
       .default_json = "",
       .meaning = "Legacy name of bf16.",
       .status = S::kDeprecatedAlias,
       .alias_of = "bf16"},

      // --- ZeRO -----------------------------------------------------------------------------
      {.path = "zero_optimization",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "ZeRO sharding. Sizes are in elements."},
      {.path = "zero_optimization.stage",
       .kind = K::kInteger,
       .default_json = "0",
       .meaning = "0 = off; 1 = shard optimizer states; 2 = also gradients; 3 = also "
                  "parameters.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.stage),
       .range = kStageRange},
      {.path = "zero_optimization.contiguous_gradients",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Copy gradients into one contiguous buffer as they are produced (less "
                  "fragmentation, higher peak).",
       .status = S::kRefused,
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.contiguous_gradients)},
      {.path = "zero_optimization.reduce_scatter",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Average gradients with reduce-scatter rather than all-reduce. Stage 0 "
                  "all-reduces unless it is given: true there reduce-scatters and gathers the "
                  "sums back, training bit for bit as stages 1-3.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.reduce_scatter)},
      {.path = "zero_optimization.reduce_bucket_size",
       .kind = K::kInteger,
       .default_json = "500000000",
       .meaning = "Gradient elements reduced at a time.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.reduce_bucket_size),
       .range = kPositive},
      {.path = "zero_optimization.use_multi_rank_bucket_allreduce",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Merge the reduce buckets of several ranks into one all-reduce.",
       .status = S::kRefused},
      {.path = "zero_optimization.allgather_partitions",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "All-gather updated parameters at step end rather than broadcasting them "
                  "rank by rank.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.allgather_partitions)},
      {.path = "zero_optimization.allgather_bucket_size",
       .kind = K::kInteger,
       .default_json = "500000000",
       .meaning = "Parameter elements all-gathered at a time; 0 = all in one all-gather (newest "
                  "DeepSpeed gathers in one call whatever the size).",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.allgather_bucket_size),
       .range = kNonNegative},
      {.path = "zero_optimization.overlap_comm",
       .kind = K::kBool,
       .default_json = "null",
       .meaning = "Overlap gradient reduction with the backward pass; null = true at stage 3, "
                  "false otherwise.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.overlap_comm)},
      {.path = "zero_optimization.load_from_fp32_weights",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Engine::load_checkpoint takes the fp32 master weights from the checkpoint's "
                  "fp32 copy; false rebuilds them from the 16-bit weights.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.load_from_fp32_weights)},
      {.path = "zero_optimization.elastic_checkpoint",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Legacy elastic checkpoints.",
       .status = S::kRefused},
      {.path = "zero_optimization.sub_group_size",
       .kind = K::kInteger,
       .default_json = "1000000000",
       .meaning = "Elements per tile of the optimizer step (bounds the temporary memory of "
                  "offloaded steps). 0, DeepSpeed's one parameter per sub-group: a tile as large "
                  "as the largest piece of one parameter in the rank's shard.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.sub_group_size),
       .range = kNonNegative},
      {.path = "zero_optimization.stage3_prefetch_bucket_size",
       .kind = K::kInteger,
       .default_json = "50000000",
       .meaning = "Stage 3: parameter elements fetched ahead of use; 0 = no prefetch.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.prefetch_bucket_size),
       .range = kNonNegative},
      {.path = "zero_optimization.stage3_param_persistence_threshold",
       .kind = K::kInteger,
       .default_json = "100000",
       .meaning = "Stage 3: parameters with fewer elements stay unpartitioned.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.param_persistence_threshold),
       .range = kNonNegative},
      {.path = "zero_optimization.stage3_model_persistence_threshold",
       .kind = K::kInteger,
       .default_json = "9223372036854775807",
       .meaning = "Stage 3: cap on the total elements of unpartitioned parameters.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.model_persistence_threshold),
       .range = kNonNegative},
      {.path = "zero_optimization.stage3_max_live_parameters",
       .kind = K::kInteger,
       .default_json = "1000000000",
       .meaning = "Stage 3: DeepSpeed's budget of gathered parameter elements per rank. The "
                  "module a model asks for is always gathered; prefetching (at most "
                  "`min(budget - live, stage3_prefetch_bucket_size)`) and copies kept for reuse "
                  "stay within it, which frees kept and prefetched copies first.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.max_live_parameters),
       .range = kNonNegative},
      {.path = "zero_optimization.stage3_max_reuse_distance",
       .kind = K::kInteger,
       .default_json = "1000000000",
       .meaning = "Stage 3: keep a parameter gathered if it is used again within this many "
                  "elements.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.max_reuse_distance),
       .range = kNonNegative},
      {.path = "zero_optimization.stage3_gather_16bit_weights_on_model_save",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Stage 3: Engine::save_16bit_model gathers the full 16-bit weights and saves "
                  "them; false saves nothing at stage 3.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.gather_16bit_weights_on_model_save)},
      {.path = "zero_optimization.prefetch_bucket_size",
       .kind = K::kInteger,
       .meaning = "DeepSpeed's field name for the stage3_ key.",
       .status = S::kAlias,
       .alias_of = "zero_optimization.stage3_prefetch_bucket_size"},
      {.path = "zero_optimization.param_persistence_threshold",
       .kind = K::kInteger,
       .meaning = "DeepSpeed's field name for the stage3_ key.",
       .status = S::kAlias,
       .alias_of = "zero_optimization.stage3_param_persistence_threshold"},
      {.path = "zero_optimization.model_persistence_threshold",
       .kind = K::kInteger,
       .meaning = "DeepSpeed's field name for the stage3_ key.",
       .status = S::kAlias,
       .alias_of = "zero_optimization.stage3_model_persistence_threshold"},
      {.path = "zero_optimization.max_live_parameters",
       .kind = K::kInteger,
       .meaning = "DeepSpeed's field name for the stage3_ key.",
       .status = S::kAlias,
       .alias_of = "zero_optimization.stage3_max_live_parameters"},
      {.path = "zero_optimization.max_reuse_distance",
       .kind = K::kInteger,
       .meaning = "DeepSpeed's field name for the stage3_ key.",
       .status = S::kAlias,
       .alias_of = "zero_optimization.stage3_max_reuse_distance"},
      {.path = "zero_optimization.gather_16bit_weights_on_model_save",
       .kind = K::kBool,
       .meaning = "DeepSpeed's field name for the stage3_ key.",
       .status = S::kAlias,
       .alias_of = "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {.path = "zero_optimization.stage3_gather_fp16_weights_on_model_save",
       .kind = K::kBool,
       .meaning = "Old name of stage3_gather_16bit_weights_on_model_save.",
       .status = S::kDeprecatedAlias,
       .alias_of = "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {.path = "zero_optimization.stage3_module_granularity_threshold",
       .kind = K::kInteger,
       .default_json = "0",
       .meaning = "Stage 3: fetch fine-grained modules as one unit.",
       .status = S::kRefused},
      {.path = "zero_optimization.stage3_use_all_reduce_for_fetch_params",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Stage 3: fetch parameters with an all-reduce.",
       .status = S::kRefused},
      {.path = "zero_optimization.stage3_allgather_sequential",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Stage 3: all-gather parameter by parameter, without bucket flattening.",
       .status = S::kRefused},
      {.path = "zero_optimization.ignore_unused_parameters",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Stage 2: a parameter that never gets a gradient is not an error.",
       .status = S::kRefused,
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.ignore_unused_parameters)},
      {.path = "zero_optimization.legacy_stage1",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "DeepSpeed's old stage-1 implementation.",
       .status = S::kRefused},
      {.path = "zero_optimization.round_robin_gradients",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Stages 1/2 with CPU offload: copy gradients to the CPU in parallel, rank "
                  "by rank.",
       .status = S::kNotYet,
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.round_robin_gradients)},
      {.path = "zero_optimization.zero_hpz_partition_size",
       .kind = K::kInteger,
       .default_json = "1",
       .meaning = "ZeRO++ hpZ (stage 3): after a module's gather, each group of this many "
                  "ranks of one host keeps a secondary copy of its parameters partitioned "
                  "over the group, and later gathers of it in the step (backward) run inside "
                  "the group; 1 turns it off.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.hpz_partition_size),
       .range = kIntCount},
      {.path = "zero_optimization.zero_quantized_weights",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "ZeRO++ qwZ: stage 3 gathers parameters as int8 blocks of 256 with an fp32 scale "
                  "each and dequantizes them on arrival; needs stage 3.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.quantized_weights)},
      {.path = "zero_optimization.zero_quantized_nontrainable_weights",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "ZeRO++ (stage 3): frozen parameters are kept in memory as int8 blocks of 256 "
                  "with an fp32 scale each and decoded into the model's type while their module "
                  "is gathered; needs stage 3.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.quantized_nontrainable_weights)},
      {.path = "zero_optimization.zero_quantized_gradients",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "ZeRO++ qgZ: stage 3 reduces gradients as int8 blocks among the ranks of a "
                  "host, then int4 blocks of the partial sums across hosts (all-to-all); needs "
                  "stage 3.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.quantized_gradients)},
      {.path = "zero_optimization.zeropp_loco_param",
       .kind = K::kOpaqueSection,
       .default_json = "null",
       .meaning = "ZeRO++ LoCo error feedback; removed in DeepSpeed 0.19.8.",
       .status = S::kRemoved},
      {.path = "zero_optimization.mics_shard_size",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "MiCS shard group size; removed in DeepSpeed 0.19.8.",
       .status = S::kRemoved},
      {.path = "zero_optimization.mics_hierarchical_params_gather",
       .kind = K::kBool,
       .default_json = "null",
       .meaning = "MiCS hierarchical all-gather; removed in DeepSpeed 0.19.8.",
       .status = S::kRemoved},
      {.path = "zero_optimization.compute_grad_norm",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Compute the global gradient norm at every step; false skips it when nothing "
                  "uses it (DeepSpeed #8331). zeroshard always computes it.",
       .status = S::kRefused},
      {.path = "zero_optimization.parameter_alignment",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Pad each parameter's view in the flat buffer to a 16-byte boundary (DeepSpeed "
                  "#8277). zeroshard starts every tensor on a multiple of 16 elements (32 bytes "
                  "or more) whatever the value, so true holds and false changes nothing.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.parameter_alignment)},
      {.path = "zero_optimization.enable_sanity_checks",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "DeepSpeed's internal sanity checks for debugging.",
       .status = S::kRefused},
      {.path = "zero_optimization.save_muon_momentum_buffer_in_memory",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Muon at stage 3 with NVMe offload: keep the momentum in memory rather than "
                  "swap it with the other states. zeroshard has no Muon rule.",
       .status = S::kRefused},
      {.path = "zero_optimization.memory_efficient_linear",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Stage 3 memory-efficient torch linear layer.",
       .status = S::kRefused},
      {.path = "zero_optimization.pipeline_loading_checkpoint",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Stage 3 checkpoint loading in pipeline mode.",
       .status = S::kRefused},
      {.path = "zero_optimization.override_module_apply",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Stage 3 override of torch.nn.Module.apply.",
       .status = S::kRefused},
      {.path = "zero_optimization.log_trace_cache_warnings",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Log invalidations of the stage-3 trace cache.",
       .status = S::kRefused},
      {.path = "zero_optimization.cpu_offload",
       .kind = K::kBool,
       .meaning = "Old switch for optimizer offload to the CPU.",
       .status = S::kDeprecatedAlias,
       .alias_of = "zero_optimization.offload_optimizer.device",
       .alias_value = "\"cpu\""},
      {.path = "zero_optimization.cpu_offload_param",
       .kind = K::kBool,
       .meaning = "Old switch for parameter offload to the CPU.",
       .status = S::kDeprecatedAlias,
       .alias_of = "zero_optimization.offload_param.device",
       .alias_value = "\"cpu\""},
      {.path = "zero_optimization.cpu_offload_use_pin_memory",
       .kind = K::kBool,
       .meaning = "Old pinned-memory switch of both offloads.",
       .status = S::kDeprecatedAlias,
       .alias_of = "zero_optimization.offload_optimizer.pin_memory|"
                   "zero_optimization.offload_param.pin_memory"},

      // offload_optimizer (stages 1-3) and offload_param (stage 3).
      {.path = "zero_optimization.offload_optimizer",
       .kind = K::kSection,
       .default_json = "null",
       .meaning = "Offload of optimizer states (and the step's computation) to CPU or NVMe; "
                  "stages 1-3."},
      {.path = "zero_optimization.offload_optimizer.device",
       .kind = K::kString,
       .default_json = "\"none\"",
       .meaning =
           "Where the fp32 master weights and optimizer states live: host memory (cpu) or swap "
           "files under nvme_path (nvme); the update runs on the CPU.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.device),
       .choices = "none|cpu|nvme"},
      {.path = "zero_optimization.offload_optimizer.nvme_path",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Directory of the swap files, created when missing (as DeepSpeed does); required "
                  "for nvme.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.nvme_path)},
      {.path = "zero_optimization.offload_optimizer.buffer_count",
       .kind = K::kInteger,
       .default_json = "4",
       .meaning = "NVMe: sub-groups in pinned host memory at once, each with its master and states "
                  "(DeepSpeed counts one buffer per tensor); 3 overlap a read, an update and a "
                  "write.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.buffer_count),
       .range = kIntCount},
      {.path = "zero_optimization.offload_optimizer.pin_memory",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Page-locked host memory (faster copies). Newest DeepSpeed's default (false "
                  "before #8207).",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.pin_memory)},
      {.path = "zero_optimization.offload_optimizer.pipeline_read",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "NVMe: read the next sub-groups while updating this one.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.pipeline_read)},
      {.path = "zero_optimization.offload_optimizer.pipeline_write",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "NVMe: write the previous sub-group while updating this one.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.pipeline_write)},
      {.path = "zero_optimization.offload_optimizer.fast_init",
       .kind = K::kBool,
       .default_json = "false",
       .meaning =
           "NVMe: do not write every sub-group's record at start (a full or failing drive then "
           "shows at the first step).",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.fast_init)},
      {.path = "zero_optimization.offload_optimizer.ratio",
       .kind = K::kNumber,
       .default_json = "1.0",
       .meaning = "Share of this rank's optimizer shard (its first elements) updated on the "
                  "host; the rest stays in device memory and is updated there at the same time "
                  "(DeepSpeed's Twin-Flow). In (0, 1]; below 1 with device cpu only, at any "
                  "stage 1-3. \"auto\" (zeroshard's; DeepSpeed reads it as 1): the first step "
                  "runs at 1, then the largest device share that fits the memory left after its "
                  "peak, less auto_ratio_margin, moves to the device, and rank 0 logs the ratio.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.ratio),
       .range = kFraction,
       .choices = "auto"},
      {.path = "zero_optimization.offload_optimizer.auto_ratio_margin",
       .kind = K::kNumber,
       .default_json = "0.1",
       .meaning = "zeroshard's own key, for ratio \"auto\": the share of the device's total "
                  "memory left free on top of the first step's peak, for what the engine cannot "
                  "see (transients of other allocators, fragmentation). DeepSpeed refuses it.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.auto_ratio_margin),
       .range = kFraction},
      {.path = "zero_optimization.offload_optimizer.super_offload",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Update each bucket's shard on a host thread as its reduced gradients arrive "
                  "at the window's end, during backward (DeepSpeed's SuperOffload); device cpu "
                  "only. Speculative with clip 1: a step that clips, overflows or changed its "
                  "inputs is redone from the untouched arrays, so results are bit for bit as "
                  "without it. Holds a second master and states in host memory.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.super_offload)},
      {.path = "zero_optimization.offload_optimizer.cpuadam_cores_perc",
       .kind = K::kNumber,
       .default_json = "0.8",
       .meaning = "Share of this rank's CPU cores that run the host's update and its gradient "
                  "scan (super_offload's too): the cores of the rank's affinity mask, divided "
                  "among its host's ranks when they share one mask. OMP_NUM_THREADS, when set, "
                  "sets the team instead. zeroshard applies it to every optimizer offload, not "
                  "to super_offload alone.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_optimizer.cpuadam_cores_perc),
       .range = kShare},
      {.path = "zero_optimization.offload_param",
       .kind = K::kSection,
       .default_json = "null",
       .meaning = "Offload of parameters to CPU or NVMe; stage 3 only."},
      {.path = "zero_optimization.offload_param.device",
       .kind = K::kString,
       .default_json = "\"none\"",
       .meaning = "Where parameters live (stage 3). nvme needs offload_optimizer.device nvme.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_param.device),
       .choices = "none|cpu|nvme"},
      {.path = "zero_optimization.offload_param.nvme_path",
       .kind = K::kString,
       .default_json = "null",
       .meaning = "Directory of the swap files, created when missing (as DeepSpeed does); required "
                  "for nvme.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_param.nvme_path)},
      {.path = "zero_optimization.offload_param.buffer_count",
       .kind = K::kInteger,
       .default_json = "5",
       .meaning = "NVMe: buffers in the parameter swap pool.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_param.buffer_count),
       .range = kIntCount},
      {.path = "zero_optimization.offload_param.buffer_size",
       .kind = K::kInteger,
       .default_json = "100000000",
       .meaning = "NVMe: elements per swap buffer. \"auto\" is this default, as in DeepSpeed.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_param.buffer_size),
       .range = kPositive},
      {.path = "zero_optimization.offload_param.max_in_cpu",
       .kind = K::kInteger,
       .default_json = "1000000000",
       .meaning =
           "Parameter elements kept in CPU memory: with nvme the rest is swapped; with cpu the "
           "budget this rank's whole shard must fit.",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_param.max_in_cpu),
       .range = kNonNegative},
      {.path = "zero_optimization.offload_param.pin_memory",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Page-locked host memory. Newest DeepSpeed's default (false before #8207).",
       .field = ZEROSHARD_CONFIG_FIELD(zero_optimization.offload_param.pin_memory)},

      // --- activation checkpointing -------------------------------------------------------------
      {.path = "activation_checkpointing",
       .kind = K::kSection,
       .default_json = "{}",
       .meaning = "Activation checkpointing (zeroshard/activation_checkpointing.h)."},
      {.path = "activation_checkpointing.partition_activations",
       .kind = K::kBool,
       .default_json = "false",
       .meaning =
           "Split each kept input over the model-parallel communicator given to the "
           "ActivationCheckpointer; all-gathered before the recompute. Without one, a notice.",
       .field = ZEROSHARD_CONFIG_FIELD(activation_checkpointing.partition_activations)},
      {.path = "activation_checkpointing.contiguous_memory_optimization",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Kept inputs live in one preallocated buffer of number_checkpoints slots.",
       .field = ZEROSHARD_CONFIG_FIELD(activation_checkpointing.contiguous_memory_optimization)},
      {.path = "activation_checkpointing.cpu_checkpointing",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Kept inputs go to pinned host memory and come back before the recompute.",
       .field = ZEROSHARD_CONFIG_FIELD(activation_checkpointing.cpu_checkpointing)},
      {.path = "activation_checkpointing.number_checkpoints",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "Slots of the contiguous buffer (required by contiguous_memory_optimization).",
       .field = ZEROSHARD_CONFIG_FIELD(activation_checkpointing.number_checkpoints),
       .range = kPositive},
      {.path = "activation_checkpointing.synchronize_checkpoint_boundary",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Wait for the device at the start and end of each checkpointed block.",
       .field = ZEROSHARD_CONFIG_FIELD(activation_checkpointing.synchronize_checkpoint_boundary)},
      {.path = "activation_checkpointing.profile",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Time forwards, recomputes and backwards; logged after each backward pass.",
       .field = ZEROSHARD_CONFIG_FIELD(activation_checkpointing.profile)},

      // --- asynchronous I/O for NVMe offload --------------------------------------------------
      {.path = "aio",
       .kind = K::kSection,
       .default_json = "null",
       .meaning = "I/O settings of the NVMe swapper; null = every default (DeepSpeed's "
                  "get_aio_config)."},
      {.path = "aio.block_size",
       .kind = K::kInteger,
       .default_json = "1048576",
       .meaning = "Bytes per I/O request.",
       .field = ZEROSHARD_CONFIG_FIELD(aio.block_size),
       .range = kPositive},
      {.path = "aio.queue_depth",
       .kind = K::kInteger,
       .default_json = "8",
       .meaning = "Requests in flight per queue.",
       .field = ZEROSHARD_CONFIG_FIELD(aio.queue_depth),
       .range = kPositive},
      {.path = "aio.intra_op_parallelism",
       .kind = K::kInteger,
       .default_json = "1",
       .meaning = "I/O threads per operation (renamed from thread_count in #7056).",
       .field = ZEROSHARD_CONFIG_FIELD(aio.intra_op_parallelism),
       .range = kPositive},
      {.path = "aio.thread_count",
       .kind = K::kInteger,
       .default_json = "null",
       .meaning = "Old name of intra_op_parallelism, which DeepSpeed 0.19.8 no longer reads.",
       .status = S::kNoEffect,
       .no_effect_reason = "DeepSpeed 0.19.8 ignores it since #7056 renamed it; set "
                           "aio.intra_op_parallelism"},
      {.path = "aio.single_submit",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "Submit requests one at a time rather than in a batch.",
       .field = ZEROSHARD_CONFIG_FIELD(aio.single_submit)},
      {.path = "aio.overlap_events",
       .kind = K::kBool,
       .default_json = "true",
       .meaning = "Overlap request submission with completion.",
       .field = ZEROSHARD_CONFIG_FIELD(aio.overlap_events)},
      {.path = "aio.use_gds",
       .kind = K::kBool,
       .default_json = "false",
       .meaning = "GPUDirect Storage (CUDA only): NVMe reads and writes straight into GPU memory. "
                  "zeroshard's swapper goes through pinned host buffers.",
       .status = S::kRefused,
       .field = ZEROSHARD_CONFIG_FIELD(aio.use_gds)},
  };
}

#undef ZEROSHARD_CONFIG_FIELD

std::vector<SchedulerSpec> make_scheduler_specs() {
  using K = ValueKind;
  const SchedulerParamSpec warmup_type{
      .name = "warmup_type", .kind = K::kString, .choices = "log|linear"};
  const SchedulerParamSpec last_batch_iteration{
      .name = "last_batch_iteration", .kind = K::kInteger, .range = {.min = -1}};
  // 0 is the Trainer's default warmup_steps, which it writes here; the ramp takes 2 steps then.
  const SchedulerParamSpec warmup_num_steps{
      .name = "warmup_num_steps", .kind = K::kInteger, .range = kNonNegative};
  const SchedulerParamSpec total_num_steps{
      .name = "total_num_steps", .kind = K::kInteger, .required = true, .range = kPositive};
  return {
      {.type = "WarmupLR",
       .params = {{.name = "warmup_min_lr", .kind = K::kNumber},
                  {.name = "warmup_max_lr", .kind = K::kNumber},
                  warmup_num_steps,
                  warmup_type,
                  last_batch_iteration}},
      {.type = "WarmupDecayLR",
       .params = {total_num_steps,
                  {.name = "warmup_min_lr", .kind = K::kNumber},
                  {.name = "warmup_max_lr", .kind = K::kNumber},
                  warmup_num_steps,
                  warmup_type,
                  last_batch_iteration}},
      {.type = "WarmupCosineLR",
       .params = {total_num_steps,
                  {.name = "warmup_min_ratio", .kind = K::kNumber},
                  warmup_num_steps,
                  {.name = "cos_min_ratio", .kind = K::kNumber},
                  warmup_type,
                  last_batch_iteration}},
      {.type = "OneCycle",
       .params = {{.name = "cycle_min_lr", .kind = K::kNumber, .required = true},
                  {.name = "cycle_max_lr", .kind = K::kNumber, .required = true},
                  {.name = "decay_lr_rate", .kind = K::kNumber},
                  {.name = "cycle_first_step_size", .kind = K::kInteger, .range = kPositive},
                  {.name = "cycle_second_step_size", .kind = K::kInteger, .range = kPositive},
                  {.name = "cycle_first_stair_count", .kind = K::kInteger, .range = kNonNegative},
                  {.name = "cycle_second_stair_count", .kind = K::kInteger, .range = kNonNegative},
                  {.name = "decay_step_size", .kind = K::kInteger, .range = kNonNegative},
                  {.name = "cycle_momentum", .kind = K::kBool},
                  {.name = "cycle_min_mom", .kind = K::kNumber},
                  {.name = "cycle_max_mom", .kind = K::kNumber},
                  {.name = "decay_mom_rate", .kind = K::kNumber},
                  last_batch_iteration}},
      {.type = "LRRangeTest",
       .params = {{.name = "lr_range_test_min_lr", .kind = K::kNumber},
                  {.name = "lr_range_test_step_size", .kind = K::kInteger, .range = kPositive},
                  {.name = "lr_range_test_step_rate", .kind = K::kNumber},
                  {.name = "lr_range_test_staircase", .kind = K::kBool},
                  last_batch_iteration}},
  };
}

}  // namespace

bool Range::contains(double value) const {
  return (min_exclusive ? value > min : value >= min) && value <= max;
}

std::string Range::describe() const {
  const bool has_min = min != -std::numeric_limits<double>::infinity();
  const bool has_max = max != std::numeric_limits<double>::infinity();
  if (has_min && has_max) return format_number(min) + ".." + format_number(max);
  if (has_min) return (min_exclusive ? "> " : ">= ") + format_number(min);
  if (has_max) return "<= " + format_number(max);
  return "";
}

std::string KeySpec::name() const {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string KeySpec::parent() const {
  auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

bool KeySpec::refuses(const nlohmann::json& value) const {
  if (status != KeyStatus::kRefused && status != KeyStatus::kNotYet) return false;
  return is_active ? is_active(value) : value != nlohmann::json::parse(default_json);
}

std::string KeySpec::refusal(const nlohmann::json& value) const {
  return "got " + describe_value(value) + "; " +
         (status == KeyStatus::kRefused ? "not implemented in zeroshard" : "not implemented yet") +
         " (only the default " + default_json + " is accepted)";
}

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = make_key_specs();
  return specs;
}

const KeySpec* find_key_spec(std::string_view path) {
  for (const KeySpec& spec : key_specs()) {
    if (spec.path == path) return &spec;
  }
  return nullptr;
}

std::vector<const KeySpec*> child_specs(std::string_view parent) {
  std::vector<const KeySpec*> children;
  for (const KeySpec& spec : key_specs()) {
    if (spec.parent() == parent) children.push_back(&spec);
  }
  return children;
}

const std::vector<SchedulerSpec>& scheduler_specs() {
  static const std::vector<SchedulerSpec> specs = make_scheduler_specs();
  return specs;
}

const SchedulerSpec* find_scheduler_spec(std::string_view type) {
  for (const SchedulerSpec& spec : scheduler_specs()) {
    if (spec.type == type) return &spec;
  }
  return nullptr;
}

bool validated_by_pydantic(std::string_view path) {
  // DeepSpeed's offload sections are pydantic models too; zeroshard does not coerce their
  // values yet (docs/config.md).
  if (path.starts_with("zero_optimization.offload_")) return false;
  for (std::string_view section : {"zero_optimization.", "fp16.", "bf16."}) {
    if (path.starts_with(section)) return true;
  }
  return false;
}

std::vector<std::string> split_choices(std::string_view choices) {
  std::vector<std::string> result;
  while (!choices.empty()) {
    auto bar = choices.find('|');
    result.emplace_back(choices.substr(0, bar));
    choices = bar == std::string_view::npos ? std::string_view() : choices.substr(bar + 1);
  }
  return result;
}

std::string describe_expected(ValueKind kind, const Range& range, std::string_view choices) {
  std::string text;
  switch (kind) {
    case ValueKind::kSection:
    case ValueKind::kOpaqueSection:
    case ValueKind::kSchedulerParams:
      return "an object";
    case ValueKind::kOptimizerParams:
      return "an object of numbers, booleans and number arrays";
    case ValueKind::kBool:
      return "a boolean";
    case ValueKind::kStringList:
      text = "an array of strings";
      if (choices.empty()) return text;
      text += ", each one of ";
      for (const std::string& choice : split_choices(choices)) {
        text += (text.back() == ' ' ? "" : ", ") + choice;
      }
      return text;
    case ValueKind::kString:
      if (choices.empty()) return "a string";
      text = "one of ";
      for (const std::string& choice : split_choices(choices)) {
        text += (text.size() > 7 ? ", " : "") + choice;
      }
      return text;
    case ValueKind::kInteger:
      text = "an integer";
      break;
    case ValueKind::kNumber:
      text = "a number";
      break;
  }
  std::string bounds = range.describe();
  if (!bounds.empty()) text += " " + bounds;
  for (const std::string& choice : split_choices(choices)) text += " or \"" + choice + "\"";
  return text;
}

nlohmann::json read_field(const FieldRef& field, Config& config) {
  return std::visit(
      [&config](auto accessor) -> nlohmann::json {
        using Accessor = decltype(accessor);
        if constexpr (std::is_same_v<Accessor, std::monostate>) {
          return nullptr;
        } else {
          const auto& value = accessor(config);
          using Value = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<Value, OffloadDevice>) {
            return to_string(value);
          } else if constexpr (std::is_same_v<Value, std::optional<std::int64_t>>) {
            return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
          } else if constexpr (std::is_same_v<Value, std::optional<double>>) {
            return value ? nlohmann::json(*value) : nlohmann::json("auto");
          } else if constexpr (std::is_same_v<Value, std::string>) {
            return value.empty() ? nlohmann::json(nullptr) : nlohmann::json(value);
          } else {
            return value;
          }
        }
      },
      field);
}

void write_field(const FieldRef& field, Config& config, const nlohmann::json& value) {
  std::visit(
      [&config, &value](auto accessor) {
        using Accessor = decltype(accessor);
        if constexpr (!std::is_same_v<Accessor, std::monostate>) {
          auto& target = accessor(config);
          using Value = std::decay_t<decltype(target)>;
          if constexpr (std::is_same_v<Value, OffloadDevice>) {
            const std::string name = value.get<std::string>();
            target = name == "cpu"    ? OffloadDevice::kCpu
                     : name == "nvme" ? OffloadDevice::kNvme
                                      : OffloadDevice::kNone;
          } else if constexpr (std::is_same_v<Value, std::optional<std::int64_t>> ||
                               std::is_same_v<Value, std::int64_t> || std::is_same_v<Value, int>) {
            // Integer kinds were range-checked against the field's type by the parser.
            target = static_cast<Value>(*integer_value(value));
          } else if constexpr (std::is_same_v<Value, std::optional<double>>) {
            // The parser lets through a number or the key's one choice, "auto".
            target = value.is_number() ? Value(value.get<double>()) : std::nullopt;
          } else {
            target = value.get<Value>();
          }
        }
      },
      field);
}

}  // namespace zeroshard::detail
