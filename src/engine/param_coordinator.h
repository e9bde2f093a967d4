// The model-precision parameters: where each lives, and at stage 3 the life cycle of every
// module's gathered copy (gather, prefetch in the order recorded last step, release unless reused
// soon). Decisions depend only on the call sequence, so every rank that makes the same calls
// issues the same collectives in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine_context.h"
#include "engine/frozen_params.h"
#include "offload/swapped_shard.h"

namespace zeroshard::detail {

class ParamCoordinator {
 public:
  /// Allocates the whole flat buffer (stages 0-2) or this rank's shard in `shard_tier` (stage 3;
  /// host memory under offload_param), the persistent copies and the frozen parameters.
  /// `adopted`, when not null, is the model's own flat parameter memory: stages 0-2 work in it
  /// instead of a buffer of their own, stage 3 takes its shard from it and gathers into it.
  ParamCoordinator(const EngineContext& context, Tier shard_tier, void* adopted);
  /// Waits for every gather in flight before the buffers it writes are freed.
  ~ParamCoordinator();
  ParamCoordinator(const ParamCoordinator&) = delete;
  ParamCoordinator& operator=(const ParamCoordinator&) = delete;

  /// The buffer the model reads parameter `index` from (stage 3: its gathered module's copy, and
  /// for a frozen one under zero_quantized_nontrainable_weights its module's decoded copy).
  void* data(int index);
  /// Sets parameter `index` everywhere this rank keeps it, from host fp32 values.
  void store(int index, const float* values);
  /// Host fp32 values of frozen parameter `index` as the model reads them, gathered or not.
  void read_frozen(int index, float* out) { frozen_.read(index, out); }
  /// The model-precision element `flat` of the range this rank updates, and where it lives.
  /// Not for a swapped shard (see swaps()): its elements are reached through the calls below.
  void* owned_at(std::int64_t flat);
  MemoryLocation owned_location() const noexcept;
  /// Elements [flat, flat + count) of the range this rank updates, wherever they live.
  void read_owned(std::int64_t flat, void* out, MemoryLocation out_location, std::int64_t count);
  void write_owned(std::int64_t flat, const void* values, MemoryLocation values_location,
                   std::int64_t count);
  /// The same from host fp32 values, rounded to the model's type.
  void store_owned(std::int64_t flat, const float* values, std::int64_t count);
  /// Stage 3: an uninitialised twin of the resident shard when it holds the whole owned range
  /// and no gather reads from it; empty otherwise (see OptimizerShard::staging_for).
  TrackedBuffer staging_for_owned();
  /// `staged`, from staging_for_owned() and filled, becomes the shard; the previous one is freed.
  void adopt_owned(TrackedBuffer staged);
  /// Where the owned elements from `flat` on stop being contiguous in memory: the end of the
  /// resident part or of a swap tile (the end of the shard when nothing is swapped).
  std::int64_t owned_run_end(std::int64_t flat) const;
  /// Host memory for elements [flat, flat + count), which must lie before owned_run_end(flat),
  /// to be written before the next call on this object (a swapped tile is written back later).
  void* writable_owned(std::int64_t flat, std::int64_t count);

  /// Stage 3 under offload_param.device nvme: part of the shard is in a swap file.
  bool swaps() const noexcept { return swapped_ != nullptr; }
  /// Around an update that writes the owned range: writes the cached tiles back and remembers
  /// the records; flush_update() writes what the update changed (IoError when a write failed:
  /// the values stay in the cache); roll_back_update() returns to the records of begin_update().
  void begin_update();
  void flush_update();
  void roll_back_update() noexcept;
  /// Tests only: a fault in the parameter shard's swap file.
  void inject_swap_fault(const IoFault& fault) { swapped_->inject_fault(fault); }

  void gather(ModuleId module);
  void release(ModuleId module);
  /// Stage 3, before an update: every module must be released; kept copies are freed (they would
  /// be stale) and the order of this step's gathers becomes the prefetch trace.
  void release_all_after_step(const char* caller = "step()");
  /// Spreads the updated owned range: all-gather (stages 1-2) or the persistent copies (stage 3).
  void after_update();
  /// Lets the transport advance the gathers in flight.
  void poll();
  /// The most elements held gathered at once (modules, prefetched ones included, and the
  /// persistent parameters).
  std::int64_t peak_gathered_elements() const noexcept {
    return peak_live_elements_ + persistent_elements_;
  }

