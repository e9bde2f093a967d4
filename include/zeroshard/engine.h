// The Engine: a training program registers its parameters with it, writes gradients into the
// buffers it hands out, and calls step(); the engine shards optimizer states (stage 1), gradients
// (stage 2) and parameters (stage 3) over the data-parallel ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zeroshard/communicator.h"
#include "zeroshard/config.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/export.h"
#include "zeroshard/memory_report.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {

namespace detail {
class ActivationRegistry;
class EngineLifetime;
class EngineState;
class TrackedBuffer;
struct EngineInternals;
}  // namespace detail

class ActivationCheckpointer;

/// Identifies a module: the unit stage 3 gathers and releases (a layer's parameters).
using ModuleId = int;

/// How a parameter is registered.
struct ParamOptions {
  /// Index returned by Engine::add_param_group; 0 is the default group.
  int group = 0;
  /// Frozen parameters (false) get no gradient buffer and no optimizer state and are never
  /// updated; they are kept whole on every rank. Under zero_quantized_nontrainable_weights they
  /// are kept as int8 blocks and read, like trainable ones at stage 3, while their module is
  /// gathered; writes to that decoded copy are lost at release (Parameter::copy_from stores).
  bool trainable = true;
  /// Module the parameter belongs to; empty means the name up to its last '.' ("fc1.weight" ->
  /// "fc1"), and a name without a '.' is a module of its own. A module's parameters must be
  /// registered one after another.
  std::string module;
};

/// When the model's backward completes its gradients (Engine::set_grad_handover).
enum class GradHandover {
  /// One by one, each with Engine::grad_ready() as soon as it is complete (the default): at
  /// stages 2-3 a bucket's reduction starts while backward goes on.
  kPerParameter,
  /// All at once after backward, with Engine::all_grads_ready(): for a backward that completes
  /// its gradients only at its end (weights stacked over layers, a tied embedding). The engine
  /// keeps one whole gradient buffer at every stage and reduces it once per accumulation window
  /// through at most two bucket-sized communication buffers, so stage 2 holds what stage 1 does,
  /// never more than stage 0.
  kAtEnd,
};

/// Memory the model already owns for every trainable parameter and its gradient, which
/// Engine::adopt_memory makes the engine work in instead of buffers of its own.
struct ModelMemory {
  /// Engine::padded_numel() elements of Engine::model_dtype() on the engine's device, parameter p
  /// at Engine::flat_offset(p); the values there are the initial ones, the same on every rank.
  void* parameters = nullptr;
  /// The gradients, laid out alike; null keeps the engine's own gradient buffers.
  void* gradients = nullptr;
};

/// A parameter group's overrides of the update rule's learning rate and weight decay. With a
/// scheduler, a group's lr scales with the schedule (lr_group = schedule * group.lr / base lr).
struct ParamGroupOptions {
  std::string name;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

/// The gradient contract: where the model's backward puts a trainable parameter's gradient, and
/// when it hands it over.
///
/// In every micro-step the backward fetches the parameter's gradient buffer, puts the gradient in
/// it, and then calls Engine::grad_ready(p) (or, under GradHandover::kAtEnd, Engine::
/// all_grads_ready() once for all). Three accessors of Parameter fetch the same buffer:
///   - grad()        fp32 models: add (+=) to it.
///   - raw_grad()    any dtype (16-bit elements under fp16/bf16): add (+=) to it.
///   - grad_target() any dtype, and says whether to add or to write: with `accumulate` false the
///                   buffer holds nothing of this micro-step (window) and was not zeroed, so the
///                   backward writes (=) every element, sparing the engine a zeroing pass.
///
/// | gradients kept in                          | the buffer is valid     | first fetch's
/// accumulate |
/// |--------------------------------------------|-------------------------|--------------------------|
/// | stages 2-3, per-parameter handover         | from the fetch until    | false in every | | (a
/// slot of a gradient bucket)              | grad_ready(): fetch it  | micro-step               |
/// |                                            | again every micro-step  | | | stages 0-1, or
/// GradHandover::kAtEnd (one   | the whole window, at    | false when every first   | | whole
/// buffer over the accumulation window) | one address             | fetch of the window      | | |
/// | before came through      | |                                            | | grad_target(),
/// else true | | the model's own, adopted (adopt_memory())  | always, at one address  | true |
///
/// Every later fetch in the same micro-step (window) says true. A gradient never fetched in a
/// micro-step (window) counts as zero. The buffers read as zero at the start of each window after
/// step() or zero_grad(). Frozen parameters have no gradient (UsageError).
struct GradTarget {
  /// Parameter::numel() elements of Parameter::dtype().
  void* data = nullptr;
  /// Add (true) or write every element (false), as the table above says; false is how PyTorch's
  /// autograd assigns a gradient that zero_grad(set_to_none=True) left unset (a GEMM with beta 0).
  bool accumulate = true;
};

/// A handle to one registered parameter. Cheap to copy (a shared pointer and an index). It may
/// outlive its engine, and then every call but name() and shape() throws UsageError naming the
/// parameter. Their references stay valid while the engine or a handle to one of its parameters
/// lives (an engine moved from one Engine object to another keeps its handles valid).
class ZEROSHARD_API Parameter {
 public:
  Parameter() = default;

