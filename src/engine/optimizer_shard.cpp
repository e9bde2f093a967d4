// Placement of the optimizer shard's buffers, the arrival of reduced gradients, and the update
// loop: for each sub-group, acquire (resident in this part), apply the rule with the step's one
// gradient factor while writing the model's copy, write back, release.
#include "engine/optimizer_shard.h"

#include <algorithm>

#include "optim/builtin_rule.h"

namespace zeroshard::detail {

namespace {

// Offload on a GPU: elements per write-back of updated parameters through pinned memory, so the
// staging buffer stays small whatever sub_group_size is (8 MiB of 16-bit values).
constexpr std::int64_t kWriteBackElements = std::int64_t{1} << 22;
// Swap files: elements per rule call within a sub-group, between which the I/O in flight is
// advanced (reaped and refilled), so the reads ahead and writes behind keep the drive busy.
constexpr std::int64_t kSwapPollElements = std::int64_t{1} << 20;

}  // namespace

OptimizerShard::OptimizerShard(const EngineContext& context, const UpdateRule& rule,
                               ParamCoordinator& params, const char* full_grads,
                               DType grad_shard_dtype)
    : context_(context),
      rule_(rule),
      params_(params),
      full_grads_(full_grads),
      update_backend_(&context.backend),
      owned_begin_(context.update_begin()),
      grad_shard_dtype_(grad_shard_dtype) {
  const OffloadConfig& offload = context_.config.zero_optimization.offload_optimizer;
  Tier tier = Tier::kDevice;
  if (offload.device != OffloadDevice::kNone) {
    host_backend_ = make_cpu_backend(rule_);
    update_backend_ = host_backend_.get();
    tier = offload.pin_memory ? Tier::kPinnedHost : Tier::kPageableHost;
    // DeepSpeed's offloaded gradient partition is fp32, whatever the model's type.
    grad_shard_dtype_ = DType::kFloat32;
  }
  const std::int64_t owned = context_.update_end() - owned_begin_;
  master_aliases_params_ = !offloaded() && context_.dtype == DType::kFloat32;
  // With whole gradients (stages 0-1, or handed over at the end of backward) the shard is read
  // where the bucketer reduced it.
  if (full_grads_ == nullptr || offloaded()) {
    grad_shard_ = context_.allocate(tier, MemoryCategory::kGradients,
                                    context_.layout.shard_size() * size_of(grad_shard_dtype_));
  }
  if (offload.device == OffloadDevice::kNvme) {
    // The gradient shard stays in host memory, as in DeepSpeed; master and states are swapped,
    // one file per tensor kind so that the report charges each to its category.
    SwappedArraysOptions swap;
    swap.directory = offload.nvme_path;
    swap.rank = context_.rank;
    swap.aio = context_.config.aio;
    swap.buffer_count = static_cast<int>(offload.buffer_count);
    swap.pipeline_read = offload.pipeline_read;
    swap.pipeline_write = offload.pipeline_write;
    swap.elements = owned;
    swap.tile = context_.config.zero_optimization.sub_group_size;
    swap.files.push_back({"optimizer_master", 1, MemoryCategory::kMasterWeights});
    if (rule_.state_count() > 0) {
      swap.files.push_back(
          {"optimizer_states", rule_.state_count(), MemoryCategory::kOptimizerStates});
    }
    swap.tracker = &context_.tracker;
    swapped_ = std::make_unique<SwappedArrays>(swap);
    if (!offload.fast_init) swapped_->write_missing_tiles();
  } else {
    if (!master_aliases_params_) {
      master_ = context_.allocate(tier, MemoryCategory::kMasterWeights, owned * sizeof(float));
    }
    for (int s = 0; s < rule_.state_count(); ++s) {
      states_.push_back(
          context_.allocate(tier, MemoryCategory::kOptimizerStates, owned * sizeof(float)));
    }
  }
  state_pointers_.resize(static_cast<std::size_t>(rule_.state_count()));
  array_pointers_.resize(static_cast<std::size_t>(rule_.state_count()) + 1);
  if (context_.dtype != DType::kFloat32) {
    // A backend whose rule cannot read 16-bit gradients widens them here one chunk at a time,
    // never for the whole shard. The chunk is a bounded working buffer, not a copy of the
    // gradients, so it is counted with the other bounded buffers under communication: the
    // model-state categories then hold exactly the ZeRO paper's bytes.
    const std::int64_t chunk =
        std::max<std::int64_t>(2, std::min(context_.config.zero_optimization.sub_group_size,
                                           update_backend_->working_chunk_elements(owned)));
    scratch_ = context_.allocate(tier, MemoryCategory::kCommunication, chunk * sizeof(float));
  }
}

bool OptimizerShard::writes_back_through_staging() const {
  return !master_aliases_params_ &&
         params_.owned_location() != update_backend_->memory().location();
}

char* OptimizerShard::staging(std::size_t bytes) {
  if (staging_.bytes() < bytes) {
    staging_ = context_.allocate(Tier::kPinnedHost, MemoryCategory::kCommunication, bytes);
  }
  return staging_.as<char>();
}

void OptimizerShard::accept_reduced(std::int64_t lo, std::int64_t hi, const void* data,
                                    DType dtype) {
  // Stage 1 on the device reads its shard where the bucketer left it.
  if (grad_shard_.empty()) return;
  const std::int64_t count = hi - lo;
  void* destination = grad_shard_.as<char>() + (lo - owned_begin_) * size_of(grad_shard_dtype_);
  const void* source = data;
  if (offloaded() && context_.backend.memory().location() == MemoryLocation::kDevice) {
    const std::size_t bytes = count * size_of(dtype);
    char* host = staging(bytes);
    context_.backend.copy_to_host(host, data, bytes);
    source = host;
  }
  update_backend_->accumulate(destination, grad_shard_dtype_, source, dtype, count);
  grad_shard_zero_ = false;
}

void OptimizerShard::zero_gradients() {
  // Only accept_reduced() writes the shard (the rules read it), so a shard zeroed since is
  // still zero: load_checkpoint() then skips a pass over a gigabyte-sized buffer.
  if (grad_shard_zero_) return;
  update_backend_->zero(grad_shard_.data(), grad_shard_.bytes());
  grad_shard_zero_ = true;
}

OptimizerShard::GradView OptimizerShard::gradients() const {
  if (!grad_shard_.empty()) return {grad_shard_.as<char>(), owned_begin_, grad_shard_dtype_};
  return {full_grads_, 0, context_.dtype};
}

GradientScan OptimizerShard::scan(std::int64_t lo, std::int64_t hi) {
  const GradView view = gradients();
  return update_backend_->scan(view.base + (lo - view.first) * size_of(view.dtype), view.dtype,
                               hi - lo);
}

float* OptimizerShard::master_at(std::int64_t flat) {
  if (master_aliases_params_) return static_cast<float*>(params_.owned_at(flat));
  return master_.as<float>() + (flat - owned_begin_);
}

float* OptimizerShard::state_at(int state, std::int64_t flat) {
  return states_[state].as<float>() + (flat - owned_begin_);
}

void OptimizerShard::load_master(std::int64_t flat, const float* values, std::int64_t count) {
  if (master_aliases_params_) return;
  if (swapped_) {
    swapped_->write(0, flat - owned_begin_, values, count);
    return;
  }
  context_.transfer(master_at(flat), master_.location(), values, MemoryLocation::kHost,
                    count * sizeof(float));
}

template <class UseChunk>
void OptimizerShard::for_each_master_chunk(std::int64_t first, std::int64_t last,
                                           UseChunk use_chunk) {
  std::vector<float> chunk;
  for (std::int64_t begin = first; begin < last; begin += kWriteBackElements) {
    const std::int64_t count = std::min(kWriteBackElements, last - begin);
    chunk.resize(static_cast<std::size_t>(count));
    read_owned(0, begin, chunk.data(), count);
    use_chunk(begin, chunk.data(), count);
  }
}

void OptimizerShard::copy_master_to(float* destination) {
  if (swapped_) {
    for_each_master_chunk(owned_begin_, owned_end(),
                          [&](std::int64_t begin, const float* values, std::int64_t count) {
                            context_.transfer(destination + begin,
                                              context_.backend.memory().location(), values,
                                              MemoryLocation::kHost, count * sizeof(float));
                          });
    return;
  }
  const std::int64_t count = context_.update_end() - owned_begin_;
  const MemoryLocation source =
      master_aliases_params_ ? params_.owned_location() : master_.location();
  context_.transfer(destination + owned_begin_, context_.backend.memory().location(),
                    master_at(owned_begin_), source, count * sizeof(float));
}

float* OptimizerShard::array_at(int array, std::int64_t flat) {
  return array == 0 ? master_at(flat) : state_at(array - 1, flat);
}

MemoryLocation OptimizerShard::array_location(int array) const {
  if (array > 0) return states_[array - 1].location();
  return master_aliases_params_ ? params_.owned_location() : master_.location();
}

const float* OptimizerShard::host_view(int array, std::int64_t flat) {
  if (swapped_) return nullptr;
  return array_location(array) == MemoryLocation::kHost ? array_at(array, flat) : nullptr;
}

void OptimizerShard::read_owned(int array, std::int64_t flat, float* out, std::int64_t count) {
  if (swapped_) {
    swapped_->read(array, flat - owned_begin_, out, count);
    return;
  }
  context_.transfer(out, MemoryLocation::kHost, array_at(array, flat), array_location(array),
                    count * sizeof(float));
}

void OptimizerShard::write_owned(int array, std::int64_t flat, const float* values,
                                 std::int64_t count) {
  if (swapped_) {
    swapped_->write(array, flat - owned_begin_, values, count);
    return;
  }
  context_.transfer(array_at(array, flat), array_location(array), values, MemoryLocation::kHost,
                    count * sizeof(float));
}

void OptimizerShard::refresh_params_from_master() { refresh_params(owned_begin_, owned_end()); }

void OptimizerShard::refresh_params(std::int64_t first, std::int64_t last) {
  if (master_aliases_params_) return;
  // Rounded one bounded chunk at a time, as the update writes the 16-bit copy.
  for_each_master_chunk(first, last,
                        [&](std::int64_t begin, const float* values, std::int64_t count) {
                          context_.store_host_values(values, params_.owned_at(begin),
                                                     params_.owned_location(), count);
                        });
}

std::vector<OptimizerShard::Run> OptimizerShard::runs() const {
  std::vector<Run> result;
  for (const TensorPiece& piece : context_.layout.pieces(owned_begin_, context_.update_end())) {
    const int param = context_.tensor_param[piece.tensor];
    if (update_backend_->fuses_tensors() && !result.empty() &&
        context_.params[result.back().first_param].group == context_.params[param].group) {
      result.back().end = piece.flat_offset + piece.size;
    } else {
      result.push_back(
          {piece.flat_offset, piece.flat_offset + piece.size, param, piece.offset_in_tensor});
    }
  }
  return result;
}

void OptimizerShard::update(float grad_factor, const GroupContexts& contexts) {
  // One launch per run and sub-group: the zero padding between the pieces of a fused run stays
  // zero under every rule.
  const std::vector<Run> all_runs = runs();
  if (swapped_) {
    update_swapped(all_runs, grad_factor, contexts);
    return;
  }
  std::int64_t tile = context_.config.zero_optimization.sub_group_size;
  if (writes_back_through_staging()) tile = std::min(tile, kWriteBackElements);
  for (const Run& run : all_runs) {
    for (std::int64_t begin = run.begin; begin < run.end; begin += tile) {
      array_pointers_[0] = master_at(begin);
      for (std::size_t s = 0; s < states_.size(); ++s) {
        array_pointers_[s + 1] = state_at(static_cast<int>(s), begin);
      }
      update_sub_group(begin, std::min(run.end, begin + tile), run.first_param,
                       run.offset_in_param + (begin - run.begin), grad_factor, contexts,
                       array_pointers_);
    }
  }
}

void OptimizerShard::update_swapped(const std::vector<Run>& all_runs, float grad_factor,
                                    const GroupContexts& contexts) {
  written_until_ = owned_begin_;
  swapped_->begin_pass();
  auto run = all_runs.begin();
  for (std::int64_t tile = 0; tile < swapped_->tile_count(); ++tile) {
    const std::int64_t tile_begin = owned_begin_ + swapped_->tile_begin(tile);
    const std::int64_t tile_end = owned_begin_ + swapped_->tile_end(tile);
    const std::span<float* const> arrays = swapped_->acquire(tile);
    while (run != all_runs.end() && run->begin < tile_end) {
      const std::int64_t first = std::max(run->begin, tile_begin);
      const std::int64_t last = std::min(run->end, tile_end);
      for (std::int64_t begin = first; begin < last; begin += kSwapPollElements) {
        for (std::size_t a = 0; a < arrays.size(); ++a) {
          array_pointers_[a] = arrays[a] + (begin - tile_begin);
        }
        const std::int64_t end = std::min(last, begin + kSwapPollElements);
        written_until_ = end;
        update_sub_group(begin, end, run->first_param, run->offset_in_param + (begin - run->begin),
                         grad_factor, contexts, array_pointers_);
        swapped_->poll();
      }
      if (run->end > tile_end) break;  // the run goes on in the next tile
      ++run;
    }
    swapped_->release(tile);
  }
  swapped_->end_pass();
}

void OptimizerShard::roll_back_update() {
  if (!swapped_) return;
  swapped_->roll_back_pass();
  // The records read back are those this pass read a moment ago; the parameters it wrote are
  // rounded from them again (the model-precision copy is always the rounded master).
  refresh_params(owned_begin_, written_until_);
  written_until_ = owned_begin_;
}

void OptimizerShard::update_sub_group(std::int64_t begin, std::int64_t end, int param,
                                      std::int64_t offset_in_param, float grad_factor,
                                      const GroupContexts& contexts,
                                      std::span<float* const> arrays) {
  const ParamInfo& p = context_.params[param];
  for (std::size_t s = 0; s < state_pointers_.size(); ++s) state_pointers_[s] = arrays[s + 1];
  ShardSlice slice;
  slice.param_name = p.name;
  slice.param_numel = p.numel;
  slice.offset_in_param = offset_in_param;
  slice.size = end - begin;
  slice.param = arrays[0];
  slice.states = state_pointers_;
  const GradView view = gradients();
  FusedStepIo io;
  io.grad = view.base + (begin - view.first) * size_of(view.dtype);
  io.grad_dtype = view.dtype;
  io.grad_factor = grad_factor;
  io.param_copy_dtype = context_.dtype;
  // Write back: straight into the parameters when the update can reach them, through pinned
  // memory when they are on the GPU and the update on the host.
  const std::size_t copy_bytes = slice.size * context_.dsize;
  const bool staged = writes_back_through_staging();
  if (staged) {
    io.param_copy = staging(copy_bytes);
  } else if (!master_aliases_params_) {
    io.param_copy = params_.owned_at(begin);
  }
  const std::span<float> scratch(scratch_.as<float>(), scratch_.bytes() / sizeof(float));
  update_backend_->apply_rule(slice, io, contexts[p.group], scratch);
  if (staged) {
    context_.transfer(params_.owned_at(begin), params_.owned_location(), io.param_copy,
                      MemoryLocation::kHost, copy_bytes);
  }
}

}  // namespace zeroshard::detail
