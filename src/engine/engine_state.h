// The engine's internal state: the flat layout, every buffer it owns, the gradient buckets and
// the stage-3 module coordinator. Methods are split by concern over engine.cpp,
// grad_bucketer.cpp, param_coordinator.cpp and optimizer_step.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/compute_backend.h"
#include "engine/shard_layout.h"
#include "memory/memory_tracker.h"
#include "precision/loss_scaler.h"
#include "zeroshard/communicator.h"
#include "zeroshard/config.h"
#include "zeroshard/engine.h"
#include "zeroshard/lr_scheduler.h"
#include "zeroshard/optimizer.h"

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
  bool grad_ready = false;        ///< this micro-step's gradient was handed over
  bool persistent = false;        ///< stage 3: kept whole on every rank
  TrackedBuffer persistent_copy;  ///< stage 3, persistent: the whole parameter
};

struct GroupInfo {
  ParamGroupOptions options;
};

/// Stage 3 life cycle of a module's gathered copy.
enum class ModuleResidency { kReleased, kInFlight, kAvailable };

struct ModuleInfo {
  std::string name;
  std::vector<int> params;
  std::int64_t flat_begin = 0;  ///< trainable range the module spans (empty if all frozen)
  std::int64_t flat_end = 0;
  bool sharded = false;  ///< stage 3 and holds a non-persistent trainable parameter
  ModuleResidency residency = ModuleResidency::kReleased;
  int users = 0;  ///< gather() calls not yet matched by release()
  TrackedBuffer gathered;
  Request pending;
};

/// A contiguous range of the flat gradient buffer reduced by one collective.
struct Bucket {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::vector<int> params;
  int ready = 0;
  int slot = -1;  ///< stages 1-3: the communication buffer it uses
  Request request;
};

/// A reusable communication buffer: input area (stages 2-3), the fp32 send area (16-bit
/// gradients reduced in fp32), then the receive area.
struct Slot {
  TrackedBuffer buffer;
  bool busy = false;
};

class EngineState {
 public:
  EngineState(Config config, Device device, std::unique_ptr<Communicator> communicator,
              std::unique_ptr<UpdateRule> rule);
  /// Waits for every transfer still in flight before any buffer it touches is freed.
  ~EngineState();

  // --- engine.cpp: registration, layout, buffers, accessors ---
  /// Checks communication_data_type and data_types.grad_accum_dtype against the model's type.
  void resolve_gradient_dtypes();
  void finalize();
  void require_finalized() {
    if (!finalized_) finalize();
  }
  void* param_data(int index);
  void* param_grad(int index);
  void copy_param_from(int index, const float* values);
  /// Rounds `count` host fp32 values into `destination` (engine memory, model dtype).
  void store_host_values(const float* values, void* destination, std::int64_t count);
  /// A buffer of `bytes` in the backend's memory, charged to `category`.
  TrackedBuffer allocate(MemoryCategory category, std::size_t bytes);
  /// Sums (or maxes) a few host floats over the ranks through engine memory, which is where the
  /// communicator expects its buffers.
  void all_reduce_host(float* values, int count, ReduceOp op);
  std::vector<float> consolidated_parameters();
  std::int64_t update_begin() const;  ///< range of the flat buffer this rank updates
  std::int64_t update_end() const;
  float* master_at(std::int64_t flat);
  float* state_at(int state, std::int64_t flat);
  void* model_param_at(std::int64_t flat);  ///< stages 0-2: full buffer; 3: the shard

  // --- rank_agreement.cpp: every rank runs the same config and registers the same model ---
  /// Throws ConfigError (a config key) or UsageError (rule, group or parameter) naming the first
  /// difference and each rank's value; world 1 returns at once.
  void check_ranks_agree();
  std::string agreement_description() const;
  /// Communicator::all_gather_text for any communicator, bouncing through engine memory.
  std::vector<std::string> all_gather_text(const std::string& text);

  // --- grad_bucketer.cpp: gradient buckets and their reductions ---
  void plan_buckets();
  void mark_grad_ready(int index);
  void launch_ready_buckets();
  void launch_all_buckets();
  void finish_reductions();
  /// Lets the transport advance the transfers in flight (MPI moves non-blocking collectives only
  /// inside MPI calls): called at every grad_ready() and gather(), so that a reduction or a
  /// prefetch proceeds while the model computes instead of all at once when it is waited for.
  void poll_transfers();
  void* bucket_grad_pointer(int index);
  double pre_reduction_factor() const;
  double post_reduction_factor() const;

