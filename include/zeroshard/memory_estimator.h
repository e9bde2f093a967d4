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
#include "zeroshard/memory_report.h"

namespace zeroshard {

/// Where estimated bytes live. "Device" is the memory the engine keeps its buffers in: GPU memory
/// for CUDA ranks, host memory for CPU ranks. "Host" is what offload moves to CPU memory
/// (including pinned swap buffers); "NVMe" is what offload moves to swap files.
enum class MemoryTier { kDevice, kHost, kNvme };
inline constexpr int kMemoryTierCount = 3;
/// "device", "host", "nvme".
const char* to_string(MemoryTier tier) noexcept;

/// One configuration to estimate. Element counts are in elements, as in DeepSpeed's config;
/// every default is DeepSpeed's.
struct EstimateInput {
  /// Trainable elements P.
  std::int64_t params = 0;
  /// Elements of the flat buffer after the engine's padding; 0 = params rounded up to a multiple
  /// of `ranks` (what the engine does for a single tensor).
  std::int64_t padded_params = 0;
  /// Data-parallel world size N and the nodes it spans (host memory is also given per node).
  int ranks = 1;
  int nodes = 1;
  int stage = 0;
  /// Element type of the model's parameters and gradients; fp16/bf16 add fp32 master weights.
  DType precision = DType::kFloat32;
  /// adam, adamw, sgd, lion, adagrad (case-insensitive); sets the number of fp32 state arrays.
  std::string optimizer = "adamw";
  /// Overrides the state-array count the optimizer's name implies (-1 = from the name): SGD with
  /// momentum has 1, AMSGrad 3.
  int optimizer_state_arrays = -1;
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;
  std::int64_t reduce_bucket_size = 500000000;
  std::int64_t allgather_bucket_size = 500000000;
  /// Elements of the largest parameter tensor; 0 = unknown, taken as min(P, bucket size).
  std::int64_t largest_tensor = 0;
  /// Stage 3: trainable elements in tensors kept whole on every rank (below
  /// stage3_param_persistence_threshold).
  std::int64_t persistent_params = 0;
  /// Stage 3: elements of the largest module gathered at once (transient, counted in the peak).
  std::int64_t gathered_params = 0;
  /// offload_optimizer nvme: pinned host swap buffers, each one sub-group tile of fp32 elements.
  std::int64_t optimizer_buffer_count = 4;
  std::int64_t sub_group_size = 1000000000;
  /// offload_param nvme: pinned host swap buffers of `param_buffer_size` 16-bit elements.
  std::int64_t param_buffer_count = 5;
  std::int64_t param_buffer_size = 100000000;
  /// Activation bytes per rank, as the caller measured or estimated them (not modelled here).
  std::int64_t activation_bytes = 0;
};

/// Bytes one rank needs, per tier and category.
struct MemoryEstimate {
  EstimateInput input;
  /// False when the combination is not valid (e.g. offload_param below stage 3); `reason` says
  /// why and every byte count is 0.
  bool valid = true;
  std::string reason;
  std::array<std::array<std::int64_t, kMemoryCategoryCount>, kMemoryTierCount> bytes{};
  /// Transient bytes on top of the resident ones at the step's peak (stage-3 gathered modules).
  std::int64_t transient_device_bytes = 0;
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

/// Estimates one configuration. Throws ConfigError on impossible input (ranks < 1, stage outside
/// 0..3, unknown optimizer); a valid input that DeepSpeed forbids (offload below the stage that
/// supports it) returns an estimate with valid == false.
MemoryEstimate estimate(const EstimateInput& input);

/// The input a config file describes for a model of `params` trainable elements on `ranks`
/// ranks: stage, precision, optimizer, offload and bucket settings.
EstimateInput estimate_input_from_config(const Config& config, std::int64_t params, int ranks);
MemoryEstimate estimate_from_config(const Config& config, std::int64_t params, int ranks);

/// The largest P whose device peak fits in `device_bytes_per_rank`, with every other setting
/// taken from `base` (its params are ignored); 0 when not even the buffers fit.
std::int64_t largest_model(std::int64_t device_bytes_per_rank, const EstimateInput& base);
/// The same with `base` defaulted except for ranks and stage.
std::int64_t largest_model(std::int64_t device_bytes_per_rank, int ranks, int stage,
                           DType precision = DType::kFloat32,
                           const std::string& optimizer = "adamw");

/// fp32 state arrays per element of the named optimizer (adam/adamw 2, lion/adagrad 1, sgd 0);
/// throws ConfigError naming the allowed names otherwise.
int optimizer_state_arrays(const std::string& optimizer);

/// Says what "device" means in this build, for printing beside the figures.
const char* device_memory_meaning() noexcept;

}  // namespace zeroshard
