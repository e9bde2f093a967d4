// One part of the optimizer shard: the fp32 master weights, the update rule's state arrays and
// the reduced gradients of a contiguous range of this rank's owned elements, and the update loop
// over its sub-groups. Where it lives is its placement: the device, or host memory under
// offload_optimizer, where a CPU backend runs the update. The shard (optimizer_shard.h) is one
// part, or two under offload_optimizer.ratio below 1.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine_context.h"
#include "engine/host_staging.h"
#include "engine/param_coordinator.h"
#include "offload/swapped_arrays.h"
#include "util/work_thread.h"

namespace zeroshard::detail {

/// Per parameter group: the step's scalars after the schedule and the group's overrides.
using GroupContexts = std::vector<StepContext>;

/// Where a part of the optimizer shard lives and is updated.
enum class PartPlacement { kDevice, kHost };

class OptimizerPart final {
 public:
  /// The part holds owned elements [owned.begin, owned.end). `full_grads` is the bucketer's whole
  /// gradient buffer (null when the model writes slots); `grad_shard_dtype` is the type the
  /// gradient shard and the whole gradients accumulate in, offloaded or not
  /// (data_types.grad_accum_dtype), so that offload never changes the sums. kHost places it as
  /// offload_optimizer says (CPU memory or NVMe, pinned or not).
  /// `predecessor`, a host part (not swapped) whose range starts where this host part's does and
  /// is no shorter, hands this part its arrays as they stand, tails included: its first elements
  /// are this part's values, and nothing is copied or allocated twice. It is spent afterwards.
  OptimizerPart(const EngineContext& context, const UpdateRule& rule, ParamCoordinator& params,
                char* full_grads, DType grad_shard_dtype, FlatRange owned, PartPlacement placement,
                OptimizerPart* predecessor = nullptr);
  /// Joins the update thread before the arrays it writes are freed.
  ~OptimizerPart();
  OptimizerPart(const OptimizerPart&) = delete;
  OptimizerPart& operator=(const OptimizerPart&) = delete;

  bool offloaded() const noexcept { return update_backend_ != &context_.backend; }
  /// Bytes of host memory this part holds when offloaded (its arrays, working chunk, staging and
  /// the scan's landed sums).
  std::int64_t host_bytes() const noexcept;
  /// offload_optimizer.device nvme: the master weights and states live in swap files.
  bool swaps() const noexcept { return swapped_ != nullptr; }
  /// The swap files' I/O since construction (swaps() only).
  SwapTimes swap_times() const noexcept { return swapped_ ? swapped_->times() : SwapTimes{}; }
  /// Tests only: a fault in the swap file of `array` (0 the master, 1 + k state k).
  void inject_swap_fault(int array, const IoFault& fault) { swapped_->inject_fault(array, fault); }

  /// ReducedGradientSink's calls for parts [lo, hi) within this part.
  void* reduce_target(std::int64_t lo, std::int64_t hi, DType dtype);
  void accept_reduced(std::int64_t lo, std::int64_t hi, const void* data, DType dtype);
  void expect_deliveries(std::int64_t elements, DType dtype);
  void before_reuse();
  void micro_step_reduced();
  /// Drops this window's gradients: the next micro-step's arrivals replace the shard.
  void zero_gradients();
  /// Adds the sum of squares and inf/NaN check of the reduced gradients of [lo, hi) (elements of
  /// this part) to `scan`.
  void scan(std::int64_t lo, std::int64_t hi, GradientScan& scan);

  /// Sets the master weights of owned elements [flat, flat + count) from host fp32 values.
  void load_master(std::int64_t flat, const float* values, std::int64_t count);
  /// Copies the owned master weights of flat elements [lo, hi) into `destination` (device
  /// memory, element lo at destination[0]); the rest of it is left as it was.
  void copy_master_to(float* destination, std::int64_t lo, std::int64_t hi);

  /// Checkpoints: array 0 is the master, array 1 + k the rule's state k, each over the owned range.
  int array_count() const noexcept { return 1 + rule_.state_count(); }
  std::int64_t owned_begin() const noexcept { return owned_begin_; }
  std::int64_t owned_end() const noexcept { return owned_end_; }
  /// The array's elements from `flat` on when they live in host memory (read in place), else null.
  const float* host_view(int array, std::int64_t flat);
  /// Copies owned elements [flat, flat + count) of `array` to or from host memory.
  void read_owned(int array, std::int64_t flat, float* out, std::int64_t count);
  void write_owned(int array, std::int64_t flat, const float* values, std::int64_t count);
  /// Host memory to stage a new owned range of `array` in, which adopt_array() then puts in the
  /// array's place instead of copying it: empty when the array cannot be replaced whole (device
  /// memory, swap files, the model's own memory, a gather in flight from it); the caller then
  /// stages elsewhere and uses write_owned().
  TrackedBuffer staging_for(int array);
  /// `staged`, from staging_for(array) and filled with the owned range, becomes the array; the
  /// previous one is freed.
  void adopt_array(int array, TrackedBuffer staged);
  /// After write_owned() of the master: rounds it into the model-precision copy of the owned
  /// range (the stage's spread to other ranks is ParamCoordinator::after_update()).
  void refresh_params_from_master();

