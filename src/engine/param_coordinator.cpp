// Parameter storage by stage, and stage 3's gather, prefetch and release.
#include "engine/param_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "comm/node_groups.h"
#include "comm/rank_counts.h"
#include "layout/quantized_block_format.h"  // quantized_units, QuantBits
#include "util/check.h"

namespace zeroshard::detail {

namespace {

// Prefetches stop while this many gathers are in flight, the bound of the gradient reductions:
// the transport moves one at a time, so more would only hold their buffers sooner and make each
// progress poll test them all.
constexpr int kMaxGathersInFlight = 2;

// qwZ sends parameters as int8 blocks: 0.254x fp32's bytes, 0.508x of fp16's and bf16's.
constexpr QuantBits kWeightBits = QuantBits::kInt8;

// qwZ: the fp32 elements each rank's encoded piece takes on the wire. The communicator has no
// byte type, so pieces travel as fp32 elements, which it moves without looking at the values.
std::vector<std::int64_t> encoded_units(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> units(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    units[r] = quantized_units(counts[r], kWeightBits);
  }
  return units;
}

std::int64_t sum(const std::vector<std::int64_t>& values) {
  std::int64_t total = 0;
  for (std::int64_t v : values) total += v;
  return total;
}

bool poison_released_from_environment() {
  const char* value = std::getenv("ZEROSHARD_POISON_RELEASED");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace

ParamCoordinator::ParamCoordinator(const EngineContext& context, Tier shard_tier, void* adopted)
    : context_(context),
      frozen_(context, context.config.zero_optimization.quantized_nontrainable_weights),
      modules_(context.modules.size()),
      poison_released_(poison_released_from_environment()) {
  const std::size_t dsize = context_.dsize;
  const std::size_t full_bytes = context_.layout.padded_total() * dsize;
  TrackedBuffer model_memory;
  if (adopted != nullptr) {
    model_memory = TrackedBuffer::adopt(context_.tracker, MemoryCategory::kParameters, full_bytes,
                                        context_.resource(Tier::kDevice), adopted);
  }
  if (context_.stage == 3) {
    const std::int64_t shard = context_.layout.shard_size();
    const OffloadConfig& offload = context_.config.zero_optimization.offload_param;
    resident_elements_ = shard;
    if (offload.device == OffloadDevice::kNvme) {
      // DeepSpeed's max_in_cpu: that many elements of the shard stay in CPU memory, the rest
      // live on NVMe and come in through buffer_count buffers of buffer_size elements.
      resident_elements_ = std::min(shard, offload.max_in_cpu);
      if (resident_elements_ < shard) {
        SwappedShardOptions swap;
        swap.directory = offload.nvme_path;
        swap.rank = context_.rank;
        swap.kind = "param_shard";
        swap.run_id = context_.run_id;
        swap.aio = context_.config.aio;
        swap.elements = shard - resident_elements_;
        swap.element_bytes = dsize;
        swap.tile = offload.buffer_size;
        swap.buffer_count = static_cast<int>(offload.buffer_count);  // within int: check_config()
        swap.tracker = &context_.tracker;
        swapped_ = std::make_unique<SwappedShard>(swap);
      }
    }
    param_shard_ =
        context_.allocate(shard_tier, MemoryCategory::kParameters, resident_elements_ * dsize);
    persistent_copies_.resize(context_.params.size());
    if (!model_memory.empty()) {
      // The model's initial values: this rank keeps its shard of them.
      adopted_full_ = std::move(model_memory);
      const std::int64_t begin = context_.layout.shard_begin(context_.rank);
      write_owned(begin, adopted_full_.as<char>() + begin * static_cast<std::int64_t>(dsize),
                  adopted_full_.location(), shard);
      for (std::size_t m = 0; m < modules_.size(); ++m) poison_released(static_cast<ModuleId>(m));
    }
    for (std::size_t i = 0; i < context_.params.size(); ++i) {
      const ParamInfo& p = context_.params[i];
      if (p.persistent && adopted_full_.empty()) {
        persistent_copies_[i] =
            context_.allocate(Tier::kDevice, MemoryCategory::kParameters, p.numel * dsize);
      }
    }
  } else if (!model_memory.empty()) {
    params_full_ = std::move(model_memory);
  } else {
    params_full_ = context_.allocate(Tier::kDevice, MemoryCategory::kParameters, full_bytes);
  }
  for (const ParamInfo& p : context_.params) {
    if (p.persistent) persistent_elements_ += p.numel;
  }
}

ParamCoordinator::~ParamCoordinator() {
  for (ModuleState& module : modules_) module.pending.clear();
}

MemoryLocation ParamCoordinator::owned_location() const noexcept {
  return context_.stage == 3 ? param_shard_.location() : params_full_.location();
}

void* ParamCoordinator::owned_at(std::int64_t flat) {
  if (context_.stage == 3) {
    return param_shard_.as<char>() + (flat - context_.layout.shard_begin(context_.rank)) *
                                         static_cast<std::int64_t>(context_.dsize);
  }
  return params_full_.as<char>() + flat * static_cast<std::int64_t>(context_.dsize);
}

TrackedBuffer ParamCoordinator::staging_for_owned() {
  if (context_.stage != 3 || swapped_) return {};
  for (const ModuleState& module : modules_) {
    if (module.residency == Residency::kInFlight) return {};
  }
  return param_shard_.uninitialized_twin();
}

void ParamCoordinator::adopt_owned(TrackedBuffer staged) { std::swap(param_shard_, staged); }

template <class Use>
void ParamCoordinator::for_each_owned_part(std::int64_t flat, std::int64_t count, bool will_write,
                                           Use use) {
  if (!swapped_) {
    use(static_cast<char*>(owned_at(flat)), owned_location(), std::int64_t{0}, count);
    return;
  }
  const std::int64_t local = flat - context_.layout.shard_begin(context_.rank);
  const std::int64_t resident = std::clamp(resident_elements_ - local, std::int64_t{0}, count);
  if (resident > 0)
    use(static_cast<char*>(owned_at(flat)), owned_location(), std::int64_t{0}, resident);
  if (resident == count) return;
  swapped_->for_each_part(local + resident - resident_elements_, count - resident, will_write,
                          [&](std::byte* part, std::int64_t done, std::int64_t n) {
                            use(reinterpret_cast<char*>(part), MemoryLocation::kHost,
                                resident + done, n);
                          });
}

void ParamCoordinator::read_owned(std::int64_t flat, void* out, MemoryLocation out_location,
                                  std::int64_t count) {
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  for_each_owned_part(flat, count, false,
                      [&](char* part, MemoryLocation where, std::int64_t done, std::int64_t n) {
                        context_.transfer(static_cast<char*>(out) + done * dsize, out_location,
                                          part, where, n * dsize);
                      });
}

void ParamCoordinator::write_owned(std::int64_t flat, const void* values,
                                   MemoryLocation values_location, std::int64_t count) {
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  for_each_owned_part(
      flat, count, true, [&](char* part, MemoryLocation where, std::int64_t done, std::int64_t n) {
        context_.transfer(part, where, static_cast<const char*>(values) + done * dsize,
                          values_location, n * dsize);
      });
}

void ParamCoordinator::store_owned(std::int64_t flat, const float* values, std::int64_t count) {
  for_each_owned_part(flat, count, true,
                      [&](char* part, MemoryLocation where, std::int64_t done, std::int64_t n) {
                        context_.store_host_values(values + done, part, where, n);
                      });
}

std::int64_t ParamCoordinator::owned_run_end(std::int64_t flat) const {
  const std::int64_t shard_begin = context_.layout.shard_begin(context_.rank);
  const std::int64_t shard_end = context_.layout.shard_end(context_.rank);
  if (!swapped_) return shard_end;
  const std::int64_t resident_end = shard_begin + resident_elements_;
  if (flat < resident_end) return resident_end;
  const std::int64_t tile = swapped_->tile_elements();
  return std::min(shard_end, resident_end + ((flat - resident_end) / tile + 1) * tile);
}

void* ParamCoordinator::writable_owned(std::int64_t flat, std::int64_t count) {
  char* part = nullptr;
  for_each_owned_part(flat, count, true,
                      [&](char* pointer, MemoryLocation, std::int64_t done, std::int64_t) {
                        if (done == 0) part = pointer;
                      });
  return part;
}

void ParamCoordinator::begin_update() {
  if (swapped_) swapped_->begin_update();
}

void ParamCoordinator::flush_update() {
  if (swapped_) swapped_->end_update();
}

void ParamCoordinator::roll_back_update() noexcept {
  if (swapped_) swapped_->roll_back();
}

void* ParamCoordinator::data(int index) {
  const ParamInfo& p = context_.params[index];
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  if (!p.trainable) {
    if (!frozen_.quantized()) return frozen_.data(index);
    const ModuleState& m = modules_[p.module];
    ZEROSHARD_CHECK_USAGE(m.users > 0,
                          "frozen parameter '"
                              << p.name << "' of module '" << context_.modules[p.module].name
                              << "' is not gathered: under "
                                 "zero_optimization.zero_quantized_nontrainable_weights frozen "
                                 "parameters are kept as int8 blocks and decoded while their "
                                 "module is gathered; call engine.gather(module) (or hold a "
                                 "GatheredModule) before reading it");
    return m.frozen_decoded.as<char>() + frozen_.decoded_offset(index) * dsize;
  }
  const std::int64_t offset = context_.layout.offset(p.tensor);
  if (context_.stage != 3) return params_full_.as<char>() + offset * dsize;
  if (p.persistent) return persistent_base(index);
  const ModuleInfo& info = context_.modules[p.module];
  ModuleState& m = modules_[p.module];
  ZEROSHARD_CHECK_USAGE(m.users > 0 && m.residency == Residency::kAvailable,
                        "parameter '" << p.name << "' of module '" << info.name
                                      << "' is not gathered: at ZeRO stage 3 call "
                                         "engine.gather(module) (or hold a GatheredModule) "
                                         "before reading or writing it");
  return gathered_base(p.module) + (offset - info.flat_begin) * dsize;
}

char* ParamCoordinator::gathered_base(ModuleId module) {
  if (adopted_full_.empty()) return modules_[module].gathered.as<char>();
  return adopted_full_.as<char>() +
         context_.modules[module].flat_begin * static_cast<std::int64_t>(context_.dsize);
}

char* ParamCoordinator::persistent_base(int index) {
  if (adopted_full_.empty()) return persistent_copies_[index].as<char>();
  return adopted_full_.as<char>() + context_.layout.offset(context_.params[index].tensor) *
                                        static_cast<std::int64_t>(context_.dsize);
}

void ParamCoordinator::store(int index, const float* values) {
  const ParamInfo& p = context_.params[index];
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  const MemoryLocation device = context_.backend.memory().location();
  if (!p.trainable) {
    frozen_.store(index, values);
    // A gathered module shows the values later gathers will: the stored ones, decoded.
    ModuleState& m = modules_[p.module];
    if (!m.frozen_decoded.empty()) {
      frozen_.decode(index, m.frozen_decoded.as<char>() + frozen_.decoded_offset(index) * dsize);
    }
    return;
  }
  const std::int64_t lo = context_.layout.offset(p.tensor);
  const std::int64_t hi = lo + p.numel;
  if (context_.stage != 3) {
    context_.store_host_values(values, params_full_.as<char>() + lo * dsize, device, p.numel);
    return;
  }
  const std::int64_t a = std::max(lo, context_.layout.shard_begin(context_.rank));
  const std::int64_t b = std::min(hi, context_.layout.shard_end(context_.rank));
  if (b > a) store_owned(a, values + (a - lo), b - a);
  if (context_.parameter_groups != nullptr && !p.persistent) {
    store_secondary(p.module, lo, values, p.numel);
  }
  if (!adopted_full_.empty()) {
    // The model's whole copy takes the values whether its module is gathered or not.
    context_.store_host_values(values, adopted_full_.as<char>() + lo * dsize, device, p.numel);
    return;
  }
  if (p.persistent) {
    context_.store_host_values(values, persistent_copies_[index].data(), device, p.numel);
  }
  const ModuleInfo& info = context_.modules[p.module];
  ModuleState& m = modules_[p.module];
  if (m.residency == Residency::kAvailable) {
    context_.store_host_values(values, m.gathered.as<char>() + (lo - info.flat_begin) * dsize,
                               device, p.numel);
  }
}

std::vector<std::int64_t> ParamCoordinator::group_counts(std::int64_t elements) const {
  const int k = context_.parameter_groups->group_size;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(k), elements / k);
  for (std::int64_t i = 0; i < elements % k; ++i) ++counts[static_cast<std::size_t>(i)];
  return counts;
}

void ParamCoordinator::keep_secondary(ModuleId module) {
  const ModuleInfo& info = context_.modules[module];
  ModuleState& m = modules_[module];
  const int index = context_.parameter_groups->index;
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  std::int64_t kept = 0;
  for (const FlatRange& range : info.ranges) kept += group_counts(range.end - range.begin)[index];
  m.secondary = TrackedBuffer::uninitialized(context_.tracker, MemoryCategory::kParameters,
                                             static_cast<std::size_t>(kept * dsize),
                                             context_.resource(Tier::kDevice));
  const char* gathered = gathered_base(module);
  char* piece = m.secondary.as<char>();
  for (const FlatRange& range : info.ranges) {
    const auto counts = group_counts(range.end - range.begin);
    const std::int64_t before = offset_of(counts, index);
    const std::int64_t n = counts[static_cast<std::size_t>(index)];
    if (n > 0) {
      context_.backend.copy(piece, gathered + (range.begin - info.flat_begin + before) * dsize,
                            static_cast<std::size_t>(n * dsize));
    }
    piece += n * dsize;
  }
}

void ParamCoordinator::store_secondary(ModuleId module, std::int64_t lo, const float* values,
                                       std::int64_t count) {
  ModuleState& m = modules_[module];
  if (m.secondary.empty()) return;
  const int index = context_.parameter_groups->index;
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  const MemoryLocation location = context_.backend.memory().location();
  char* piece = m.secondary.as<char>();
  for (const FlatRange& range : context_.modules[module].ranges) {
    const auto counts = group_counts(range.end - range.begin);
    const std::int64_t begin = range.begin + offset_of(counts, index);
    const std::int64_t n = counts[static_cast<std::size_t>(index)];
    const std::int64_t a = std::max(lo, begin);
    const std::int64_t b = std::min(lo + count, begin + n);
    if (b > a)
      context_.store_host_values(values + (a - lo), piece + (a - begin) * dsize, location, b - a);
    piece += n * dsize;
  }
}

std::int64_t ParamCoordinator::module_size(ModuleId module) const {
  std::int64_t size = 0;
  for (const FlatRange& range : context_.modules[module].ranges) size += range.end - range.begin;
  return size;
}

void ParamCoordinator::gather(ModuleId module) {
  if (context_.stage != 3) return;
  ModuleState& m = modules_[module];
  if (trace_valid_) {
    if (trace_position_ < trace_.size() && trace_[trace_position_] == module) {
      ++trace_position_;
    } else {
      // The order differs from the last step's (DeepSpeed's "trace cache invalidated"): stop
      // prefetching until a new order has been recorded.
      trace_valid_ = false;
    }
  }
  recording_.push_back(module);
  ++m.users;
  const bool sharded = context_.modules[module].sharded;
  if (sharded && m.residency == Residency::kReleased) {
    // stage3_max_live_parameters is DeepSpeed's budget, not a wall: the module asked for is always
    // gathered; to stay within the budget, copies that are only kept for reuse or prefetched go
    // first, those not needed soon before the rest.
    free_unused_over_budget(module_size(module));
    start_gather(module);
  }
  // Local work, so it runs while the module's all-gather is in flight.
  if (frozen_.quantized() && m.frozen_decoded.empty() && frozen_.module_elements(module) > 0) {
    m.frozen_decoded = frozen_.decode_module(module);
  }
  if (!sharded) return;
  if (m.residency == Residency::kInFlight) finish_gather(module);
  if (trace_valid_) prefetch_after(trace_position_);
  if (trace_valid_ && swapped_) read_ahead_after(trace_position_);
  poll();
}

void ParamCoordinator::free_unused_over_budget(std::int64_t incoming) {
  const std::int64_t limit = context_.config.zero_optimization.max_live_parameters;
  for (const bool keep_soon_reused : {true, false}) {
    for (std::size_t other = 0; other < modules_.size() && live_elements_ + incoming > limit;
         ++other) {
      const auto id = static_cast<ModuleId>(other);
      const ModuleState& o = modules_[other];
      if (!context_.modules[other].sharded || o.users > 0 || o.residency == Residency::kReleased) {
        continue;
      }
      if (keep_soon_reused && reused_soon(id)) continue;
      free_module(id);
    }
  }
}

void ParamCoordinator::read_ahead_after(std::size_t trace_index) {
  const std::int64_t shard_begin = context_.layout.shard_begin(context_.rank);
  const std::int64_t shard_end = context_.layout.shard_end(context_.rank);
  std::int64_t budget = swapped_->capacity_elements();
  for (std::size_t i = trace_index; i < trace_.size() && budget > 0; ++i) {
    const ModuleId id = trace_[i];
    if (!context_.modules[id].sharded || modules_[id].residency != Residency::kReleased) continue;
    for (const FlatRange& range : context_.modules[id].ranges) {
      const std::int64_t lo = std::max(range.begin, shard_begin + resident_elements_) - shard_begin;
      const std::int64_t hi = std::min(range.end, shard_end) - shard_begin;
      if (hi <= lo) continue;
      if (!swapped_->read_ahead(lo - resident_elements_, hi - lo)) return;
      budget -= hi - lo;
    }
  }
}

void ParamCoordinator::start_gather(ModuleId module) {
  const ModuleInfo& info = context_.modules[module];
  ModuleState& m = modules_[module];
  const auto start = std::chrono::steady_clock::now();
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  if (adopted_full_.empty()) {
    m.gathered = take_gathered_buffer(static_cast<std::size_t>(module_size(module) * dsize));
  }
  char* gathered = gathered_base(module);
  if (!m.secondary.empty()) {
    // hpZ: the module was gathered earlier in this step (forward), so the ranks of the node group
    // hold all of it between them: the gather stays inside the group, unquantized, and gives
    // the values the first gather gave.
    Communicator& group = *context_.parameter_groups->within;
    const int index = context_.parameter_groups->index;
    const char* piece = m.secondary.as<char>();
    for (const FlatRange& range : info.ranges) {
      const auto counts = group_counts(range.end - range.begin);
      char* target = gathered + (range.begin - info.flat_begin) * dsize;
      const std::int64_t n = counts[static_cast<std::size_t>(index)];
      if (n > 0) {
        context_.backend.copy(target + offset_of(counts, index) * dsize, piece,
                              static_cast<std::size_t>(n * dsize));
      }
      piece += n * dsize;
      m.pending.push_back(group.all_gather_async(target, counts, context_.dtype));
    }
    m.from_secondary = true;
  } else {
    start_gather_from_shards(module, gathered);
  }
  m.residency = Residency::kInFlight;
  live_elements_ += module_size(module);
  peak_live_elements_ = std::max(peak_live_elements_, live_elements_);
  context_.times.gather += seconds_since(start);
}

void ParamCoordinator::start_gather_from_shards(ModuleId module, char* gathered) {
  const ModuleInfo& info = context_.modules[module];
  ModuleState& m = modules_[module];
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  m.from_secondary = false;
  const MemoryLocation gathered_location = context_.backend.memory().location();
  const bool quantized = context_.config.zero_optimization.quantized_weights;
  int* nonfinite = nullptr;
  float* encoded = nullptr;
  if (quantized) {
    std::int64_t units = 1;  // the non-finite counter
    for (const FlatRange& range : info.ranges) {
      units += sum(encoded_units(context_.layout.rank_counts(range.begin, range.end)));
    }
    // Only this rank's pieces are written before the gathers, which overwrite the rest.
    m.encoded = TrackedBuffer::uninitialized(context_.tracker, MemoryCategory::kCommunication,
                                             static_cast<std::size_t>(units) * sizeof(float),
                                             context_.resource(Tier::kDevice));
    nonfinite = m.encoded.as<int>();
    encoded = m.encoded.as<float>() + 1;
    context_.backend.zero(nonfinite, sizeof(int));
  }
  // One range for a module of whole parameters; one per slice otherwise (those land in the
  // adopted memory where they sit in the whole tensors).
  for (const FlatRange& range : info.ranges) {
    char* target = gathered + (range.begin - info.flat_begin) * dsize;
    const std::int64_t lo = std::max(range.begin, context_.layout.shard_begin(context_.rank));
    const std::int64_t hi = std::min(range.end, context_.layout.shard_end(context_.rank));
    // Under offload_param the shard is host memory (or NVMe): this copy brings it in.
    if (hi > lo) read_owned(lo, target + (lo - range.begin) * dsize, gathered_location, hi - lo);
    const auto counts = context_.layout.rank_counts(range.begin, range.end);
    if (!quantized) {
      m.pending.push_back(context_.comm.all_gather_async(target, counts, context_.dtype));
      continue;
    }
    const auto units = encoded_units(counts);
    float* own = encoded;
    for (int r = 0; r < context_.rank; ++r) own += units[r];
    if (hi > lo) {
      // The padding after the codes is zeroed so that every rank sends defined bytes.
      context_.backend.zero(own + units[context_.rank] - 1, sizeof(float));
      context_.backend.quantize_blocks(target + (lo - range.begin) * dsize, context_.dtype, hi - lo,
                                       kWeightBits, own, nonfinite);
    }
    m.pending.push_back(context_.comm.all_gather_async(encoded, units, DType::kFloat32));
    encoded += sum(units);
  }
}

void ParamCoordinator::finish_gather(ModuleId module) {
  ModuleState& m = modules_[module];
  const auto start = std::chrono::steady_clock::now();
  for (Request& request : m.pending) request.wait();
  m.pending.clear();
  if (!m.encoded.empty()) decode_gathered(module);
  if (context_.parameter_groups != nullptr && !m.from_secondary) keep_secondary(module);
  m.residency = Residency::kAvailable;
  context_.times.gather += seconds_since(start);
}

void ParamCoordinator::decode_gathered(ModuleId module) {
  const ModuleInfo& info = context_.modules[module];
  ModuleState& m = modules_[module];
  const TrackedBuffer encoded_buffer = std::move(m.encoded);  // freed on return, thrown or not
  int nonfinite = 0;
  context_.backend.copy_to_host(&nonfinite, encoded_buffer.as<int>(), sizeof(int));
  // A block of inf or NaN is encoded as zeros that the other ranks cannot tell from data.
  ZEROSHARD_CHECK_USAGE(nonfinite == 0, "zero_quantized_weights: module '"
                                            << info.name << "' holds inf or NaN in " << nonfinite
                                            << " block(s) of rank " << context_.rank
                                            << "'s piece; parameters must be finite");
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  // In the model's own memory the persistent parameters sit inside a module's range, whole and
  // exact (the engine's memory keeps them apart): they are set aside while the pieces are decoded
  // over them, so that qwZ never rounds them. A module of slices gathers around them already.
  std::vector<int> persistent;
  std::int64_t persistent_total = 0;
  if (!adopted_full_.empty() && info.slices.empty()) {
    for (int index : info.params) {
      const ParamInfo& p = context_.params[index];
      if (!p.persistent) continue;
      persistent.push_back(index);
      persistent_total += p.numel;
    }
  }
  const TrackedBuffer kept =
      persistent.empty()
          ? TrackedBuffer{}
          : TrackedBuffer::uninitialized(context_.tracker, MemoryCategory::kCommunication,
                                         static_cast<std::size_t>(persistent_total * dsize),
                                         context_.resource(Tier::kDevice));
  const auto set_aside = [&](bool restore) {
    char* place = kept.as<char>();
    for (int index : persistent) {
      const auto bytes = static_cast<std::size_t>(context_.params[index].numel * dsize);
      if (restore) {
        context_.backend.copy(persistent_base(index), place, bytes);
      } else {
        context_.backend.copy(place, persistent_base(index), bytes);
      }
      place += bytes;
    }
  };
  set_aside(false);
  char* gathered = gathered_base(module);
  const float* encoded = encoded_buffer.as<float>() + 1;
  for (const FlatRange& range : info.ranges) {
    const auto counts = context_.layout.rank_counts(range.begin, range.end);
    const auto units = encoded_units(counts);
    // Every piece is decoded, this rank's too, so that all ranks hold the same values.
    char* target = gathered + (range.begin - info.flat_begin) * dsize;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] > 0) {
        context_.backend.dequantize_blocks(encoded, kWeightBits, counts[r], target, context_.dtype);
      }
      target += counts[r] * dsize;
      encoded += units[r];
    }
  }
  set_aside(true);
}

