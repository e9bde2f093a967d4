// The optimizer shard: this rank's fp32 master weights, the update rule's state arrays, the
// reduced gradient shard, and the update loop over sub-groups. Where it lives is its placement:
// the device, or host memory under offload_optimizer, where a CPU backend runs the update.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine_context.h"
#include "engine/grad_bucketer.h"
#include "engine/param_coordinator.h"

namespace zeroshard::detail {

/// Per parameter group: the step's scalars after the schedule and the group's overrides.
using GroupContexts = std::vector<StepContext>;

class OptimizerShard final : public ReducedGradientSink {
 public:
  /// `full_grads` is the bucketer's whole gradient buffer (null when the model writes slots);
  /// `grad_shard_dtype` is the type of the stage 2-3 gradient shard on the device.
  OptimizerShard(const EngineContext& context, const UpdateRule& rule, ParamCoordinator& params,
                 const char* full_grads, DType grad_shard_dtype);

  bool offloaded() const noexcept { return update_backend_ != &context_.backend; }

  void accept_reduced(std::int64_t lo, std::int64_t hi, const void* data, DType dtype) override;
  void zero_gradients();
  /// Sum of squares and inf/NaN check of the reduced gradients of [lo, hi) (owned elements).
  GradientScan scan(std::int64_t lo, std::int64_t hi);

  /// Sets the master weights of owned elements [flat, flat + count) from host fp32 values.
  void load_master(std::int64_t flat, const float* values, std::int64_t count);
  /// Copies the owned master weights into `destination` (device memory, whole flat layout).
  void copy_master_to(float* destination);

  /// Checkpoints: array 0 is the master, array 1 + k the rule's state k, each over the owned range.
  int array_count() const noexcept { return 1 + static_cast<int>(states_.size()); }
  std::int64_t owned_begin() const noexcept { return owned_begin_; }
  std::int64_t owned_end() const noexcept { return context_.update_end(); }
  /// The array's elements from `flat` on when they live in host memory (read in place), else null.
  const float* host_view(int array, std::int64_t flat);
  /// Copies owned elements [flat, flat + count) of `array` to or from host memory.
  void read_owned(int array, std::int64_t flat, float* out, std::int64_t count);
  void write_owned(int array, std::int64_t flat, const float* values, std::int64_t count);
  /// After write_owned() of the master: rounds it into the model-precision copy of the owned
  /// range (the stage's spread to other ranks is ParamCoordinator::after_update()).
  void refresh_params_from_master();

  /// Runs the rule over the owned range, sub-group by sub-group: each reads the gradients times
  /// `grad_factor`, updates master and states, and writes the model-precision copy back to the
  /// parameter coordinator's storage.
  void update(float grad_factor, const GroupContexts& contexts);

 private:
  struct GradView {
    const char* base;  ///< element `first` of the range
    std::int64_t first;
    DType dtype;
  };
  GradView gradients() const;
  float* master_at(std::int64_t flat);
  float* state_at(int state, std::int64_t flat);
  float* array_at(int array, std::int64_t flat);
  MemoryLocation array_location(int array) const;
  /// One sub-group: elements [begin, end) of a run that starts at parameter `param`'s piece.
  void update_sub_group(std::int64_t begin, std::int64_t end, int param,
                        std::int64_t offset_in_param, float grad_factor,
                        const GroupContexts& contexts);
  /// The update runs on the host and the parameters live on the GPU: the 16-bit copy goes
  /// through pinned staging, a bounded tile at a time.
  bool writes_back_through_staging() const;
  char* staging(std::size_t bytes);

  const EngineContext& context_;
  const UpdateRule& rule_;
  ParamCoordinator& params_;
  const char* full_grads_;
  std::unique_ptr<ComputeBackend> host_backend_;  ///< offload: the CPU backend the update runs on
  ComputeBackend* update_backend_;
  std::int64_t owned_begin_ = 0;
  bool master_aliases_params_ = false;  ///< fp32 on the device: the parameters are the master
  TrackedBuffer master_;
  std::vector<TrackedBuffer> states_;
  TrackedBuffer grad_shard_;  ///< stages 2-3 or offloaded: the reduced gradients of the shard
  DType grad_shard_dtype_;
  TrackedBuffer scratch_;  ///< fp32 working chunk for 16-bit gradients (communication bytes)
  /// Offload on a GPU: pinned host memory where reduced gradients arrive and updated 16-bit
  /// parameters leave, one sub-group at a time.
  TrackedBuffer staging_;
  std::vector<float*> state_pointers_;
};

}  // namespace zeroshard::detail
