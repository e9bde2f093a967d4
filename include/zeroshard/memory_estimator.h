// How many bytes per rank a ZeRO configuration needs, by category and tier (device, host, NVMe),
// computed from the engine's allocation rules without running anything; and the inverse question,
// the largest model that fits in a given device memory.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "zeroshard/config.h"
#include "zeroshard/dtype.h"
#include "zeroshard/export.h"
#include "zeroshard/memory_report.h"

namespace zeroshard {

/// Where estimated bytes live. "Device" is the memory the engine keeps its buffers in: GPU memory
/// for CUDA ranks, host memory for CPU ranks. "Host" is what offload moves to CPU memory
/// (including pinned swap buffers); "NVMe" is what offload moves to swap files.
enum class MemoryTier { kDevice, kHost, kNvme };
inline constexpr int kMemoryTierCount = 3;
/// "device", "host", "nvme".
ZEROSHARD_API const char* to_string(MemoryTier tier) noexcept;

/// One configuration to estimate. Element counts are in elements, as in DeepSpeed's config;
/// every default is DeepSpeed's.
struct EstimateInput {
  /// Trainable elements P, used when `tensors` is empty (as one tensor).
  std::int64_t params = 0;
  /// The trainable tensors' element counts in registration order, when known: the estimate then
  /// follows the engine's exact layout (alignment padding, largest tensor, stage-3 persistence).
  std::vector<std::int64_t> tensors;
  /// Frozen elements (trainable = false): kept whole on every rank, no gradient or state.
  std::int64_t frozen_params = 0;
  /// Data-parallel world size N and the nodes it spans (host memory is also given per node).
  int ranks = 1;
  int nodes = 1;
  int stage = 0;
  /// Element type of the model's parameters and gradients; fp16/bf16 add fp32 master weights.
  DType precision = DType::kFloat32;
  /// data_types.grad_accum_dtype = "fp32": stages 2-3 keep the gradient shard in fp32, on the
  /// device or beside an offloaded update (otherwise it is in the model's type there too); stages
  /// 0-1 with 16-bit gradients add an fp32 accumulator of the whole gradients.
  bool fp32_grad_accumulation = false;
  /// communication_data_type = "fp32" with 16-bit parameters: gradients are reduced widened, so
  /// each bucket slot also holds an fp32 copy of the bucket, which it is reduced in.
  bool fp32_communication = false;
  /// adam, adamw, sgd, lion, adagrad (case-insensitive); sets the number of fp32 state arrays.
  std::string optimizer = "adamw";
  /// Overrides the state-array count the optimizer's name implies (-1 = from the name): SGD with
  /// momentum has 1, AMSGrad 3.
  int optimizer_state_arrays = -1;
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  /// offload_optimizer.ratio: the share of each rank's optimizer shard offloaded (its first
  /// elements, to a multiple of 16); the rest is held and updated on the device.
  double offload_ratio = 1.0;
  /// offload_optimizer.super_offload: a second master and states beside the host's share.
  bool super_offload = false;
  /// gradient_accumulation_steps: with 1, the offloaded update's gradient-norm scan keeps a square
  /// sum and a flag (9 bytes) per 65,536 elements of the host's share, taken as they land.
  std::int64_t gradient_accumulation_steps = 1;
  OffloadDevice offload_param = OffloadDevice::kNone;
  std::int64_t reduce_bucket_size = 500000000;
  bool reduce_scatter = true;
  /// Elements of the largest trainable tensor when `tensors` is empty; 0 = unknown, taken as no
  /// larger than a bucket.
  std::int64_t largest_tensor = 0;
  /// Stage 3, when `tensors` is empty: trainable elements in tensors kept whole on every rank.
  std::int64_t persistent_params = 0;
  /// Stage 3, with `tensors`: tensors below this many elements are kept whole, up to
  /// `model_persistence_threshold` elements in all (stage3_param_persistence_threshold, ...).
  std::int64_t param_persistence_threshold = 100000;
  std::int64_t model_persistence_threshold = INT64_MAX;
  /// Stage 3: at most this many gathered elements are alive at once (stage3_max_live_parameters).
  std::int64_t max_live_parameters = 1000000000;
  /// Stage 3, zero_quantized_weights (qwZ): each gather in flight also holds the int8 encoding of
  /// its module, counted in the transient bytes.
  bool quantized_weights = false;
  /// Stage 3, zero_quantized_nontrainable_weights: the frozen parameters are kept as int8 blocks;
  /// the decoded copies of gathered ones are counted in the transient bytes.
  bool quantized_nontrainable_weights = false;
  /// With it: the most frozen elements gathered at once (the largest module's when modules are
  /// gathered one at a time); 0 = every frozen parameter, as gather_model() holds them.
  std::int64_t largest_frozen_module = 0;
  /// Stage 3, zero_hpz_partition_size (hpZ) when > 1: each rank keeps 1/K of the gathered
  /// (non-persistent) parameters as its node group's secondary partition until the update.
  std::int64_t hpz_partition_size = 1;
  /// Stage 3, zero_quantized_gradients (qgZ): each reduction in flight also holds the encodings
  /// and partial sums of its bucket (ranks grouped by node), counted in the transient bytes.
  bool quantized_gradients = false;
  /// offload_optimizer nvme: pinned host swap buffers, each one sub-group tile of fp32 elements.
  std::int64_t optimizer_buffer_count = 4;
  /// Elements per sub-group tile; 0 = one parameter per sub-group, taken as the largest tensor.
  std::int64_t sub_group_size = 1000000000;
  /// offload_param nvme: the first `param_max_in_cpu` elements of the shard stay in host
  /// memory; the rest go to a swap file through `param_buffer_count` pinned buffers of
  /// `param_buffer_size` model-precision elements.
  std::int64_t param_buffer_count = 5;
  std::int64_t param_buffer_size = 100000000;
  std::int64_t param_max_in_cpu = 1000000000;
  /// Activation bytes per rank, as the caller measured or estimated them, beside the chain below.
  std::int64_t activation_bytes = 0;
  /// A chain of `layers` layers whose outputs (and input) are `layer_activation_bytes` each, with
  /// activation checkpointing every `checkpoint_every` layers (0 = none) and cpu_checkpointing:
  /// its peak (estimate_activations) is added to the activations.
  std::int64_t layer_activation_bytes = 0;
  int layers = 0;
  int checkpoint_every = 0;
  bool cpu_checkpointing = false;
};

/// Peak activation bytes of a chain of `layers` layers, each output (and the chain's input)
/// `layer_activation_bytes` A: (L + 1) x A without checkpointing (every = 0); with a checkpoint
/// every k layers, n = ceil(L/k) kept inputs plus one block's k activations, (n + k) x A when k
/// divides L (else max(n + r, n - 1 + k) x A, r the last block's layers). With cpu_checkpointing
/// the n kept inputs are on the host and the device holds the running block's input and its
/// activations, and from the second block on one more input whose copy is in flight (going out in
/// forward, prefetched in backward): (1 + L) x A for one block, (2 + k) x A for three or more,
/// max(1 + k, 2 + r) x A for two.
struct ActivationEstimate {
  std::int64_t device = 0;
  std::int64_t host = 0;
};
ZEROSHARD_API ActivationEstimate estimate_activations(std::int64_t layer_activation_bytes,
                                                      int layers, int checkpoint_every,
                                                      bool cpu_checkpointing = false);

/// Bytes one rank needs, per tier and category.
struct ZEROSHARD_API MemoryEstimate {
  EstimateInput input;
  /// False when the combination is not valid (e.g. offload_param below stage 3); `reason` says
  /// why and every byte count is 0.
  bool valid = true;
  std::string reason;
  /// Resident bytes after a step. Communication buffers are their upper bound (two bucket
  /// slots); every other figure is what the engine allocates, exactly.
  std::array<std::array<std::int64_t, kMemoryCategoryCount>, kMemoryTierCount> bytes{};
  /// Upper bound of the transient bytes on top (stage 3: gathered modules).
  std::int64_t transient_device_bytes = 0;
  /// The flat buffer after the engine's padding, and this rank's shard of it.
  std::int64_t padded_params = 0;
  std::int64_t shard_params = 0;
  /// Bytes this rank sends per optimizer step under the counting convention of
  /// docs/architecture.md: 2P elements for stages 0-2 and 3P for stage 3 (P padded), as in the
  /// ZeRO paper; 4P at stage 3 when a checkpointed chain's forward is gathered again.
  std::int64_t traffic_bytes_per_step = 0;
  /// One line per assumption the figures rest on, for the reader.
  std::vector<std::string> notes;

