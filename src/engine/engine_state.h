// The engine behind the public Engine: registration and the flat layout (engine.cpp), the
// cross-rank agreement check (rank_agreement.cpp) and the step's orchestration (engine_step.cpp)
// over three owned components built at finalize(): the gradient bucketer, the parameter
// coordinator and the optimizer shard.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/compute_backend.h"
#include "checkpoint/checkpoint_format.h"
#include "engine/activation_registry.h"
#include "engine/engine_context.h"
#include "engine/engine_lifetime.h"
#include "engine/grad_bucketer.h"
#include "engine/optimizer_shard.h"
#include "engine/param_coordinator.h"
#include "layout/shard_layout.h"
#include "memory/memory_tracker.h"
#include "monitor/training_monitor.h"
#include "precision/loss_scaler.h"
#include "zeroshard/communicator.h"
#include "zeroshard/config.h"
#include "zeroshard/engine.h"
#include "zeroshard/lr_scheduler.h"
#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

class EngineState {
 public:
  EngineState(Config config, Device device, std::unique_ptr<Communicator> communicator,
              std::unique_ptr<UpdateRule> rule);
  /// Waits for every transfer still in flight before any buffer it touches is freed.
  ~EngineState();

  // --- engine.cpp: registration, layout, components, accessors ---
  /// Checks communication_data_type and data_types.grad_accum_dtype against the model's type.
  void resolve_gradient_dtypes();
  /// Ends registration: checks that the ranks agree (collective) and lays the parameters out.
  void lay_out();
  void finalize();
  /// Collective: a random id of this run, the same on every rank, for its swap records.
  std::uint64_t draw_run_id();
  /// The model's initial values in adopted parameter memory become the master weights.
  void take_adopted_values();
  void require_finalized() {
    if (!finalized_) finalize();
  }
  void* param_data(int index);
  /// With `may_assign`, a first fetch of a place not zeroed is left so (Parameter::grad_target).
  GradTarget param_grad(int index, bool may_assign);
  void copy_param_from(int index, const float* values);
  void gather(ModuleId module);
  void release(ModuleId module);
  /// Every module of whole parameters, in order (released in reverse).
  void gather_model();
  void release_model();
  void mark_grad_ready(int index);
  void mark_all_grads_ready();
  /// super_offload: at the window's last micro-step, before its first gradient is reduced, starts
  /// the update that runs during backward, unless the last step clipped.
  void begin_overlapped_update_if_due();
  /// The factor that turns the reduced gradients into the unscaled mean over ranks and micro-steps.
  double gradient_unscale() const;
  /// A buffer of `bytes` in the device's memory, charged to `category`.
  TrackedBuffer allocate(MemoryCategory category, std::size_t bytes);
  /// Sums (or maxes) a few host floats over the ranks through engine memory, which is where the
  /// communicator expects its buffers.
  void all_reduce_host(float* values, int count, ReduceOp op);
  /// Orders the collectives of comm_ and of the communicators split from it after `stream`.
  void set_communicators_stream(void* stream) noexcept;

  // --- consolidated_parameters.cpp: the master values gathered one bounded chunk at a time ---
  /// Collective: calls use(piece, its values) for every tensor piece of the flat layout in order,
  /// gathering `chunk_elements` of it at a time (Engine::visit_consolidated_parameters).
  void visit_consolidated(const std::function<void(const TensorPiece&, const float*)>& use,
                          std::int64_t chunk_elements);
  std::vector<float> consolidated_parameters();