  const std::string& name() const;
  const std::vector<std::int64_t>& shape() const;
  std::int64_t numel() const;
  bool trainable() const;
  /// Element type of data() and grad(): fp32, or fp16/bf16 under mixed precision.
  DType dtype() const;
  ModuleId module() const;

  /// The parameter's values, numel() elements, for the model's forward and backward. At stage 3
  /// the parameter's module must be gathered; otherwise this throws UsageError. data() and grad()
  /// require fp32 (UsageError otherwise); raw_data() and raw_grad() work for every dtype.
  float* data() const;
  void* raw_data() const;
  /// The gradient buffer, as the gradient contract above (at GradTarget) says: grad() for fp32,
  /// raw_grad() for any dtype, both to add to; grad_target() also says whether to add or write.
  float* grad() const;
  void* raw_grad() const;
  GradTarget grad_target() const;

  /// Sets the parameter's values: every rank passes the whole tensor (numel() fp32 values, e.g.
  /// from the same seeded initialiser) and keeps what it owns. Also sets the fp32 master copy.
  /// The next step() checks that every rank passed the same values: UsageError naming the
  /// parameter otherwise, before the update.
  void copy_from(std::span<const float> values) const;

 private:
  friend class Engine;
  friend class detail::EngineState;
  Parameter(std::shared_ptr<detail::EngineLifetime> engine, int index)
      : engine_(std::move(engine)), index_(index) {}
  /// The engine's state; UsageError for an empty handle or one whose engine was destroyed.
  detail::EngineState& state() const;
  std::shared_ptr<detail::EngineLifetime> engine_;
  int index_ = -1;
};

/// Elements [begin, end) of a registered trainable parameter's row-major values: layer l of a
/// weight stacked over layers, each n elements, is the slice [l * n, (l + 1) * n).
struct ParamSlice {
  Parameter parameter;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

/// Memory on the engine's device for the model's activations, charged to the memory report's
/// "activations". It may outlive its engine (a buffer kept in a global, say): the engine frees it
/// when destroyed, and from then on data() is null and bytes() 0.
class ZEROSHARD_API ActivationBuffer {
 public:
  ActivationBuffer();
  ActivationBuffer(ActivationBuffer&&) noexcept;
  ActivationBuffer& operator=(ActivationBuffer&&) noexcept;
  ~ActivationBuffer();
  float* data() const noexcept;
  std::size_t bytes() const noexcept;