TrackedBuffer ParamCoordinator::take_gathered_buffer(std::size_t bytes) {
  const auto fits = std::find_if(spare_gathered_.begin(), spare_gathered_.end(),
                                 [bytes](const TrackedBuffer& b) { return b.bytes() == bytes; });
  if (fits == spare_gathered_.end()) {
    spare_gathered_.clear();
    // The module's one range covers the buffer and its all-gather writes every byte of it (slices
    // land in the model's own memory instead), so a zero fill would be a wasted pass.
    return TrackedBuffer::uninitialized(context_.tracker, MemoryCategory::kParameters, bytes,
                                        context_.resource(Tier::kDevice));
  }
  TrackedBuffer buffer = std::move(*fits);
  spare_gathered_.erase(fits);
  buffer.reuse();
  return buffer;
}

void ParamCoordinator::free_module(ModuleId module) {
  ModuleState& m = modules_[module];
  for (Request& request : m.pending) request.wait();
  m.pending.clear();
  m.encoded = TrackedBuffer{};  // a prefetch never used: nothing to decode
  poison_released(module);
  if (!m.gathered.empty()) spare_gathered_.push_back(std::move(m.gathered));
  m.residency = Residency::kReleased;
  live_elements_ -= module_size(module);
}

void ParamCoordinator::poison_released(ModuleId module) {
  const ModuleInfo& info = context_.modules[module];
  if (!poison_released_ || !info.sharded) return;
  // x * NaN is NaN for every x, so the backend's scaling kernel fills any element type with it.
  constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  const auto fill = [&](char* data, std::int64_t count) {
    context_.backend.scale(data, context_.dtype, count, kPoison);
  };
  ModuleState& m = modules_[module];
  if (adopted_full_.empty()) {
    if (!m.gathered.empty()) fill(m.gathered.as<char>(), module_size(module));
    return;
  }
  // In the model's memory, persistent parameters stay readable: only the sharded parts go.
  char* base = adopted_full_.as<char>();
  if (!info.slices.empty()) {
    for (const FlatRange& range : info.ranges) {
      fill(base + range.begin * dsize, range.end - range.begin);
    }
    return;
  }
  for (int index : info.params) {
    const ParamInfo& p = context_.params[index];
    if (p.trainable && !p.persistent) {
      fill(base + context_.layout.offset(p.tensor) * dsize, p.numel);
    }
  }
}