  /// Runs the rule over the owned range, sub-group by sub-group: each reads the gradients times
  /// `grad_factor`, updates master and states, and writes the model-precision copy back to the
  /// parameter coordinator's storage. With swap files, sub-group i + 1 is read and i - 1 written
  /// while i is updated (as pipeline_read and pipeline_write allow). Offloaded, the copy of each
  /// tile to the device runs while the next one is updated.
  void update(float grad_factor, const GroupContexts& contexts);
  /// Whether update() reads the bucketer's whole gradients and leaves them zero over the owned
  /// range: each chunk is cleared as the rule reads it, so that the step needs no separate pass
  /// over that range (the padding between runs is never written and stays zero). Not when the
  /// next window writes them instead (leave_whole_gradients()).
  bool clears_whole_gradients() const noexcept {
    return grad_shard_.empty() && full_grads_ != nullptr && !leaves_whole_gradients_;
  }
  /// The next update() leaves the whole gradients as they are (GradBucketer::leaves_full_grads()).
  void leave_whole_gradients(bool leave) noexcept { leaves_whole_gradients_ = leave; }
  /// super_offload: the update can run during backward on a thread of its own.
  bool overlaps_update() const noexcept { return update_thread_ != nullptr; }
  /// From now until finish_overlapped_update(), each part of the shard whose reduced gradients
  /// land is updated on the update thread with `grad_factor` and `contexts` into a second master
  /// and states, while backward goes on; the arrays in use are left as they are.
  void begin_overlapped_update(float grad_factor, GroupContexts contexts);
  bool overlapped_update_begun() const noexcept { return overlap_.begun; }
  /// At the window's end: lands every gradient in flight and waits for the update thread;
  /// rethrows its error, with the master and states unchanged.
  void finish_overlapped_update();
  /// Keeps the finished overlapped update when it covered every owned element with this
  /// `grad_factor` and these `contexts`: the second master and states become the arrays, and the
  /// owned parameters are rounded from them. Otherwise drops it and returns false: update() then
  /// runs as without super_offload, from arrays the overlapped update never wrote.
  bool keep_overlapped_update(float grad_factor, const GroupContexts& contexts);
  /// After update() failed on some rank (an I/O error on swap files): every rank makes the
  /// master and states what they were before it and rounds the owned parameters it wrote back
  /// from them, so that no rank keeps half a step. Only with swaps(); resident updates do not fail
  /// part-way.
  void roll_back_update();

 private:
  /// Elements [begin, end) of the owned range that one rule call may cover: a tensor piece, or
  /// on a backend with fused kernels consecutive pieces of one parameter group.
  struct Run {
    std::int64_t begin;
    std::int64_t end;
    int first_param;
    std::int64_t offset_in_param;
  };
  std::vector<Run> runs() const;
  void update_swapped(const std::vector<Run>& runs, float grad_factor,
                      const GroupContexts& contexts);
  void refresh_params(std::int64_t begin, std::int64_t end);
  /// Reads the master of owned elements [first, last) one bounded chunk at a time and calls
  /// use_chunk(first element, host fp32 values, count) for each.
  template <class UseChunk>
  void for_each_master_chunk(std::int64_t first, std::int64_t last, UseChunk use_chunk);
  struct GradView {
    const char* base;  ///< element `first` of the range
    std::int64_t first;
    DType dtype;
    /// The gradient of flat element `flat`.
    const char* at(std::int64_t flat) const { return base + (flat - first) * size_of(dtype); }
  };
  GradView gradients() const;
  float* master_at(std::int64_t flat);
  float* state_at(int state, std::int64_t flat);
  float* array_at(int array, std::int64_t flat);
  MemoryLocation array_location(int array) const;
  /// One sub-group: elements [begin, end) of a run that starts at parameter `param`'s piece;
  /// `arrays` point at element `begin` of the master (first) and of each state.
  /// `writes_params`: the updated values are also rounded into the parameters; otherwise (the
  /// overlapped update, during backward, which still reads them) into overlap_params_.
  void update_sub_group(std::int64_t begin, std::int64_t end, int param,
                        std::int64_t offset_in_param, float grad_factor,
                        const GroupContexts& contexts, std::span<float* const> arrays,
                        bool writes_params);
  /// Queues the owned elements of [lo, hi), whose gradients have all landed, to the update thread
  /// when an overlapped update has begun.
  void queue_overlapped(std::int64_t lo, std::int64_t hi);
  /// On the update thread: copies the master and states of the owned elements of [lo, hi) into
  /// the second set and updates them there, a cache-sized chunk at a time, over the host's team
  /// when the part is large; the parameters' copy goes to overlap_params_.
  void update_overlapped(std::int64_t lo, std::int64_t hi);
  /// Lands what is in flight of the overlapped update, queues no more of it, and waits for the
  /// update thread; rethrows its error.
  void wait_for_overlapped_update();
  /// Called before the arrays or the gradient shard are read or written outside step(): waits for
  /// an overlapped update still running and drops it (its error shows again in the update that
  /// replaces it).
  void drop_overlapped_update();
  /// The update is offloaded and the parameters live on the device: the 16-bit copy goes
  /// through pinned staging, a bounded tile at a time.
  bool writes_back_through_staging() const;
  /// The update runs on the device and the parameters live on the host (offload_param alone):
  /// they are rounded from the master after each sub-group.
  bool rounds_params_from_master() const;
  /// Every reduced gradient in flight to the host is added into the shard.
  void land_gradients();
  /// The reduced gradients of [lo, hi) have landed in the shard: takes the square sums of the
  /// scan tiles they fill (landed_sums_), and forgets those they fill only in part.
  void note_landed(std::int64_t lo, std::int64_t hi);
  /// The parameters' copies to the device are ordered before the compute stream's next work.
  void finish_write_back();

