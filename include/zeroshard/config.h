// The training configuration, read from a DeepSpeed-style JSON file with DeepSpeed's key names,
// defaults and validation rules (see docs/config.md for every key).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zeroshard/export.h"

namespace zeroshard {

/// Where optimizer states or parameters live when offloaded.
enum class OffloadDevice { kNone, kCpu, kNvme };

/// "none", "cpu" or "nvme", as the config spells it.
ZEROSHARD_API const char* to_string(OffloadDevice device) noexcept;

/// `zero_optimization.offload_optimizer` and `zero_optimization.offload_param`.
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path{};        ///< required when device is nvme
  std::int64_t buffer_count = 4;  ///< 4 for the optimizer, 5 for params (DeepSpeed's defaults)
  std::int64_t buffer_size = 100000000;  ///< offload_param only: elements per swap buffer
  std::int64_t max_in_cpu = 1000000000;  ///< offload_param only
  bool pin_memory = true;                ///< newest DeepSpeed default
  bool pipeline_read = false;            ///< offload_optimizer only
  bool pipeline_write = false;           ///< offload_optimizer only
  bool fast_init = false;                ///< offload_optimizer only
  /// offload_optimizer only: the share of this rank's optimizer shard (its first elements) kept
  /// in host memory and updated there; the rest stays on the device. std::nullopt is "auto": the
  /// first step runs with all of it on the host, and the engine then moves the largest share that
  /// fits the device memory left after that step's peak (less auto_ratio_margin) to the device.
  std::optional<double> ratio = 1.0;
  /// ratio "auto": the share of the device's total memory left free on top of the measured peak,
  /// for what the engine cannot see (other allocators' transients, fragmentation).
  double auto_ratio_margin = 0.1;
  /// offload_optimizer only, device cpu: each bucket's shard is updated on a host thread as its
  /// reduced gradients arrive at the window's end, while backward goes on (DeepSpeed's
  /// SuperOffload). Exact: a step whose norm clips, that overflows or whose inputs changed is
  /// redone from the untouched arrays, so training is bit for bit as without it.
  bool super_offload = false;
  /// offload_optimizer only: the share of this rank's cores that run the host's update, its
  /// gradient-norm scan and super_offload's overlapped update (DeepSpeed's default 0.8). The
  /// rank's cores are those of its CPU affinity mask, divided among the ranks of its host when
  /// they all share one mask; OMP_NUM_THREADS, when set, gives the team's size instead.
  double cpuadam_cores_perc = 0.8;
};

/// `zero_optimization`. Sizes are in elements, as in DeepSpeed.
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  /// From JSON at stage 0, false unless given, as DeepSpeed's stage 0 all-reduces; true at stage
  /// 0 reduce-scatters and gathers the sums back, bit for bit as stages 1-3 train.
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_size = 500000000;
  bool allgather_partitions = true;
  std::int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;  ///< defaults to true when stage == 3, as DeepSpeed's validator does
  bool load_from_fp32_weights = true;
  /// Elements per tile of the optimizer step; 0: one parameter per sub-group (DeepSpeed's 0).
  std::int64_t sub_group_size = 1000000000;
  std::int64_t prefetch_bucket_size = 50000000;          ///< stage3_prefetch_bucket_size
  std::int64_t param_persistence_threshold = 100000;     ///< stage3_param_persistence_threshold
  std::int64_t model_persistence_threshold = INT64_MAX;  ///< stage3_model_persistence_threshold
  std::int64_t max_live_parameters = 1000000000;         ///< stage3_max_live_parameters
  std::int64_t max_reuse_distance = 1000000000;          ///< stage3_max_reuse_distance
  bool gather_16bit_weights_on_model_save = false;  ///< stage3_gather_16bit_weights_on_model_save
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
  /// Each parameter's view 16-byte aligned (DeepSpeed #8277). Holds whatever the value: every
  /// tensor starts on a multiple of 16 elements.
  bool parameter_alignment = false;
  /// zero_quantized_weights (ZeRO++ qwZ, stage 3 only): gathers send each rank's piece as int8
  /// blocks with an fp32 scale (about a quarter of fp32's bytes); every rank, the owner included,
  /// then reads the dequantized values. The fp32 master and the update are unchanged.
  bool quantized_weights = false;
  /// zero_quantized_nontrainable_weights (ZeRO++, stage 3 only): frozen parameters are kept as
  /// int8 blocks with an fp32 scale (about a quarter of fp32's bytes) and decoded into the model's
  /// type while their module is gathered. Lossy: the model reads the decoded values.
  bool quantized_nontrainable_weights = false;
  /// zero_hpz_partition_size (ZeRO++ hpZ, stage 3 only; 1 is off): after a module's gather each
  /// rank keeps 1/K of its parameters for its group of K ranks on one host, and the module's
  /// later gathers in the step (backward, recomputation) are all-gathers inside the group.
  std::int64_t hpz_partition_size = 1;
  /// zero_quantized_gradients (ZeRO++ qgZ, stage 3 only): each bucket's reduce-scatter runs as
  /// two all-to-alls, int8 blocks among the ranks of a host, then int4 blocks of the partial sums
  /// across hosts. The reduced gradient carries the quantization error; no error feedback.
  bool quantized_gradients = false;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param = param_offload_defaults();

  /// DeepSpeed's offload_param defaults differ from offload_optimizer's in buffer_count only.
  static OffloadConfig param_offload_defaults() {
    OffloadConfig defaults;
    defaults.buffer_count = 5;
    return defaults;
  }
};

