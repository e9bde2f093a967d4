// What the engine's components share: the registered model, the flat layout, the collaborators
// (communicator, the device's compute backend, one memory resource per tier) and the step's
// timers. The engine builds it at finalize(); the gradient bucketer, the parameter coordinator and
// the optimizer shard hold it by reference and each owns only its own buffers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/compute_backend.h"
#include "comm/node_groups.h"
#include "layout/shard_layout.h"
#include "memory/memory_tracker.h"
#include "zeroshard/communicator.h"
#include "zeroshard/config.h"
#include "zeroshard/engine.h"

namespace zeroshard::detail {

struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  bool trainable = true;
  int group = 0;
  ModuleId module = -1;
  int tensor = -1;                 ///< index in the trainable layout, -1 when frozen
  std::int64_t frozen_offset = 0;  ///< element offset in the frozen buffer
  int bucket = -1;
  bool grad_ready = false;  ///< this micro-step's gradient was handed over
  /// Its place was handed out, zeroed or to be written, in this micro-step's slot (stages 2-3) or
  /// in this window's whole gradients.
  bool grad_fetched = false;
  /// Whole gradients: the first fetch of its last window came through grad_target().
  bool writes_grad = false;
  bool persistent = false;  ///< stage 3: kept whole on every rank
};

struct GroupInfo {
  ParamGroupOptions options;
};

/// Elements [begin, end) of the flat buffer.
struct FlatRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

/// Elements [begin, end) of parameter `param`'s values (Engine::add_module).
struct ParamSliceInfo {
  int param = -1;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

struct ModuleInfo {
  std::string name;
  std::vector<int> params;
  std::int64_t flat_begin = 0;  ///< trainable range the module spans (empty if all frozen)
  std::int64_t flat_end = 0;
  bool sharded = false;  ///< stage 3 and holds a non-persistent trainable parameter
  /// A module made of slices of parameters; empty for a module of whole parameters.
  std::vector<ParamSliceInfo> slices;
  /// What stage 3 gathers: [flat_begin, flat_end), or one range per slice of a sharded parameter.
  std::vector<FlatRange> ranges;
};

/// Where a buffer lives. On a CPU engine the device is host memory too, and pinned host memory is
/// ordinary host memory (there is no DMA engine to lock pages for).
enum class Tier { kDevice, kPinnedHost, kPageableHost };

/// Wall-clock seconds from `start` to now, for the step's timers.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Seconds spent per part of the step since the last progress line (wall_clock_breakdown).
struct StepTimes {
  double reduce = 0.0;
  double update = 0.0;
  /// Parts of the update: this rank's gradient-norm scan; the wait for super_offload's thread
  /// and the ranks' sum of the norm; the rule's pass (with any swap and copy waits inside it).
  double scan = 0.0;
  double norm_wait = 0.0;
  double rule = 0.0;
  /// Offload: the scan's square sums taken of gradients as they landed, outside the update, and
  /// how many tiles the steps' scans added from them instead of reading the gradients again.
  double landed_scan = 0.0;
  std::int64_t landed_tiles = 0;
  double gather = 0.0;
  /// Swap files: what the update waited for reads and writes (I/O it did not hide).
  double swap_read_wait = 0.0;
  double swap_write_wait = 0.0;
  /// Offload: what the host waited for copies between the device and the pinned staging, in
  /// backward (gradients on their way to the host) and in the update (parameters on their way
  /// back).
  double copy_wait = 0.0;
};

struct EngineContext {
  const Config& config;
  int rank = 0;
  int world = 1;
  /// Names this engine's run in its swap records: drawn by rank 0 and the same on every rank.
  std::uint64_t run_id = 0;
  int stage = 0;
  DType dtype = DType::kFloat32;
  std::size_t dsize = 4;
  const ShardLayout& layout;
  std::vector<ParamInfo>& params;
  const std::vector<ModuleInfo>& modules;
  const std::vector<int>& tensor_param;  ///< trainable tensor index -> parameter index
  Communicator& comm;
  /// hpZ: the node groups of zero_hpz_partition_size ranks; null when hpZ is off.
  const NodeGroups* parameter_groups = nullptr;
  ComputeBackend& backend;  ///< the device's: buckets, gathers and the model's buffers
  MemoryTracker& tracker;
  StepTimes& times;

  MemoryResource& resource(Tier tier) const;
  TrackedBuffer allocate(Tier tier, MemoryCategory category, std::size_t bytes) const;
  /// Copies between two engine buffers wherever each lives; blocking when either is host memory.
  void transfer(void* destination, MemoryLocation destination_location, const void* source,
                MemoryLocation source_location, std::size_t bytes) const;
  /// Rounds `count` host fp32 values into `destination` (model dtype, at `location`).
  void store_host_values(const float* values, void* destination, MemoryLocation location,
                         std::int64_t count) const;
  /// The range of the flat buffer this rank updates: all of it at stage 0, its shard otherwise.
  std::int64_t update_begin() const { return stage == 0 ? 0 : layout.shard_begin(rank); }
  std::int64_t update_end() const {
    return stage == 0 ? layout.padded_total() : layout.shard_end(rank);
  }
  /// Gradients are reduced once per accumulation window at stages 0-1, every micro-step after.
  bool gradient_accumulation_boundary(std::int64_t micro_step) const {
    return micro_step + 1 >= config.gradient_accumulation_steps;
  }
};

}  // namespace zeroshard::detail