void ParamCoordinator::prefetch_after(std::size_t trace_index) {
  std::int64_t budget = context_.config.zero_optimization.prefetch_bucket_size;
  const std::int64_t limit = context_.config.zero_optimization.max_live_parameters;
  int in_flight =
      static_cast<int>(std::count_if(modules_.begin(), modules_.end(), [](const ModuleState& m) {
        return m.residency == Residency::kInFlight;
      }));
  for (std::size_t i = trace_index; i < trace_.size() && in_flight < kMaxGathersInFlight; ++i) {
    const ModuleId id = trace_[i];
    const ModuleState& m = modules_[id];
    if (!context_.modules[id].sharded || m.users > 0) continue;
    const std::int64_t size = module_size(id);
    if (size > budget) return;
    budget -= size;
    if (m.residency != Residency::kReleased) continue;  // already on its way
    if (live_elements_ + size > limit) return;
    start_gather(id);
    ++in_flight;
  }
}

bool ParamCoordinator::reused_soon(ModuleId module) const {
  if (!trace_valid_) return false;
  // DeepSpeed's rule: walk the upcoming modules, counting their elements, until
  // stage3_max_reuse_distance is reached; a module met on the way is kept.
  const std::int64_t distance = context_.config.zero_optimization.max_reuse_distance;
  std::int64_t traversed = 0;
  for (std::size_t i = trace_position_; i < trace_.size(); ++i) {
    if (traversed >= distance) return false;
    if (trace_[i] == module) return true;
    traversed += module_size(trace_[i]);
  }
  return false;
}