/// `fp16`, with DeepSpeed's dynamic loss-scaling knobs.
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;  ///< 0 = dynamic, > 0 = static
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool fp16_master_weights_and_grads = false;
};

/// `bf16` (legacy alias `bfloat16`).
struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;
};

/// `optimizer`: DeepSpeed's type name and its params (numbers, booleans as 0/1, number arrays).
struct OptimizerConfig {
  std::string type;  ///< adam, adamw, sgd, lion or adagrad in lower case; empty = no optimizer
  std::map<std::string, double> params;
  std::map<std::string, std::vector<double>> array_params;  ///< e.g. "betas": [0.9, 0.999]
};

/// `scheduler`: one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest.
struct SchedulerConfig {
  std::string type;  ///< empty when there is no scheduler
  std::map<std::string, double> params;
  std::map<std::string, std::string> string_params;  ///< e.g. "warmup_type": "log"
};

/// `activation_checkpointing`.
struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool contiguous_memory_optimization = false;
  bool cpu_checkpointing = false;
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

/// `tensorboard` and `csv_monitor`: a monitor writing the training series into
/// output_path/job_name (docs/monitoring.md).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path{};  ///< "" = the current directory
  std::string job_name = "DeepSpeedJobName";
};

/// `comms_logger`: the engine's collectives, timed per kind and message size (docs/monitoring.md).
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;  ///< also log each collective as it completes
  bool prof_all = true;  ///< time every kind; false: only those in prof_ops
  bool debug = false;    ///< verbose lines also name the collective's sequence number and dtype
  /// all_reduce, reduce_scatter, all_gather, broadcast, barrier, all_to_all.
  std::vector<std::string> prof_ops{};
};

/// `aio`: the NVMe swapper's I/O settings.
struct AioConfig {
  std::int64_t block_size = 1048576;
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;  ///< `thread_count` is ignored, as DeepSpeed 0.19.8 does
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

/// What the program knows that a Hugging Face style config leaves as "auto". The names are those
/// of the Trainer's arguments; each fills the keys the Trainer fills from it
/// (transformers' HfTrainerDeepSpeedConfig), and a key given as a number must equal it.
struct ConfigOverrides {
  /// train_micro_batch_size_per_gpu; with gradient_accumulation_steps, also train_batch_size.
  std::optional<std::int64_t> per_device_train_batch_size;
  std::optional<std::int64_t> gradient_accumulation_steps;
  std::optional<double> max_grad_norm;  ///< gradient_clipping
  std::optional<double> learning_rate;  ///< optimizer.params.lr, scheduler.params.warmup_max_lr
  std::optional<double> adam_beta1;     ///< optimizer.params.betas[0]
  std::optional<double> adam_beta2;     ///< optimizer.params.betas[1]
  std::optional<double> adam_epsilon;   ///< optimizer.params.eps
  std::optional<double> weight_decay;   ///< optimizer.params.weight_decay
  std::optional<std::int64_t> num_training_steps;  ///< scheduler.params.total_num_steps
  std::optional<std::int64_t> warmup_steps;        ///< scheduler.params.warmup_num_steps
  std::optional<bool> fp16;                        ///< fp16.enabled
  std::optional<bool> bf16;                        ///< bf16.enabled
  /// The model's hidden size h: reduce_bucket_size = h*h; at stage 3 also
  /// stage3_prefetch_bucket_size = 0.9*h*h and stage3_param_persistence_threshold = 10*h.
  std::optional<std::int64_t> hidden_size;
};

/// The whole configuration. Construct it from JSON; every field has DeepSpeed's default.
class ZEROSHARD_API Config {
 public:
  /// Parses and validates a JSON file; throws ConfigError naming the key path on any problem and
  /// IoError when the file cannot be read. `world_size` (the data-parallel ranks) resolves the
  /// batch-size identity (train_batch_size = micro batch x gradient_accumulation_steps x world
  /// size). `overrides` fill "auto" values; an "auto" they do not fill is a ConfigError naming
  /// the key and the override that would.
  static Config from_json_file(const std::string& path, int world_size = 1,
                               const ConfigOverrides& overrides = {});
  static Config from_json_string(const std::string& text, int world_size = 1,
                                 const ConfigOverrides& overrides = {});

  /// Every key with its effective value, as JSON text (what `zeroshard-config FILE` prints):
  /// aliases resolved, "auto" replaced by the overrides, batch sizes and overlap_comm derived.
  /// Parsing it again with the same world size gives the same Config.
  std::string resolved_json(int indent = 2) const;

  /// Notices for accepted keys that have no effect in zeroshard (tensorboard, wandb, ...) and
  /// for deprecated key names, one line each, for the caller to print.
  const std::vector<std::string>& notices() const noexcept { return notices_; }

  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 1.0;    ///< 0 = off; newest DeepSpeed's default (docs/config.md)
  std::int64_t steps_per_print = 0;  ///< 0 = never print (newest DeepSpeed's null)
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::string communication_data_type;  ///< "", "fp32", "fp16" or "bf16"
  std::string grad_accum_dtype;         ///< data_types.grad_accum_dtype: "", "fp32", ...

  ZeroConfig zero_optimization;
  Fp16Config fp16;
  Bf16Config bf16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ActivationCheckpointingConfig activation_checkpointing;
  AioConfig aio;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  CommsLoggerConfig comms_logger;

 private:
  std::vector<std::string> notices_;
  friend class ConfigParser;
};

/// Every key, its type, default and meaning, as the Markdown tables of docs/config.md's reference
/// (what `zeroshard-config --reference` prints).
ZEROSHARD_API std::string config_reference_markdown();

}  // namespace zeroshard