 private:
  friend class Engine;
  void free() noexcept;
  std::unique_ptr<detail::TrackedBuffer> buffer_;
  std::shared_ptr<detail::ActivationRegistry> registry_;
};

/// What the last call of Engine::step() did.
struct StepResult {
  /// An optimizer update ran (false inside an accumulation window and on a skipped step).
  bool updated = false;
  /// inf/NaN in some rank's gradients under fp16 (the loss scale is lowered) or bf16 with
  /// bf16.check_grad_overflow: the update was skipped on every rank. Under fp32, step() throws
  /// UsageError naming the parameter instead, with nothing changed.
  bool skipped = false;
  /// Global L2 norm of the unscaled gradients before clipping (0 when not computed).
  double grad_norm = 0.0;
  /// Learning rate used by the update (the default group's).
  double lr = 0.0;
  /// offload_optimizer.super_offload: the update ran during backward and was kept. False when it
  /// ran in step() instead: the step clipped (or the last one did), overflowed, or its learning
  /// rate or loss scale changed after backward began.
  bool overlapped = false;
};

/// Elements of the flat layout Engine::visit_consolidated_parameters() gathers at a time unless
/// told otherwise: 4 MiB of fp32.
inline constexpr std::int64_t kConsolidationChunkElements = std::int64_t{1} << 20;

/// A run of one trainable parameter's fp32 master values (Engine::visit_consolidated_parameters).
struct ConsolidatedChunk {
  Parameter parameter;
  /// Where values[0] sits among the parameter's row-major elements.
  std::int64_t offset = 0;
  /// Valid during the visitor's call only.
  std::span<const float> values;
};

/// What Engine::load_checkpoint() restored.
struct CheckpointInfo {
  std::string tag;
  /// Optimizer updates done when the checkpoint was saved.
  std::int64_t global_step = 0;
  /// The `user_state` passed to save_checkpoint(), byte for byte.
  std::string user_state;
};

/// Shards a model's optimizer over the ranks of a communicator. Movable, not copyable; every
/// call on a moved-from engine throws UsageError. Parameter handles, GatheredModule and
/// GatheredModel guards and ActivationBuffer may outlive it (see each); ActivationCheckpointer
/// refers to the engine and must not be used after it is destroyed.
class ZEROSHARD_API Engine {
 public:
  /// Computes on the CPU. `rule` may be null: the config's `optimizer` section then chooses it.
  /// With a rule, the config must have no `optimizer` section: ConfigError naming its keys, which
  /// the rule would not read.
  Engine(Config config, std::unique_ptr<Communicator> communicator,
         std::unique_ptr<UpdateRule> rule = nullptr);
  /// Computes on `device`: every buffer the engine hands out lives there. The communicator must
  /// take buffers of that kind (Communicator::from_environment(device) picks one); on a GPU the
  /// rule must be a built-in one, which runs as a fused kernel. UsageError otherwise.
  Engine(Config config, Device device, std::unique_ptr<Communicator> communicator,
         std::unique_ptr<UpdateRule> rule = nullptr);
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  /// Adds a parameter group and returns its index for ParamOptions::group.
  int add_param_group(const ParamGroupOptions& options);
  /// Registers a parameter; all registration happens before finalize().
  Parameter register_parameter(const std::string& name, std::vector<std::int64_t> shape,
                               const ParamOptions& options = {});
  /// Lays out and allocates every buffer. Called implicitly by the first use of a buffer.
  void finalize();

  /// Where a trainable parameter starts in the flat layout of padded_numel() elements that
  /// ModelMemory follows. The first call ends registration (collective: the ranks must agree).
  std::int64_t flat_offset(Parameter parameter) const;
  /// Before finalize(): the engine works in the model's own memory. Stages 0-2 update the
  /// parameters in place (no copy; a 16-bit model's fp32 master stays the engine's); stage 3
  /// keeps this rank's shard and gathers modules into `parameters`, so the model keeps its full
  /// size there. With `gradients` the model writes them there at every stage and they are reduced
  /// from there once per accumulation window (as under GradHandover::kAtEnd). Every address stays
  /// put for the engine's lifetime. The memory report counts these bytes and lists them as
  /// adopted.
  void adopt_memory(const ModelMemory& memory);

  std::vector<Parameter> parameters() const;
  Parameter parameter(std::string_view name) const;
  /// The module with this name; throws UsageError listing the known modules when there is none.
  ModuleId module(std::string_view name) const;

  /// Stage 3: all-gathers the module's parameters (and starts prefetching the modules that
  /// follow it in the recorded order). Stages 0-2: a no-op. Every rank must make the same calls.
  void gather(ModuleId module);
  /// Stage 3: the module's gathered copy may be freed (kept while its next use is within
  /// stage3_max_reuse_distance). Stages 0-2: a no-op.
  void release(ModuleId module);

  /// Declares module `name` made of slices of registered parameters, before finalize(): stage 3
  /// gathers and releases exactly those elements, so one layer of a model whose weights are
  /// stacked over layers is gathered without splitting its tensors. The slices are gathered into
  /// the model's own memory where they sit in the whole tensors, so at stage 3 the model adopts
  /// its parameter memory (adopt_memory()) and reads them there; stages 0-2 gather nothing. A
  /// module may be gathered again within a step (a tied embedding).
  ModuleId add_module(const std::string& name, const std::vector<ParamSlice>& slices);
  /// Gathers every module of whole parameters, the whole model at once (stage 3; a no-op
  /// otherwise), for a model that cannot be split.
  void gather_model();
  void release_model();
  /// Stage 3: the most parameter bytes held gathered at once since construction, gathered
  /// modules (prefetched ones included) and persistent tensors; 0 at stages 0-2.
  std::int64_t peak_gathered_bytes() const;