 private:
  enum class Residency { kReleased, kInFlight, kAvailable };
  struct ModuleState {
    Residency residency = Residency::kReleased;
    int users = 0;  ///< gather() calls not yet matched by release()
    TrackedBuffer gathered;
    std::vector<Request> pending;  ///< one all-gather per range
    /// qwZ, while in flight: the non-finite block counter (one int), then for each range every
    /// rank's int8 encoding of its piece, each padded to whole fp32 elements.
    TrackedBuffer encoded;
    /// hpZ: this rank's piece of each range for its node group, from the module's first gather
    /// of the step until the update; empty otherwise. Its gathers then run inside the group.
    TrackedBuffer secondary;
    /// hpZ: the gather in flight reads the secondary partition, not the shards.
    bool from_secondary = false;
    /// zero_quantized_nontrainable_weights: the module's frozen parameters decoded, while a
    /// gather() is not matched by its release().
    TrackedBuffer frozen_decoded;
  };

  std::int64_t module_size(ModuleId module) const;
  /// hpZ: how a range of `elements` splits over the ranks of a node group.
  std::vector<std::int64_t> group_counts(std::int64_t elements) const;
  /// hpZ: copies this rank's pieces of the module's gathered copy into its secondary partition.
  void keep_secondary(ModuleId module);
  /// hpZ: writes host fp32 `values` of elements [lo, lo + count) into the module's secondary
  /// partition where it holds them.
  void store_secondary(ModuleId module, std::int64_t lo, const float* values, std::int64_t count);
  /// Frees gathered copies no caller holds (kept for reuse, prefetched) until `incoming` more
  /// elements fit stage3_max_live_parameters, or none is left to free.
  void free_unused_over_budget(std::int64_t incoming);
  void start_gather(ModuleId module);
  /// start_gather's all-gather of every rank's shard of the module (int8 blocks under qwZ).
  void start_gather_from_shards(ModuleId module, char* gathered);
  void finish_gather(ModuleId module);
  void free_module(ModuleId module);
  /// qwZ: after the gathers, every rank's encoded piece decoded into the module's gathered copy
  /// (UsageError when this rank's own piece held inf or NaN).
  void decode_gathered(ModuleId module);
  /// A buffer for `bytes` of gathered parameters: a released module's of that size when one is
  /// kept, else a new one (the kept ones are freed first, so that memory never exceeds what
  /// freeing at release would hold).
  TrackedBuffer take_gathered_buffer(std::size_t bytes);
  void prefetch_after(std::size_t trace_index);
  bool reused_soon(ModuleId module) const;
  /// ZEROSHARD_POISON_RELEASED: fills what the model would read of a module that is not
  /// gathered with NaN, so that a read outside gather() shows at once instead of as stale values.
  void poison_released(ModuleId module);
  /// Stage 3: where module `module`'s gathered copy starts, and parameter `index`'s persistent
  /// copy: buffers of their own, or their place in the adopted memory.
  char* gathered_base(ModuleId module);
  char* persistent_base(int index);
  void all_gather_parameters();
  void refresh_persistent_params();
  /// Calls use(pointer, its location, elements done before, elements of the part) for each part
  /// of the owned elements [flat, flat + count): the resident shard's, then the swapped tiles'.
  template <class Use>
  void for_each_owned_part(std::int64_t flat, std::int64_t count, bool will_write, Use use);
  /// Under a swapped shard: starts reading the owned parts of the modules the trace gathers
  /// next, as far as the swap buffers allow.
  void read_ahead_after(std::size_t trace_index);

  const EngineContext& context_;
  TrackedBuffer params_full_;  ///< stages 0-2: every trainable parameter, model dtype
  TrackedBuffer param_shard_;  ///< stage 3: this rank's shard (its resident part), model dtype
  std::int64_t resident_elements_ = 0;     ///< stage 3: shard elements in param_shard_
  std::unique_ptr<SwappedShard> swapped_;  ///< stage 3, nvme: the shard's elements after those
  TrackedBuffer adopted_full_;             ///< stage 3: the model's own memory that gathers fill
  FrozenParams frozen_;
  std::vector<TrackedBuffer> persistent_copies_;  ///< stage 3: by parameter index, or empty
  std::vector<ModuleState> modules_;
  /// Released modules' buffers, until the next gather takes one or step() frees them: a fresh
  /// buffer costs a zeroing pass and page faults that the all-gather, overwriting it whole,
  /// does not need.
  std::vector<TrackedBuffer> spare_gathered_;

  std::vector<ModuleId> trace_;      ///< gathers of the last complete step
  std::vector<ModuleId> recording_;  ///< gathers of the step in progress
  bool trace_valid_ = false;
  std::size_t trace_position_ = 0;
  std::int64_t live_elements_ = 0;
  std::int64_t peak_live_elements_ = 0;
  std::int64_t persistent_elements_ = 0;
  bool poison_released_ = false;
};

}  // namespace zeroshard::detail