void ParamCoordinator::release(ModuleId module) {
  if (context_.stage != 3) return;
  ModuleState& m = modules_[module];
  ZEROSHARD_CHECK_USAGE(m.users > 0, "release('" << context_.modules[module].name
                                                 << "') without a matching gather()");
  if (--m.users > 0) return;
  // Decoded frozen values are freed at once, outside the reuse and budget rules of gathered
  // copies: decoding again is a local pass with no communication to save, and keeping them would
  // hold the memory the quantization saves.
  m.frozen_decoded = TrackedBuffer{};
  if (!context_.modules[module].sharded) return;
  // A copy is kept for its next use only within the live budget.
  if (!reused_soon(module) ||
      live_elements_ > context_.config.zero_optimization.max_live_parameters) {
    free_module(module);
  }
}

void ParamCoordinator::release_all_after_step(const char* caller) {
  if (context_.stage != 3) return;
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    const ModuleState& m = modules_[i];
    ZEROSHARD_CHECK_USAGE(m.users == 0, caller << " while module '" << context_.modules[i].name
                                               << "' is still gathered: release every module "
                                                  "(or end every GatheredModule) first");
    // The update changes the shards, so a kept copy would be stale, and so would the secondary
    // partition.
    if (context_.modules[i].sharded && m.residency != Residency::kReleased) {
      free_module(static_cast<ModuleId>(i));
    }
    modules_[i].secondary = TrackedBuffer{};
  }
  // Nothing gathered outlives the step as a parameter: the update changes the shards. A device's
  // allocator (CUDA's stream-ordered pool) hands freed bytes to the next gathers, so there the
  // memory is the update's; host memory comes back from the kernel as fresh pages, faulted in
  // and zeroed at the next step's first gathers, so there the buffers are kept, and reported so.
  if (context_.resource(Tier::kDevice).location() == MemoryLocation::kHost) {
    for (TrackedBuffer& buffer : spare_gathered_) buffer.keep_for_reuse();
  } else {
    spare_gathered_.clear();
  }
  if (!recording_.empty()) {
    trace_ = std::move(recording_);
    recording_.clear();
    trace_valid_ = true;
  }
  trace_position_ = 0;
}

