// The model-precision parameters: where each lives, and at stage 3 the life cycle of every
// module's gathered copy (gather, prefetch in the order recorded last step, release unless reused
// soon). Decisions depend only on the call sequence, so every rank that makes the same calls
// issues the same collectives in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine_context.h"

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

  /// The buffer the model reads parameter `index` from (stage 3: its gathered module's copy).
  void* data(int index);
  /// Sets parameter `index` everywhere this rank keeps it, from host fp32 values.
  void store(int index, const float* values);
  /// The model-precision element `flat` of the range this rank updates, and where it lives.
  void* owned_at(std::int64_t flat);
  MemoryLocation owned_location() const noexcept;

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
  };

  std::int64_t module_size(ModuleId module) const;
  void start_gather(ModuleId module);
  void finish_gather(ModuleId module);
  void free_module(ModuleId module);
  void prefetch_after(std::size_t trace_index);
  bool reused_soon(ModuleId module) const;
  /// Stage 3: where module `module`'s gathered copy starts, and parameter `index`'s persistent
  /// copy: buffers of their own, or their place in the adopted memory.
  char* gathered_base(ModuleId module);
  char* persistent_base(int index);
  void all_gather_parameters();
  void refresh_persistent_params();

  const EngineContext& context_;
  TrackedBuffer params_full_;   ///< stages 0-2: every trainable parameter, model dtype
  TrackedBuffer param_shard_;   ///< stage 3: this rank's shard, model dtype
  TrackedBuffer adopted_full_;  ///< stage 3: the model's own memory that gathers fill
  TrackedBuffer frozen_;
  std::vector<TrackedBuffer> persistent_copies_;  ///< stage 3: by parameter index, or empty
  std::vector<ModuleState> modules_;

  std::vector<ModuleId> trace_;      ///< gathers of the last complete step
  std::vector<ModuleId> recording_;  ///< gathers of the step in progress
  bool trace_valid_ = false;
  std::size_t trace_position_ = 0;
  std::int64_t live_elements_ = 0;
  std::int64_t peak_live_elements_ = 0;
  std::int64_t persistent_elements_ = 0;
};

}  // namespace zeroshard::detail
