// The engine's public surface: registration, the flat layout and the buffers each stage owns,
// parameter handles, and the forwarding from Engine to its state.
#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <random>  // random_device: the run id
#include <sstream>
#include <utility>

#include "comm/host_staged_communicator.h"
#include "config/config_checks.h"
#include "engine/engine_state.h"
#include "layout/shape.h"
#include "precision/half_conversion.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard {
namespace detail {

namespace {

std::string default_module_name(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// A rule the program builds reads nothing from the config, so the config's optimizer section
// would be ignored: an error naming each key, never silence.
void reject_config_optimizer(const Config& config, const UpdateRule& rule) {
  const OptimizerConfig& optimizer = config.optimizer;
  if (optimizer.type.empty()) return;
  std::vector<std::string> keys;
  for (const auto& [name, value] : optimizer.params) keys.push_back("optimizer.params." + name);
  for (const auto& [name, values] : optimizer.array_params) {
    keys.push_back("optimizer.params." + name);
  }
  std::sort(keys.begin(), keys.end());
  std::ostringstream os;
  os << "the engine was given its own update rule ('" << rule.name()
     << "'), which reads nothing from the config, so optimizer.type ('" << optimizer.type << "')";
  for (const std::string& key : keys) os << ", " << key;
  os << (keys.empty() ? " would be" : " would all be")
     << " ignored. Remove the config's optimizer section and set these on the rule, or pass no "
        "rule and let the config choose it";
  throw ConfigError(keys.empty() ? "optimizer.type" : keys.front(), os.str());
}

}  // namespace

EngineState::EngineState(Config config, Device device, std::unique_ptr<Communicator> communicator,
                         std::unique_ptr<UpdateRule> rule)
    : config_(std::move(config)),
      device_(device),
      comm_(std::move(communicator)),
      rule_(std::move(rule)) {
  check_config(config_);
  ZEROSHARD_CHECK_USAGE(comm_ != nullptr, "Engine needs a communicator");
  ZEROSHARD_CHECK_USAGE(comm_->buffer_device() == device_.type,
                        "Engine on "
                            << device_.to_string() << " with the '" << comm_->backend()
                            << "' communicator, which takes "
                            << (comm_->buffer_device() == DeviceType::kCuda ? "GPU" : "host")
                            << " buffers: build the communicator with "
                               "Communicator::from_environment(device)");
  // Ranks that share a GPU stage their collectives through pinned host memory: that is
  // communication memory of this engine too.
  if (auto* staged = dynamic_cast<HostStagedCommunicator*>(comm_.get())) {
    staged->charge_staging_to(tracker_);
  }
  if (rule_) {
    reject_config_optimizer(config_, *rule_);
  } else {
    rule_ = make_update_rule(config_);
  }
  backend_ = make_compute_backend(device_, *rule_, tracker_);
  scheduler_ = make_lr_scheduler(config_.scheduler, rule_->default_lr(), rule_->beta1());
  rank_ = comm_->rank();
  world_ = comm_->size();
  stage_ = config_.zero_optimization.stage;
  if (config_.fp16.enabled) {
    dtype_ = DType::kFloat16;
    scaler_.emplace(config_.fp16);
  }
  if (config_.bf16.enabled) dtype_ = DType::kBFloat16;
  dsize_ = size_of(dtype_);
  resolve_gradient_dtypes();
  ParamGroupOptions default_group;
  default_group.name = "default";
  groups_.push_back({default_group});
}

EngineState::~EngineState() {
  log_comms_summary();
  lifetime_->end();
  // The model's compute stream may already be destroyed; the buffers the components free must
  // not be freed on it, nor may the communicator order anything after it.
  backend_->detach_stream();
  set_communicators_stream(nullptr);
  // In dependency order, not the members' reverse order. The reductions still in flight (an
  // engine unwound mid-backward) write the optimizer's gradient shard: they finish first. The
  // optimizer's update thread (super_offload) may read and clear the bucketer's whole gradients:
  // the optimizer joins it before the bucketer goes. The coordinator, which the optimizer refers
  // to, goes last.
  if (bucketer_) bucketer_->abandon_in_flight();
  optimizer_.reset();
  bucketer_.reset();
  coordinator_.reset();
  activations_->free_all();
}

void EngineState::resolve_gradient_dtypes() {
  // DeepSpeed's communication_data_type: 16-bit gradients are reduced in their own type unless
  // fp32 is asked for, which rounds the sum once instead of once per partial sum. check_config()
  // allows no other type.
  comm_dtype_ = config_.communication_data_type == "fp32" ? DType::kFloat32 : dtype_;
  // DeepSpeed's data_types.grad_accum_dtype, whose default under ZeRO is the parameters' type:
  // its stage 1-2 and stage 3 optimizers accumulate in it with offload as without, and fill the
  // offloaded fp32 gradient from the window's sum. The gradient shard accumulates in it wherever
  // it lives, so that offload never changes the sums nor which fp16 steps overflow.
  grad_shard_dtype_ = config_.grad_accum_dtype == "fp32" ? DType::kFloat32 : dtype_;
  // Stages 0-1 accumulate whole 16-bit gradients in fp32 as DeepSpeed's BF16_Optimizer does, and
  // reduce the fp32 sums as they are (check_config() refuses a 16-bit communication_data_type).
  if (stage_ <= 1 && grad_shard_dtype_ == DType::kFloat32) comm_dtype_ = DType::kFloat32;
}

void EngineState::lay_out() {
  if (laid_out_) return;
  if (backend_->memory().location() != MemoryLocation::kHost) {
    reduction_scalars_ =
        allocate(MemoryCategory::kCommunication, (2 + step_agreement_floats()) * sizeof(float));
  }
  check_ranks_agree();
  std::vector<std::int64_t> numels;
  std::int64_t totals[2] = {};  // frozen, trainable; each with its worst-case alignment padding
  for (const ParamInfo& p : params_) {
    std::int64_t& total = totals[p.trainable ? 1 : 0];
    total += p.numel + kTensorAlignment;
    ZEROSHARD_CHECK_USAGE(total <= kMaxElements,
                          "parameter '" << p.name << "' brings the "
                                        << (p.trainable ? "trainable" : "frozen")
                                        << " parameters past 2^56 elements, more than zeroshard "
                                           "can address");
  }
  frozen_elements_ = 0;
  for (ParamInfo& p : params_) {
    if (!p.trainable) {
      p.frozen_offset = frozen_elements_;
      frozen_elements_ += p.numel;
      continue;
    }
    p.tensor = static_cast<int>(numels.size());
    numels.push_back(p.numel);
    tensor_param_.push_back(static_cast<int>(&p - params_.data()));
  }
  layout_ = ShardLayout(numels, world_, kTensorAlignment);

  // Stage 3 keeps small parameters whole (stage3_param_persistence_threshold), up to
  // stage3_model_persistence_threshold elements in all, as DeepSpeed does.
  const ZeroConfig& zero = config_.zero_optimization;
  if (stage_ == 3) {
    std::int64_t persistent_total = 0;
    for (ParamInfo& p : params_) {
      if (!p.trainable) continue;
      if (p.numel < zero.param_persistence_threshold &&
          persistent_total + p.numel <= zero.model_persistence_threshold) {
        p.persistent = true;
        persistent_total += p.numel;
      }
    }
  }
  for (ModuleInfo& m : modules_) {
    bool any_trainable = false;
    for (int index : m.params) {
      const ParamInfo& p = params_[index];
      if (!p.trainable) continue;
      const std::int64_t lo = layout_.offset(p.tensor);
      const std::int64_t hi = lo + p.numel;
      m.flat_begin = any_trainable ? std::min(m.flat_begin, lo) : lo;
      m.flat_end = any_trainable ? std::max(m.flat_end, hi) : hi;
      any_trainable = true;
      if (stage_ == 3 && !p.persistent) m.sharded = true;
    }
    if (any_trainable) m.ranges.push_back({m.flat_begin, m.flat_end});
  }
  for (ModuleInfo& m : modules_) {
    if (m.slices.empty()) continue;
    // Persistent parameters are whole on every rank already: only the others' slices travel.
    m.ranges.clear();
    for (const ParamSliceInfo& slice : m.slices) {
      const ParamInfo& p = params_[slice.param];
      if (p.persistent) continue;
      const std::int64_t offset = layout_.offset(p.tensor);
      m.ranges.push_back({offset + slice.begin, offset + slice.end});
    }
    std::sort(m.ranges.begin(), m.ranges.end(),
              [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
    m.sharded = stage_ == 3 && !m.ranges.empty();
    if (!m.ranges.empty()) {
      m.flat_begin = m.ranges.front().begin;
      m.flat_end = m.ranges.back().end;
    }
  }
  laid_out_ = true;
}

void EngineState::finalize() {
  if (finalized_) return;
  lay_out();
  const ZeroConfig& zero = config_.zero_optimization;
  if (stage_ == 3 && adopted_.parameters == nullptr) {
    for (const ModuleInfo& m : modules_) {
      // A gathered slice lands where it sits in the whole tensor, which only the model's own
      // full-size memory has room for.
      ZEROSHARD_CHECK_USAGE(m.slices.empty(),
                            "module '" << m.name
                                       << "' is made of slices, which stage 3 gathers into the "
                                          "model's own parameter memory: call "
                                          "Engine::adopt_memory() before finalize()");
    }
  }
  open_monitors();
  if (world_ > 1) {
    // Adopted gradients change when reductions run: every rank must adopt alike.
    float adopted[2] = {adopted_.parameters ? 1.0f : 0.0f, adopted_.gradients ? 1.0f : 0.0f};
    float negated[2] = {-adopted[0], -adopted[1]};
    all_reduce_host(adopted, 2, ReduceOp::kMax);
    all_reduce_host(negated, 2, ReduceOp::kMax);
    ZEROSHARD_CHECK_USAGE(adopted[0] == -negated[0] && adopted[1] == -negated[1],
                          "ranks disagree on Engine::adopt_memory(): some adopt the model's "
                          "parameter or gradient memory and others do not; every rank must make "
                          "the same call");
  }

  if (stage_ == 3 && zero.hpz_partition_size > 1) {
    hpz_groups_ = std::make_unique<NodeGroups>(
        // check_config() held it to 1..2^31 - 1: it fits an int.
        make_node_groups(*comm_, static_cast<int>(zero.hpz_partition_size),
                         "zero_optimization.zero_hpz_partition_size"));
    set_communicators_stream(backend_->stream());
  }
  const bool swaps = zero.offload_optimizer.device == OffloadDevice::kNvme ||
                     zero.offload_param.device == OffloadDevice::kNvme;
  context_ = std::make_unique<EngineContext>(EngineContext{.config = config_,
                                                           .rank = rank_,
                                                           .world = world_,
                                                           .run_id = swaps ? draw_run_id() : 0,
                                                           .stage = stage_,
                                                           .dtype = dtype_,
                                                           .dsize = dsize_,
                                                           .layout = layout_,
                                                           .params = params_,
                                                           .modules = modules_,
                                                           .tensor_param = tensor_param_,
                                                           .comm = *comm_,
                                                           .parameter_groups = hpz_groups_.get(),
                                                           .backend = *backend_,
                                                           .tracker = tracker_,
                                                           .times = times_});
  const OffloadConfig& offload_param = zero.offload_param;
  Tier shard_tier = Tier::kDevice;
  if (offload_param.device != OffloadDevice::kNone) {
    // The shard in CPU memory: all of it under cpu, its first max_in_cpu elements under nvme.
    shard_tier = offload_param.pin_memory ? Tier::kPinnedHost : Tier::kPageableHost;
  }
  if (offload_param.device == OffloadDevice::kCpu) {
    // With device cpu the whole shard stays in CPU memory: max_in_cpu is its budget.
    if (layout_.shard_size() > offload_param.max_in_cpu) {
      throw ConfigError("zero_optimization.offload_param.max_in_cpu",
                        "got " + std::to_string(offload_param.max_in_cpu) + "; rank " +
                            std::to_string(rank_) + " keeps its whole parameter shard of " +
                            std::to_string(layout_.shard_size()) +
                            " elements in CPU memory under device \"cpu\". Raise max_in_cpu, "
                            "add ranks, or remove the key");
    }
  }
  // Before the coordinator takes this rank's shard of them (and may poison the rest).
  if (adopted_.parameters != nullptr) note_adopted_values();
  coordinator_ = std::make_unique<ParamCoordinator>(*context_, shard_tier, adopted_.parameters);
  // Gradients handed over at the end of backward are all complete at once: the whole buffer is
  // held anyway, so stages 2-3 reduce it once per window as stage 1 does, through bounded slots,
  // and keep no separate gradient shard.
  const bool whole_gradients =
      stage_ <= 1 || grad_handover_ == GradHandover::kAtEnd || adopted_.gradients != nullptr;
  // Stages 0-1 empty the model's whole buffer into an fp32 accumulator at every micro-step's end;
  // the model's own gradient memory and stages 2-3 keep the window's sum where the model wrote it.
  if (whole_gradients && grad_shard_dtype_ != dtype_ &&
      (stage_ >= 2 || adopted_.gradients != nullptr)) {
    const std::string why = adopted_.gradients != nullptr
                                ? "the model's own gradient memory (Engine::adopt_memory)"
                                : "GradHandover::kAtEnd at stage " + std::to_string(stage_);
    throw ConfigError("data_types.grad_accum_dtype",
                      "got fp32 with " + std::string(to_string(dtype_)) + " parameters and " + why +
                          "; those gradients accumulate in the whole " + to_string(dtype_) +
                          " buffer the model writes. Leave the key unset or hand gradients over "
                          "per parameter into the engine's buffers");
  }
  bucketer_ = std::make_unique<GradBucketer>(*context_, comm_dtype_, whole_gradients,
                                             adopted_.gradients, grad_shard_dtype_);
  optimizer_ = std::make_unique<OptimizerShard>(*context_, *rule_, *coordinator_,
                                                bucketer_->full_grads(), grad_shard_dtype_);
  bucketer_->deliver_to(*optimizer_);
  const OffloadConfig& offload = config_.zero_optimization.offload_optimizer;
  settles_offload_ratio_ = offload.device == OffloadDevice::kCpu && !offload.ratio;
  finalized_ = true;
  if (adopted_.parameters != nullptr) take_adopted_values();
}

std::uint64_t EngineState::draw_run_id() {
  // 48 random bits from rank 0, as two 24-bit halves (exact in fp32): the other ranks add zeros
  // to a max, so every rank ends with rank 0's draw.
  std::random_device entropy;
  const std::uint64_t drawn = (std::uint64_t{entropy()} << 32) | entropy();
  float halves[2] = {0.0f, 0.0f};
  if (rank_ == 0) {
    halves[0] = static_cast<float>(drawn & 0xffffff);
    halves[1] = static_cast<float>((drawn >> 24) & 0xffffff);
  }
  if (world_ > 1) all_reduce_host(halves, 2, ReduceOp::kMax);
  return static_cast<std::uint64_t>(halves[0]) | (static_cast<std::uint64_t>(halves[1]) << 24);
}

void EngineState::take_adopted_values() {
  // Bounded chunks through host memory: this runs once, and the master may live anywhere.
  constexpr std::int64_t kChunk = std::int64_t{1} << 20;
  const std::int64_t end = context_->update_end();
  std::vector<char> raw;
  std::vector<float> values;
  for (std::int64_t begin = context_->update_begin(); begin < end; begin += kChunk) {
    const std::int64_t count = std::min(kChunk, end - begin);
    raw.resize(static_cast<std::size_t>(count) * dsize_);
    values.resize(static_cast<std::size_t>(count));
    coordinator_->read_owned(begin, raw.data(), MemoryLocation::kHost, count);
    convert_to_float(raw.data(), dtype_, values.data(), count);
    optimizer_->load_master(begin, values.data(), count);
  }
}

void* EngineState::param_data(int index) {
  require_finalized();
  return coordinator_->data(index);
}

GradTarget EngineState::param_grad(int index, bool may_assign) {
  require_finalized();
  return bucketer_->grad(index, may_assign);
}

void EngineState::mark_grad_ready(int index) {
  require_finalized();
  begin_overlapped_update_if_due();
  bucketer_->mark_ready(index, micro_step_);
  coordinator_->poll();
}

void EngineState::mark_all_grads_ready() {
  require_finalized();
  begin_overlapped_update_if_due();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    if (p.trainable && !p.grad_ready) bucketer_->mark_ready(static_cast<int>(i), micro_step_);
  }
  coordinator_->poll();
}

void EngineState::gather(ModuleId module) {
  require_finalized();
  ZEROSHARD_CHECK_USAGE(module >= 0 && module < static_cast<ModuleId>(modules_.size()),
                        "gather(" << module << "): no such module");
  coordinator_->gather(module);
  bucketer_->poll();
}

void EngineState::release(ModuleId module) {
  ZEROSHARD_CHECK_USAGE(module >= 0 && module < static_cast<ModuleId>(modules_.size()),
                        "release(" << module << "): no such module");
  if (stage_ != 3) return;
  coordinator_->release(module);
}

void EngineState::gather_model() {
  for (std::size_t m = 0; m < modules_.size(); ++m) {
    if (modules_[m].slices.empty()) gather(static_cast<ModuleId>(m));
  }
}

void EngineState::release_model() {
  for (std::size_t m = modules_.size(); m-- > 0;) {
    if (modules_[m].slices.empty()) release(static_cast<ModuleId>(m));
  }
}

void EngineState::copy_param_from(int index, const float* values) {
  require_finalized();
  note_initial_values(index, values,
                      static_cast<std::size_t>(params_[index].numel) * sizeof(float));
  coordinator_->store(index, values);
  const ParamInfo& p = params_[index];
  if (!p.trainable) return;
  const std::int64_t lo = layout_.offset(p.tensor);
  const std::int64_t a = std::max(lo, context_->update_begin());
  const std::int64_t b = std::min(lo + p.numel, context_->update_end());
  if (b > a) optimizer_->load_master(a, values + (a - lo), b - a);
}

TrackedBuffer EngineState::allocate(MemoryCategory category, std::size_t bytes) {
  return TrackedBuffer(tracker_, category, bytes, backend_->memory());
}

void EngineState::set_communicators_stream(void* stream) noexcept {
  comm_->set_compute_stream(stream);
  if (hpz_groups_) {
    hpz_groups_->within->set_compute_stream(stream);
    hpz_groups_->across->set_compute_stream(stream);
  }
}

void EngineState::all_reduce_host(float* values, int count, ReduceOp op) {
  if (reduction_scalars_.empty()) {
    comm_->all_reduce(values, count, DType::kFloat32, op);
    return;
  }
  float* buffer = reduction_scalars_.as<float>();
  backend_->copy_from_host(buffer, values, count * sizeof(float));
  comm_->all_reduce(buffer, count, DType::kFloat32, op);
  backend_->copy_to_host(values, buffer, count * sizeof(float));
}

ScheduledValues EngineState::scheduled() const {
  if (lr_override_ >= 0.0) return {lr_override_, std::nullopt};
  // DeepSpeed steps its scheduler after each applied update, so update k (0-based) runs with
  // last_batch_iteration k - 1.
  if (scheduler_) return scheduler_->at(global_step_ - 1);
  return {rule_->default_lr(), std::nullopt};
}

}  // namespace detail

// --- Parameter -----------------------------------------------------------------------------------

detail::EngineState& Parameter::state() const {
  detail::EngineState* state = engine_ ? engine_->state() : nullptr;
  ZEROSHARD_CHECK_USAGE(state != nullptr, "Parameter '" << name()
                                                        << "': its Engine was destroyed; keep the "
                                                           "Engine alive while its parameters "
                                                           "are used");
  return *state;
}

const std::string& Parameter::name() const {
  ZEROSHARD_CHECK_USAGE(engine_ != nullptr, "use of an empty Parameter handle");
  return engine_->name(index_);
}
const std::vector<std::int64_t>& Parameter::shape() const {
  ZEROSHARD_CHECK_USAGE(engine_ != nullptr, "use of an empty Parameter handle");
  return engine_->shape(index_);
}
std::int64_t Parameter::numel() const { return state().param(index_).numel; }
bool Parameter::trainable() const { return state().param(index_).trainable; }
DType Parameter::dtype() const { return state().dtype_; }
ModuleId Parameter::module() const { return state().param(index_).module; }

float* Parameter::data() const {
  ZEROSHARD_CHECK_USAGE(dtype() == DType::kFloat32,
                        "Parameter::data() of '" << name() << "' needs fp32, but the model is "
                                                 << to_string(dtype()) << "; use raw_data()");
  return static_cast<float*>(raw_data());
}
void* Parameter::raw_data() const { return state().param_data(index_); }
float* Parameter::grad() const {
  ZEROSHARD_CHECK_USAGE(dtype() == DType::kFloat32,
                        "Parameter::grad() of '" << name() << "' needs fp32, but the model is "
                                                 << to_string(dtype()) << "; use raw_grad()");
  return static_cast<float*>(raw_grad());
}
void* Parameter::raw_grad() const { return state().param_grad(index_, false).data; }
GradTarget Parameter::grad_target() const { return state().param_grad(index_, true); }
void Parameter::copy_from(std::span<const float> values) const {
  ZEROSHARD_CHECK_USAGE(static_cast<std::int64_t>(values.size()) == numel(),
                        "Parameter::copy_from('" << name() << "'): got " << values.size()
                                                 << " values, the parameter has " << numel());
  state().copy_param_from(index_, values.data());
}

// --- ActivationBuffer ----------------------------------------------------------------------------

ActivationBuffer::ActivationBuffer() = default;
ActivationBuffer::ActivationBuffer(ActivationBuffer&&) noexcept = default;
ActivationBuffer& ActivationBuffer::operator=(ActivationBuffer&& other) noexcept {
  if (this != &other) {
    free();
    buffer_ = std::move(other.buffer_);
    registry_ = std::move(other.registry_);
  }
  return *this;
}
ActivationBuffer::~ActivationBuffer() { free(); }
void ActivationBuffer::free() noexcept {
  if (registry_ && buffer_) registry_->free(*buffer_);
  buffer_.reset();
  registry_.reset();
}
float* ActivationBuffer::data() const noexcept { return buffer_ ? buffer_->as<float>() : nullptr; }
std::size_t ActivationBuffer::bytes() const noexcept { return buffer_ ? buffer_->bytes() : 0; }

// --- Engine --------------------------------------------------------------------------------------

Engine::Engine(Config config, std::unique_ptr<Communicator> communicator,
               std::unique_ptr<UpdateRule> rule)
    : Engine(std::move(config), Device::cpu(), std::move(communicator), std::move(rule)) {}
Engine::Engine(Config config, Device device, std::unique_ptr<Communicator> communicator,
               std::unique_ptr<UpdateRule> rule)
    : state_(std::make_unique<detail::EngineState>(std::move(config), device,
                                                   std::move(communicator), std::move(rule))) {}
Engine::Engine(Engine&&) noexcept = default;
detail::EngineState& Engine::live() const {
  ZEROSHARD_CHECK_USAGE(state_ != nullptr,
                        "use of a moved-from Engine: it has no model, buffers or communicator "
                        "left; use the Engine it was moved into");
  return *state_;
}
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

int Engine::add_param_group(const ParamGroupOptions& options) {
  ZEROSHARD_CHECK_USAGE(!live().laid_out_, "add_param_group('" << options.name
                                                               << "') after the engine was "
                                                                  "finalized");
  if (options.lr) {
    ZEROSHARD_CHECK_USAGE(
        std::isfinite(*options.lr) && *options.lr >= 0.0,
        "Invalid learning rate: " << *options.lr << " (expected a finite value >= 0)");
  }
  if (options.weight_decay) {
    ZEROSHARD_CHECK_USAGE(std::isfinite(*options.weight_decay) && *options.weight_decay >= 0.0,
                          "Invalid weight_decay value: " << *options.weight_decay
                                                         << " (expected a finite value >= 0)");
  }
  live().groups_.push_back({options});
  return static_cast<int>(live().groups_.size()) - 1;
}

Parameter Engine::register_parameter(const std::string& name, std::vector<std::int64_t> shape,
                                     const ParamOptions& options) {
  auto& s = live();
  ZEROSHARD_CHECK_USAGE(!s.laid_out_, "register_parameter('"
                                          << name
                                          << "') after the engine was finalized (the first "
                                             "data(), grad(), gather(), flat_offset() or step() "
                                             "finalizes it): register every parameter first");
  ZEROSHARD_CHECK_USAGE(!name.empty(), "a parameter needs a name");
  for (const auto& p : s.params_) {
    ZEROSHARD_CHECK_USAGE(p.name != name, "parameter '" << name << "' is registered twice");
  }
  ZEROSHARD_CHECK_USAGE(options.group >= 0 && options.group < static_cast<int>(s.groups_.size()),
                        "parameter '" << name << "': group " << options.group
                                      << " does not exist (add_param_group first)");
  for (std::int64_t d : shape) {
    ZEROSHARD_CHECK_USAGE(d >= 0, "parameter '" << name << "': negative dimension " << d);
  }
  const std::optional<std::int64_t> numel = detail::element_product(shape);
  ZEROSHARD_CHECK_USAGE(numel.has_value(),
                        "parameter '" << name << "': shape " << detail::format_shape(shape)
                                      << " has more than 2^56 elements, more than zeroshard can "
                                         "address (did a dimension overflow?)");
  const std::string module_name =
      options.module.empty() ? detail::default_module_name(name) : options.module;
  ModuleId module = -1;
  for (std::size_t m = 0; m < s.modules_.size(); ++m) {
    if (s.modules_[m].name == module_name) module = static_cast<ModuleId>(m);
  }
  ZEROSHARD_CHECK_USAGE(module < 0 || s.modules_[module].slices.empty(),
                        "parameter '" << name << "' joins module '" << module_name
                                      << "', which add_module() made of slices; register whole "
                                         "parameters into modules of their own");
  if (module < 0) {
    detail::ModuleInfo info;
    info.name = module_name;
    s.modules_.push_back(std::move(info));
    module = static_cast<ModuleId>(s.modules_.size()) - 1;
  } else {
    // Stage 3 gathers a module as one contiguous range of the flat buffer.
    ZEROSHARD_CHECK_USAGE(s.params_.back().module == module,
                          "parameter '" << name << "' joins module '" << module_name
                                        << "' after parameters of another module: register a "
                                           "module's parameters one after another");
  }
  detail::ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.numel = *numel;
  p.trainable = options.trainable;
  p.group = options.group;
  p.module = module;
  s.lifetime_->add_parameter(p.name, p.shape);
  s.params_.push_back(std::move(p));
  const int index = static_cast<int>(s.params_.size()) - 1;
  s.modules_[module].params.push_back(index);
  return Parameter(s.lifetime_, index);
}

void Engine::finalize() { live().finalize(); }

std::int64_t Engine::flat_offset(Parameter parameter) const {
  ZEROSHARD_CHECK_USAGE(parameter.engine_ == live().lifetime_,
                        "flat_offset() with a parameter of another engine");
  live().lay_out();
  const detail::ParamInfo& p = live().params_[parameter.index_];
  ZEROSHARD_CHECK_USAGE(p.trainable, "flat_offset('" << p.name
                                                     << "'): the parameter is frozen and has no "
                                                        "place in the flat layout");
  return live().layout_.offset(p.tensor);
}

ModuleId Engine::add_module(const std::string& name, const std::vector<ParamSlice>& slices) {
  auto& s = live();
  ZEROSHARD_CHECK_USAGE(!s.laid_out_, "add_module('"
                                          << name
                                          << "') after the engine was finalized: "
                                             "declare modules before the first data(), "
                                             "grad(), gather(), flat_offset() or step()");
  ZEROSHARD_CHECK_USAGE(!slices.empty(), "add_module('" << name << "') without slices");
  for (const detail::ModuleInfo& m : s.modules_) {
    ZEROSHARD_CHECK_USAGE(m.name != name, "add_module('" << name
                                                         << "'): a module of that name "
                                                            "exists already");
  }
  detail::ModuleInfo info;
  info.name = name;
  for (const ParamSlice& slice : slices) {
    ZEROSHARD_CHECK_USAGE(slice.parameter.engine_ == s.lifetime_,
                          "add_module('" << name << "') with a parameter of another engine");
    const detail::ParamInfo& p = s.params_[slice.parameter.index_];
    ZEROSHARD_CHECK_USAGE(p.trainable, "add_module('" << name << "'): parameter '" << p.name
                                                      << "' is frozen, and frozen parameters "
                                                         "are whole on every rank");
    ZEROSHARD_CHECK_USAGE(0 <= slice.begin && slice.begin < slice.end && slice.end <= p.numel,
                          "add_module('" << name << "'): slice [" << slice.begin << ", "
                                         << slice.end << ") of '" << p.name << "' is not inside "
                                         << "its " << p.numel << " elements");
    for (const detail::ParamSliceInfo& other : info.slices) {
      ZEROSHARD_CHECK_USAGE(
          other.param != slice.parameter.index_ || other.end <= slice.begin ||
              slice.end <= other.begin,
          "add_module('" << name << "'): two slices of '" << p.name << "' overlap");
    }
    info.slices.push_back({slice.parameter.index_, slice.begin, slice.end});
  }
  s.modules_.push_back(std::move(info));
  return static_cast<ModuleId>(s.modules_.size()) - 1;
}

void Engine::gather_model() { live().gather_model(); }
void Engine::release_model() { live().release_model(); }

namespace {
// A guard's end: releases on the state its engine lives in now, which a move of the Engine
// object keeps; nothing once the engine was destroyed, as the gathered copies went with it.
template <class Release>
void end_guard(const detail::EngineLifetime* engine, const char* guard, Release release) noexcept {
  detail::EngineState* state = engine != nullptr ? engine->state() : nullptr;
  if (state == nullptr) return;
  try {
    release(*state);
  } catch (const std::exception& error) {
    ZEROSHARD_LOG(kError, guard << "'s end could not release: " << error.what());
  }
}
}  // namespace

Engine::GatheredModule::GatheredModule(Engine& engine, ModuleId module)
    : engine_(engine.live().lifetime_), module_(module) {
  engine.gather(module);
}
Engine::GatheredModule::~GatheredModule() {
  end_guard(engine_.get(), "GatheredModule",
            [this](detail::EngineState& state) { state.release(module_); });
}

Engine::GatheredModel::GatheredModel(Engine& engine) : engine_(engine.live().lifetime_) {
  engine.gather_model();
}
Engine::GatheredModel::~GatheredModel() {
  end_guard(engine_.get(), "GatheredModel",
            [](detail::EngineState& state) { state.release_model(); });
}

std::int64_t Engine::peak_gathered_bytes() const {
  if (live().stage_ != 3 || !live().finalized_) return 0;
  return live().coordinator_->peak_gathered_elements() * static_cast<std::int64_t>(live().dsize_);
}

void Engine::adopt_memory(const ModelMemory& memory) {
  ZEROSHARD_CHECK_USAGE(!live().finalized_,
                        "adopt_memory() after the engine was finalized: call it before the first "
                        "data(), grad(), gather() or step()");
  ZEROSHARD_CHECK_USAGE(memory.parameters != nullptr || memory.gradients != nullptr,
                        "adopt_memory() with neither parameter nor gradient memory");
  live().adopted_ = memory;
}

std::vector<Parameter> Engine::parameters() const {
  std::vector<Parameter> result;
  for (std::size_t i = 0; i < live().params_.size(); ++i) {
    result.push_back(Parameter(live().lifetime_, static_cast<int>(i)));
  }
  return result;
}

Parameter Engine::parameter(std::string_view name) const {
  for (std::size_t i = 0; i < live().params_.size(); ++i) {
    if (live().params_[i].name == name) return Parameter(live().lifetime_, static_cast<int>(i));
  }
  throw UsageError("no parameter named '" + std::string(name) + "' is registered");
}

ModuleId Engine::module(std::string_view name) const {
  std::ostringstream known;
  for (std::size_t m = 0; m < live().modules_.size(); ++m) {
    if (live().modules_[m].name == name) return static_cast<ModuleId>(m);
    known << (m ? ", " : "") << "'" << live().modules_[m].name << "'";
  }
  throw UsageError("no module named '" + std::string(name) + "'; known modules: " + known.str());
}

void Engine::gather(ModuleId module) { live().gather(module); }
void Engine::release(ModuleId module) { live().release(module); }

void Engine::set_grad_handover(GradHandover handover) {
  ZEROSHARD_CHECK_USAGE(!live().laid_out_,
                        "set_grad_handover() after the engine was finalized: the gradient buffers "
                        "depend on it, so call it before the first data(), grad(), gather(), "
                        "flat_offset(), padded_numel() or step()");
  live().grad_handover_ = handover;
}
GradHandover Engine::grad_handover() const { return live().grad_handover_; }

void Engine::all_grads_ready() { live().mark_all_grads_ready(); }

void Engine::grad_ready(Parameter parameter) {
  ZEROSHARD_CHECK_USAGE(parameter.engine_ == live().lifetime_,
                        "grad_ready() with a parameter of another engine");
  live().mark_grad_ready(parameter.index_);
}

StepResult Engine::step() { return live().step(); }
void Engine::zero_grad() {
  detail::EngineState& state = live();
  state.require_finalized();
  // Called before step(), it drops a micro-step whose reductions may still be in flight; step()
  // itself zeroes after finishing them, so its own zero_grad() calls skip this.
  state.bucketer_->drop_micro_step();
  state.zero_grad();
}
bool Engine::is_gradient_accumulation_boundary() const {
  return live().micro_step_ + 1 >= live().config_.gradient_accumulation_steps;
}
std::int64_t Engine::global_step() const { return live().global_step_; }
double Engine::lr() const { return live().current_lr(); }
void Engine::set_lr(double lr) {
  ZEROSHARD_CHECK_USAGE(std::isfinite(lr) && lr >= 0.0,
                        "Invalid learning rate: " << lr << " (expected a finite value >= 0)");
  live().lr_override_ = lr;
}
double Engine::loss_scale() const { return live().loss_scale(); }
void Engine::log_loss(double loss) { live().log_loss(loss); }
double Engine::global_grad_norm() const { return live().last_grad_norm_; }
const Config& Engine::config() const { return live().config_; }
Device Engine::device() const { return live().device_; }
void Engine::set_compute_stream(void* stream) {
  live().backend_->set_stream(stream);
  live().set_communicators_stream(stream);
}
void* Engine::compute_stream() const { return live().backend_->stream(); }
Communicator& Engine::communicator() { return *live().comm_; }
const UpdateRule& Engine::update_rule() const { return *live().rule_; }
int Engine::rank() const { return live().rank_; }
int Engine::world_size() const { return live().world_; }
int Engine::stage() const { return live().stage_; }
DType Engine::model_dtype() const { return live().dtype_; }
std::int64_t Engine::trainable_numel() const {
  live().require_finalized();
  return live().layout_.unpadded_total();
}
std::int64_t Engine::padded_numel() const {
  live().lay_out();
  return live().layout_.padded_total();
}
std::int64_t Engine::shard_begin() const {
  live().require_finalized();
  return live().layout_.shard_begin(live().rank_);
}
std::int64_t Engine::shard_end() const {
  live().require_finalized();
  return live().layout_.shard_end(live().rank_);
}

ActivationBuffer Engine::allocate_activations(std::size_t bytes) {
  detail::EngineState& state = live();
  ActivationBuffer buffer;
  buffer.buffer_ =
      std::make_unique<detail::TrackedBuffer>(state.allocate(MemoryCategory::kActivations, bytes));
  buffer.registry_ = state.activations_;
  buffer.registry_->add(*buffer.buffer_);
  return buffer;
}

MemoryReport Engine::memory_report() const {
  return live().tracker_.report(live().rank_, live().world_);
}

void Engine::reset_memory_peaks() { live().tracker_.reset_peaks(); }

MemoryLocation Engine::memory_location() const { return live().backend_->memory().location(); }

void Engine::save_checkpoint(const std::string& dir, const std::string& tag,
                             const std::string& user_state) {
  live().save_checkpoint(dir, tag, user_state);
}
CheckpointInfo Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  return live().load_checkpoint(dir, tag);
}

void Engine::load_weights(const std::string& file) { live().load_weights(file); }
bool Engine::save_16bit_model(const std::string& file) { return live().save_16bit_model(file); }

void Engine::visit_consolidated_parameters(
    const std::function<void(const ConsolidatedChunk&)>& visit, std::int64_t chunk_elements) {
  detail::EngineState& state = live();
  state.visit_consolidated(
      [&](const detail::TensorPiece& piece, const float* values) {
        visit({Parameter(state.lifetime_, state.tensor_param_[piece.tensor]),
               piece.offset_in_tensor,
               std::span<const float>(values, static_cast<std::size_t>(piece.size))});
      },
      chunk_elements);
}

std::vector<float> Engine::consolidated_parameters() { return live().consolidated_parameters(); }

}  // namespace zeroshard