void ParamCoordinator::poll() {
  if (swapped_) swapped_->poll();
  for (ModuleState& m : modules_) {
    for (Request& request : m.pending) request.test();
  }
}

void ParamCoordinator::after_update() {
  if (context_.stage == 1 || context_.stage == 2) all_gather_parameters();
  if (context_.stage == 3) refresh_persistent_params();
}

void ParamCoordinator::all_gather_parameters() {
  const ShardLayout& layout = context_.layout;
  const DType dtype = context_.dtype;
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  const std::int64_t total = layout.padded_total();
  // 0 gathers everything at once, as newest DeepSpeed does whatever the bucket size.
  const std::int64_t bucket = context_.config.zero_optimization.allgather_bucket_size;
  const std::int64_t chunk =
      bucket == 0 ? total : std::max<std::int64_t>(bucket, layout.world_size());
  std::vector<Request> requests;
  for (std::int64_t lo = 0; lo < total; lo += chunk) {
    const std::int64_t hi = std::min(total, lo + chunk);
    char* base = params_full_.as<char>();
    if (context_.config.zero_optimization.allgather_partitions) {
      requests.push_back(
          context_.comm.all_gather_async(base + lo * dsize, layout.rank_counts(lo, hi), dtype));
    } else {
      // DeepSpeed's allgather_partitions=false: each owner broadcasts its part instead.
      const auto counts = layout.rank_counts(lo, hi);
      std::int64_t offset = lo;
      for (int r = 0; r < context_.world; ++r) {
        if (counts[r] > 0) {
          requests.push_back(
              context_.comm.broadcast_async(base + offset * dsize, counts[r], dtype, r));
        }
        offset += counts[r];
      }
    }
    // Two chunks in flight bound the transfer's working set like the reduce buckets.
    if (requests.size() > 2) {
      requests.front().wait();
      requests.erase(requests.begin());
    }
  }
  for (Request& r : requests) r.wait();
}

void ParamCoordinator::refresh_persistent_params() {
  const ShardLayout& layout = context_.layout;
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  std::vector<Request> requests;
  for (std::size_t i = 0; i < context_.params.size(); ++i) {
    const ParamInfo& p = context_.params[i];
    if (!p.persistent) continue;
    char* copy = persistent_base(static_cast<int>(i));
    const MemoryLocation copy_location = context_.backend.memory().location();
    const std::int64_t lo = layout.offset(p.tensor);
    const std::int64_t hi = lo + p.numel;
    const std::int64_t a = std::max(lo, layout.shard_begin(context_.rank));
    const std::int64_t b = std::min(hi, layout.shard_end(context_.rank));
    if (b > a) read_owned(a, copy + (a - lo) * dsize, copy_location, b - a);
    requests.push_back(
        context_.comm.all_gather_async(copy, layout.rank_counts(lo, hi), context_.dtype));
  }
  for (Request& r : requests) r.wait();
}

}  // namespace zeroshard::detail