  std::int64_t at(MemoryCategory category, MemoryTier tier = MemoryTier::kDevice) const {
    return bytes[static_cast<int>(tier)][static_cast<int>(category)];
  }
  /// Parameters + gradients + master weights + optimizer states: the ZeRO paper's figure.
  std::int64_t model_state_bytes(MemoryTier tier = MemoryTier::kDevice) const;
  /// Every category at one tier, resident bytes.
  std::int64_t total(MemoryTier tier = MemoryTier::kDevice) const;
  /// Device total plus the transient bytes: what must fit.
  std::int64_t device_peak() const { return total(MemoryTier::kDevice) + transient_device_bytes; }
  /// Host bytes of all the ranks on one node.
  std::int64_t host_per_node() const;
};

/// Elements of the fp32 scratch the engine widens 16-bit gradients in (counted under
/// communication, with the other bounded buffers): at most this many, and never more than the
/// part of the flat buffer a rank updates or a sub_group_size tile.
inline constexpr std::int64_t kGradientScratchElements = std::int64_t{1} << 16;

/// Estimates one configuration. Throws ConfigError on impossible input (ranks < 1, stage outside
/// 0..3, unknown optimizer); a valid input that DeepSpeed forbids (offload below the stage that
/// supports it) returns an estimate with valid == false.
ZEROSHARD_API MemoryEstimate estimate(const EstimateInput& input);

/// The input a config file describes for a model of `params` trainable elements on `ranks`
/// ranks: stage, precision, optimizer, offload and bucket settings.
ZEROSHARD_API EstimateInput estimate_input_from_config(const Config& config, std::int64_t params,
                                                       int ranks);
ZEROSHARD_API MemoryEstimate estimate_from_config(const Config& config, std::int64_t params,
                                                  int ranks);

/// The largest P whose device peak fits in `device_bytes_per_rank`, with every other setting
/// taken from `base` (its params and tensors are ignored: P is one tensor); 0 when nothing fits.
ZEROSHARD_API std::int64_t largest_model(std::int64_t device_bytes_per_rank,
                                         const EstimateInput& base);
/// The same with `base` defaulted except for ranks and stage.
ZEROSHARD_API std::int64_t largest_model(std::int64_t device_bytes_per_rank, int ranks, int stage,
                                         DType precision = DType::kFloat32,
                                         const std::string& optimizer = "adamw");

/// offload_optimizer.ratio "auto": the smallest ratio at which the device's share of the optimizer
/// (its gradients, master weights, states and working chunk) adds at most `spare_device_bytes` to
/// the device's resident bytes at ratio 1. `base` offloads the optimizer to cpu; its ratio is
/// ignored. Bisected over whole alignment steps of the split (the engine's split_optimizer): 1
/// when not one step fits, and a ratio that leaves the host no element when the whole shard does.
ZEROSHARD_API double smallest_offload_ratio(std::int64_t spare_device_bytes,
                                            const EstimateInput& base);

/// fp32 state arrays per element of the named optimizer (adam/adamw 2, lion/adagrad 1, sgd 0);
/// throws ConfigError naming the allowed names otherwise.
ZEROSHARD_API int optimizer_state_arrays(const std::string& optimizer);

/// Says what "device" means in this build, for printing beside the figures.
ZEROSHARD_API const char* device_memory_meaning() noexcept;

}  // namespace zeroshard