  /// Keeps a module gathered for the guard's lifetime. The guard follows the engine when the
  /// Engine object is moved, and its end does nothing once the engine was destroyed (the
  /// gathered copies went with it). Its end never throws: a failed release is logged.
  class ZEROSHARD_API GatheredModule {
   public:
    GatheredModule(Engine& engine, ModuleId module);
    GatheredModule(GatheredModule&& other) noexcept = default;
    GatheredModule& operator=(GatheredModule&&) = delete;
    GatheredModule(const GatheredModule&) = delete;
    GatheredModule& operator=(const GatheredModule&) = delete;
    ~GatheredModule();

   private:
    std::shared_ptr<detail::EngineLifetime> engine_;
    ModuleId module_;
  };
  GatheredModule gathered(ModuleId module) { return GatheredModule(*this, module); }

  /// Keeps the whole model gathered for the guard's lifetime (gather_model()); it outlives or
  /// follows its engine as GatheredModule does.
  class ZEROSHARD_API GatheredModel {
   public:
    explicit GatheredModel(Engine& engine);
    GatheredModel(GatheredModel&& other) noexcept = default;
    GatheredModel& operator=(GatheredModel&&) = delete;
    GatheredModel(const GatheredModel&) = delete;
    GatheredModel& operator=(const GatheredModel&) = delete;
    ~GatheredModel();

   private:
    std::shared_ptr<detail::EngineLifetime> engine_;
  };
  GatheredModel gathered_model() { return GatheredModel(*this); }

  /// How gradients will be handed over; before finalize(), the same on every rank.
  void set_grad_handover(GradHandover handover);
  GradHandover grad_handover() const;
  /// The parameter's gradient is complete for this micro-step; its bucket's reduction may start.
  void grad_ready(Parameter parameter);
  /// Every trainable gradient not yet handed over in this micro-step is complete. Under
  /// GradHandover::kPerParameter at stages 2-3 each bucket written so far holds a communication
  /// buffer until this call: declare GradHandover::kAtEnd for a backward that ends this way.
  void all_grads_ready();
  /// Ends a micro-step. At a gradient-accumulation boundary it finishes the reductions, unscales,
  /// checks for overflow, clips, runs the update rule on this rank's shard and redistributes the
  /// parameters; in between it only reduces (stages 2-3). Gradients are zeroed afterwards.
  StepResult step();
  /// Zeroes this accumulation window's gradients (step() already does after an update). Called
  /// before step(), on every rank, it also drops the micro-step in progress, as after an exception
  /// in backward: the reductions it launched are waited for and their sums discarded, and its
  /// gradients can be handed over again.
  void zero_grad();
  /// True when the next step() ends a gradient-accumulation window.
  bool is_gradient_accumulation_boundary() const;

  /// The program's loss for the optimizer step the last step() ended (the engine never sees it),
  /// for the csv_monitor and tensorboard monitors: rank 0 writes it as Train/Samples/train_loss
  /// against the samples seen so far. Call once per optimizer step, after that step(); other
  /// ranks' values and calls without a monitor are ignored.
  void log_loss(double loss);

  /// Optimizer updates done so far (skipped steps do not count).
  std::int64_t global_step() const;
  /// The learning rate the next update will use (from the scheduler, unless set).
  double lr() const;
  /// Overrides the learning rate (the scheduler, if any, no longer drives it). Every rank must set
  /// the same value: the next update's step() throws UsageError on every rank otherwise.
  void set_lr(double lr);
  /// The factor the model multiplies its loss by before backward (1 unless fp16).
  double loss_scale() const;
  /// Global gradient norm of the last update (0 before the first).
  double global_grad_norm() const;

  const Config& config() const;
  Device device() const;
  /// On a GPU: the stream the model's kernels run on (a cudaStream_t; null, the default, is the
  /// legacy default stream). The engine queues its own work on it, and gradient reductions and
  /// parameter gathers run on a communication stream that waits for it. What the engine queued on
  /// the previous stream comes before its work on the new one (the new stream waits for it on the
  /// device). The stream may be destroyed before the engine, whose destructor waits for the device
  /// and then no longer uses it.
  void set_compute_stream(void* stream);
  void* compute_stream() const;
  Communicator& communicator();
  const UpdateRule& update_rule() const;
  int rank() const;
  int world_size() const;
  int stage() const;
  /// fp32, or the 16-bit type under fp16/bf16.
  DType model_dtype() const;