  const EngineContext& context_;
  const UpdateRule& rule_;
  ParamCoordinator& params_;
  char* full_grads_;
  bool leaves_whole_gradients_ = false;
  std::unique_ptr<ComputeBackend> host_backend_;  ///< offload: the CPU backend the update runs on
  ComputeBackend* update_backend_;
  const std::int64_t owned_begin_;
  const std::int64_t owned_end_;
  /// Elements per sub-group: zero_optimization.sub_group_size, or for DeepSpeed's 0 (one
  /// parameter per sub-group) the largest piece of one tensor in this rank's shard.
  std::int64_t sub_group_ = 0;
  bool master_aliases_params_ = false;  ///< fp32 on the device: the parameters are the master
  TrackedBuffer master_;
  std::vector<TrackedBuffer> states_;
  TrackedBuffer grad_shard_;  ///< stages 2-3 or offloaded: the reduced gradients of the shard
  const DType grad_shard_dtype_;
  /// The shard holds nothing of this accumulation window, so arrivals store instead of adding:
  /// it is never zeroed in a pass of its own.
  bool replace_ = true;
  bool arrived_ = false;  ///< some part has arrived in the micro-step in progress
  /// Offloaded with one micro-step per window: tile k of the gradient-norm scan counted from
  /// owned_begin_ (cpu_optimizer::kSquareTile elements), its square sum taken as its gradients
  /// landed, while backward went on, when landed_known_[k]; scan() adds it as it stands.
  std::span<double> landed_sums_;
  std::span<std::uint8_t> landed_known_;
  TrackedBuffer landed_;   ///< landed_sums_, then landed_known_ (communication bytes)
  TrackedBuffer scratch_;  ///< fp32 working chunk for 16-bit gradients (communication bytes)
  /// Offloaded: pinned host memory where reduced gradients arrive and updated 16-bit parameters
  /// leave, each half on the copy stream while the host works on the other.
  std::unique_ptr<HostStaging> staging_;
  std::vector<float*> array_pointers_;
  /// offload_optimizer.device nvme: master (array 0) and states (1 + k) in swap files.
  std::unique_ptr<SwappedArrays> swapped_;
  /// The last update() wrote the model-precision copy of elements within [written_begin_,
  /// written_end_).
  std::int64_t written_begin_ = 0;
  std::int64_t written_end_ = 0;
  /// super_offload: the update thread, and the master (0) and states (1 + k) it writes.
  std::unique_ptr<WorkThread> update_thread_;
  std::vector<TrackedBuffer> next_arrays_;
  /// The overlapped update's parameters in the model's type; step() copies them in when it keeps
  /// the update, which overlap_copy_done_ marks the end of.
  TrackedBuffer overlap_params_;
  std::unique_ptr<CopyEvent> overlap_copy_done_;
  /// Threads of the host's team (offload_optimizer.cpuadam_cores_perc; 0 in the device's part,
  /// which has none), and whether the overlapped update may run its chunks on them (the built-in
  /// rules, which keep no state of their own).
  int host_team_ = 0;
  bool parallel_overlap_ = false;
  struct Overlap {
    bool begun = false;     ///< parts landing now are queued to the update thread
    bool finished = false;  ///< the update thread is done with them, keep or drop
    float grad_factor = 0.0f;
    GroupContexts contexts;
    std::vector<Run> runs;
    std::int64_t run_elements = 0;  ///< owned elements the rule updates
    std::int64_t updated = 0;       ///< of them, updated so far (the update thread's)
  };
  Overlap overlap_;
};

}  // namespace zeroshard::detail