  // --- param_coordinator.cpp: stage-3 gather, prefetch, release ---
  void gather(ModuleId module);
  void release(ModuleId module);
  void release_all_after_step();
  void refresh_persistent_params();

  // --- optimizer_step.cpp ---
  StepResult step();
  void zero_grad();
  void all_gather_parameters();
  void print_progress(const StepResult& result);
  // fp16 loss scaling: the scaler hears of every boundary step, skipped or not.
  void on_overflow();
  void on_clean_step();
  std::optional<LossScaler> scaler_;
  /// The factor the model scales its loss by: the scaler's, or 1 without fp16.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

  // Configuration and collaborators.
  Config config_;
  Device device_;
  /// Before comm_ and backend_, which may charge memory of their own to it.
  MemoryTracker tracker_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<UpdateRule> rule_;
  std::unique_ptr<ComputeBackend> backend_;
  int rank_ = 0;
  int world_ = 1;
  int stage_ = 0;
  DType dtype_ = DType::kFloat32;
  std::size_t dsize_ = 4;

  // Registration.
  std::vector<ParamInfo> params_;
  std::vector<GroupInfo> groups_;
  std::vector<ModuleInfo> modules_;
  bool finalized_ = false;

  // Layout and buffers.
  ShardLayout layout_;
  std::vector<int> tensor_param_;  ///< trainable tensor index -> parameter index
  TrackedBuffer params_full_;      ///< stages 0-2: every trainable parameter, model dtype
  TrackedBuffer param_shard_;      ///< stage 3: this rank's shard, model dtype
  TrackedBuffer master_;           ///< 16-bit training: fp32 master (full at stage 0, else shard)
  TrackedBuffer grads_full_;       ///< stages 0-1: every gradient, model dtype
  TrackedBuffer grad_shard_;       ///< stages 2-3: this rank's reduced gradient shard
  DType grad_shard_dtype_ = DType::kFloat32;  ///< stages 2-3: the shard's accumulation type
  DType comm_dtype_ = DType::kFloat32;        ///< what gradient reductions send
  std::vector<TrackedBuffer> states_;
  TrackedBuffer frozen_;
  TrackedBuffer scratch_;  ///< fp32 working chunk for 16-bit gradients (communication bytes)
  /// Device memory only: where the step's few all-reduced floats (norm, overflow) travel.
  TrackedBuffer reduction_scalars_;

  // Buckets.
  std::vector<Bucket> buckets_;           ///< in launch order (last registered parameters first)
  std::int64_t slot_input_elements_ = 0;  ///< model dtype
  std::int64_t slot_send_elements_ = 0;   ///< fp32, when 16-bit gradients are sent widened
  std::int64_t slot_recv_elements_ = 0;   ///< communication dtype
  char* slot_send(int slot);
  char* slot_recv(int slot);
  std::vector<Slot> slots_;
  std::deque<int> in_flight_;
  std::size_t next_launch_ = 0;
  int acquire_slot();
  void launch(int bucket);
  void complete_oldest();

  // Stage 3 order trace for prefetch and reuse distance.
  std::vector<ModuleId> trace_;      ///< gathers of the last complete step
  std::vector<ModuleId> recording_;  ///< gathers of the step in progress
  bool trace_valid_ = false;
  std::size_t trace_position_ = 0;
  std::int64_t live_elements_ = 0;
  void start_gather(ModuleId module);
  void finish_gather(ModuleId module);
  void free_module(ModuleId module);
  void prefetch_after(std::size_t trace_index);
  bool reused_soon(ModuleId module) const;

  // Step bookkeeping.
  std::int64_t micro_step_ = 0;   ///< micro-steps in the current accumulation window
  std::int64_t global_step_ = 0;  ///< optimizer updates done
  double lr_override_ = -1.0;
  double last_grad_norm_ = 0.0;
  double reduce_seconds_ = 0.0;
  double update_seconds_ = 0.0;
  double gather_seconds_ = 0.0;

  /// The schedule's values for the next update (or the override / the rule's own lr).
  ScheduledValues scheduled() const;
  double current_lr() const { return scheduled().lr; }
  std::unique_ptr<LrScheduler> scheduler_;
};

}  // namespace zeroshard::detail