  /// Trainable elements P (without alignment padding) and the padded flat size.
  std::int64_t trainable_numel() const;
  std::int64_t padded_numel() const;
  /// This rank's shard of the padded flat buffer: [begin, end).
  std::int64_t shard_begin() const;
  std::int64_t shard_end() const;

  /// Memory on the engine's device for activations, counted in the memory report.
  ActivationBuffer allocate_activations(std::size_t bytes);
  MemoryReport memory_report() const;
  /// Starts the report's peaks over from the bytes held now, e.g. after set-up, so that they
  /// cover the training steps only.
  void reset_memory_peaks();
  /// Where the report counts the engine's buffers: the device location on a GPU, else the host.
  MemoryLocation memory_location() const;

  /// Collective: saves the model state into folder dir/tag. Each rank writes its shard of the fp32
  /// master weights and rule states, rank 0 the frozen parameters and the manifest (layout, rule,
  /// step, scheduler and loss-scaler state, checksums, `user_state` verbatim), then points
  /// dir/latest at the tag; a crash at any point leaves the previous checkpoint loadable. The tag
  /// must be new. Throws UsageError inside an accumulation window (gradients are not saved), and
  /// on every rank IoError or CheckpointError when any rank fails to write.
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const std::string& user_state = "");
  /// Collective: loads dir/tag (the one dir/latest names when `tag` is empty), saved at any world
  /// size and stage, into this engine. Throws CheckpointError naming the file and the mismatch
  /// on a missing, truncated or damaged file, a newer format or another model; the engine is then
  /// unchanged. With zero_optimization.load_from_fp32_weights false and 16-bit parameters, the
  /// master weights are rebuilt from the 16-bit values, as DeepSpeed does.
  CheckpointInfo load_checkpoint(const std::string& dir, const std::string& tag = "");

  /// Collective: sets every registered parameter and its fp32 master from the safetensors file
  /// `file` (F32, F16 or BF16, e.g. written by zeroshard-consolidate), for fine-tuning from
  /// pre-trained weights; rule states and the step are left as they are. The file must hold
  /// exactly the registered names and shapes: CheckpointError naming the file and the first
  /// mismatch otherwise, with the engine unchanged.
  void load_weights(const std::string& file);
  /// Collective: rank 0 writes the model-precision weights of every parameter to the safetensors
  /// file `file`, as DeepSpeed's save_16bit_model: at stage 3 only when
  /// zero_optimization.stage3_gather_16bit_weights_on_model_save is true (modules are gathered
  /// one at a time); without it, stage 3 writes nothing and returns false.
  bool save_16bit_model(const std::string& file);

  /// Collective: hands `visit` the fp32 master values of every trainable parameter on every rank,
  /// in registration order and element order, one gathered chunk of the flat layout at a time: it
  /// holds chunk_elements * 4 bytes of engine memory (and as much host memory on a GPU) whatever
  /// the model's size, so a checksum or an export never needs the whole model in memory. Every
  /// rank passes the same chunk_elements. An exception from `visit` is rethrown on its rank after
  /// the last chunk, so that no rank is left waiting in a gather; when a rank cannot read its
  /// shard (a swap file error), every rank throws IoError after the last chunk and what the
  /// visits saw is not the model.
  void visit_consolidated_parameters(const std::function<void(const ConsolidatedChunk&)>& visit,
                                     std::int64_t chunk_elements = kConsolidationChunkElements);
  /// Collective: the fp32 master values of every trainable parameter, whole and in registration
  /// order without padding, on every rank (for checks and exports, not for the training loop).
  /// Holds the result and one chunk of visit_consolidated_parameters().
  std::vector<float> consolidated_parameters();

 private:
  /// The library's own parts outside the engine (the activation checkpointer) and its tests
  /// reach the engine's components through it (src/engine/engine_internals.h).
  friend struct detail::EngineInternals;
  /// The state, or UsageError when this engine was moved from.
  detail::EngineState& live() const;
  std::unique_ptr<detail::EngineState> state_;
};

}  // namespace zeroshard