  // --- engine_checkpoint.cpp: sharded save and load ---
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const std::string& user_state);
  /// Rank 0's manifest of a save: the model, the layout, the rule and the step, without the files.
  Manifest checkpoint_manifest(const std::string& user_state) const;
  CheckpointInfo load_checkpoint(const std::string& dir, const std::string& tag);
  void load_weights(const std::string& file);
  bool save_16bit_model(const std::string& file);
  /// Every rank passes its own failure (null when it succeeded); all throw if any rank failed.
  void agree_on_failure(std::exception_ptr failure, const char* what);
  /// Collective: "rank R: message" of the first rank that failed, empty when none did.
  std::string failure_on_any_rank(std::exception_ptr failure);

  // --- rank_agreement.cpp: every rank runs the same config, registers the same model, starts
  // from the same values and steps with the same learning rates ---
  /// Throws ConfigError (a config key) or UsageError (rule, group or parameter) naming the first
  /// difference and each rank's value; world 1 returns at once.
  void check_ranks_agree();
  /// Records a digest of parameter `index`'s initial values: `bytes` of host memory as copy_from(),
  /// load_weights() or adopted memory gave them.
  void note_initial_values(int index, const void* data, std::size_t bytes);
  /// The adopted parameter memory holds the initial values of every trainable parameter.
  void note_adopted_values();
  /// A checkpoint set every rank's state: the initial values noted before no longer matter.
  void forget_initial_values();
  /// The floats step() sums over the ranks beside the gradient norm so that a difference in the
  /// initial values, the step or the step's learning rates shows: 0 on one rank.
  int step_agreement_floats() const;
  void pack_step_agreement(const GroupContexts& contexts, float* out) const;
  /// After the sum: UsageError naming the first difference and each rank's value, on every rank,
  /// unless every rank packed the same.
  void check_step_agreement(const GroupContexts& contexts, const float* summed);
  /// Communicator::all_gather_text for any communicator, bouncing through engine memory.
  std::vector<std::string> all_gather_text(const std::string& text);

  // --- engine_step.cpp ---
  /// The micro-step's end; at the window's end the optimizer step, in its phases: scan the
  /// gradients, handle non-finite ones, clip, update, refresh the parameters, clear the gradients
  /// and move the schedule on.
  StepResult step();
  /// Per parameter group: the next update's scalars after the schedule and the group's options.
  GroupContexts step_contexts() const;
  /// Runs the optimizer shard's update; with swap files, agrees across ranks on its outcome and
  /// undoes it everywhere (IoError) when any rank failed.
  void apply_update(float grad_factor, const GroupContexts& contexts);
  /// Zeroes the gradients, but for the whole gradients' elements [cleared_begin, cleared_end),
  /// which the update has already cleared.
  void zero_grad(std::int64_t cleared_begin = 0, std::int64_t cleared_end = 0);
  void print_progress(const StepResult& result);

  // --- auto_offload_ratio.cpp ---
  /// offload_optimizer.ratio "auto", after the first step: every rank moves the largest share of
  /// its optimizer shard that fits the device memory left to the device (collective), and rank 0
  /// logs the ratio and why.
  void settle_auto_offload_ratio();
  /// Of this rank's `owned` elements, those it must keep on the host, and in `reason` what
  /// decided it.
  std::int64_t auto_host_elements(std::int64_t owned, std::string& reason);
  /// csv_monitor, tensorboard and comms_logger, from finalize(): collective, and every rank
  /// throws when any rank cannot write its monitor's folder.
  void open_monitors();
  /// The window's series, to the monitors of this rank (nothing when there are none).
  void monitor_step(const StepResult& result);
  /// Engine::log_loss.
  void log_loss(double loss);
  /// The x of DeepSpeed's Train/Samples series: windows ended x the global batch.
  std::int64_t samples_seen() const;
  /// comms_logger: rank 0 logs every collective timed since finalize(), as DeepSpeed's
  /// log_summary() does.
  void log_comms_summary() noexcept;
  // fp16 loss scaling: the scaler hears of every boundary step, skipped or not.
  void on_overflow();
  void on_clean_step();
  /// The factor the model scales its loss by: the scaler's, or 1 without fp16.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  /// The schedule's values for the next update (or the override / the rule's own lr).
  ScheduledValues scheduled() const;
  double current_lr() const { return scheduled().lr; }

  // --- what the engine's components and the library's other parts read ---
  const Config& config() const noexcept { return config_; }
  const UpdateRule& rule() const noexcept { return *rule_; }
  DType dtype() const noexcept { return dtype_; }
  GradHandover grad_handover() const noexcept { return grad_handover_; }
  const std::vector<ParamInfo>& params() const noexcept { return params_; }
  const ParamInfo& param(int index) const { return params_[index]; }
  const std::vector<GroupInfo>& groups() const noexcept { return groups_; }
  const std::vector<ModuleInfo>& modules() const noexcept { return modules_; }
  ComputeBackend& backend() noexcept { return *backend_; }
  MemoryTracker& tracker() noexcept { return tracker_; }
  const StepTimes& times() const noexcept { return times_; }
  /// The components, built by finalize().
  OptimizerShard& optimizer() noexcept { return *optimizer_; }
  const OptimizerShard& optimizer() const noexcept { return *optimizer_; }
  ParamCoordinator& coordinator() noexcept { return *coordinator_; }

 private:
  // The public Engine and Parameter are this object's face (a pointer to implementation): their
  // calls read and set its registration, step bookkeeping and collaborators directly.
  friend class zeroshard::Engine;
  friend class zeroshard::Parameter;

  /// What the scan of the gradients found, summed over the ranks.
  struct GradientSummary {
    double unscale = 1.0;         ///< gradient_unscale() for this step
    double sum_of_squares = 0.0;  ///< of the unscaled gradients, over every rank
    bool nonfinite = false;       ///< some rank holds inf or NaN, or the sum overflowed
    GroupContexts contexts;       ///< the update's scalars, checked alike on every rank
  };
  /// Collective: scans this rank's shard, lands an overlapped update and all-reduces the scan
  /// with the digest of the step's learning rates (UsageError when the ranks differ).
  GradientSummary scan_gradients();
  /// Whether a non-finite gradient stops the update (not for bf16 without check_grad_overflow).
  bool checks_nonfinite() const;
  /// Out of the common path: fp16 skips the step and lowers the loss scale, bf16 skips it and
  /// says so, fp32 throws a UsageError naming the first parameter that holds the value.
  StepResult skip_nonfinite_step(StepResult result);
  /// Collective: the first parameter, in registration order, non-finite on some rank; -1 when
  /// only the sum overflowed.
  int first_nonfinite_parameter();
  /// gradient_clipping / (norm + 1e-6) when that is below 1, else 1 (DeepSpeed's coefficient).
  double clip_coefficient(double norm) const;
  /// Keeps super_offload's overlapped update when it matches, else runs the update; true when
  /// the overlapped one was kept.
  bool run_update(float grad_factor, const GroupContexts& contexts);
  /// Spreads the updated parameters as the stage requires.
  void refresh_parameters();
  /// Zeroes the gradients but for the range the update has already cleared.
  void clear_gradients_after_update();

  /// What the handles this engine gave out share with it; they may outlive it.
  std::shared_ptr<EngineLifetime> lifetime_ = std::make_shared<EngineLifetime>(*this);

  // Configuration and collaborators.
  Config config_;
  Device device_;
  /// Before comm_ and backend_, which may charge memory of their own to it.
  MemoryTracker tracker_;
  std::unique_ptr<Communicator> comm_;
  /// hpZ's node groups (zero_hpz_partition_size > 1), split from comm_; null otherwise.
  std::unique_ptr<NodeGroups> hpz_groups_;
  std::unique_ptr<UpdateRule> rule_;
  std::unique_ptr<ComputeBackend> backend_;
  int rank_ = 0;
  int world_ = 1;
  int stage_ = 0;
  DType dtype_ = DType::kFloat32;
  std::size_t dsize_ = 4;
  DType grad_shard_dtype_ = DType::kFloat32;  ///< the gradient shard's accumulation type
  DType comm_dtype_ = DType::kFloat32;        ///< what gradient reductions send

  // Registration.
  std::vector<ParamInfo> params_;
  std::vector<GroupInfo> groups_;
  std::vector<ModuleInfo> modules_;
  GradHandover grad_handover_ = GradHandover::kPerParameter;
  ModelMemory adopted_;
  bool laid_out_ = false;
  bool finalized_ = false;

  // Layout and the components that own every model-state buffer (built by finalize()).
  ShardLayout layout_;
  std::vector<int> tensor_param_;     ///< trainable tensor index -> parameter index
  std::int64_t frozen_elements_ = 0;  ///< the frozen parameters laid end to end
  StepTimes times_;
  std::unique_ptr<EngineContext> context_;
  std::unique_ptr<ParamCoordinator> coordinator_;
  std::unique_ptr<GradBucketer> bucketer_;
  std::unique_ptr<OptimizerShard> optimizer_;
  /// Device memory only: where the step's few all-reduced floats (norm, overflow) travel.
  TrackedBuffer reduction_scalars_;
  /// Activation buffers handed out, freed here if they outlive the engine.
  std::shared_ptr<ActivationRegistry> activations_ = std::make_shared<ActivationRegistry>();

  // Step bookkeeping.
  std::int64_t micro_step_ = 0;   ///< micro-steps in the current accumulation window
  std::int64_t global_step_ = 0;  ///< optimizer updates done
  /// Per parameter: a digest of the initial values it was given (0, or past the end, when none
  /// were).
  std::vector<std::uint64_t> initial_value_digests_;
  double lr_override_ = -1.0;
  double last_grad_norm_ = 0.0;
  /// super_offload: the next window's update overlaps backward. Off after a step that clipped, as
  /// the next one likely clips too and the overlapped update would be thrown away.
  bool overlap_next_update_ = true;
  /// offload_optimizer.ratio "auto" with device cpu: the first step's end settles the ratio.
  bool settles_offload_ratio_ = false;
  std::unique_ptr<LrScheduler> scheduler_;
  std::optional<LossScaler> scaler_;

  // Monitoring (monitor_step): what the last window's series were measured from.
  std::unique_ptr<TrainingMonitor> monitor_;
  std::int64_t windows_ = 0;        ///< accumulation windows ended, skipped ones included
  std::int64_t skipped_steps_ = 0;  ///< of those, skipped
  StepTimes monitored_times_;       ///< times_ at the last window's end
  TrafficCounters monitored_traffic_;
  std::chrono::steady_clock::time_point last_window_end_;
  /// comms_logger: the timings at the last progress line.
  std::vector<CollectiveTiming> printed_timings_;
};

}  // namespace zeroshard::detail
