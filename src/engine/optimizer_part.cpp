// Placement of an optimizer part's buffers, the arrival of reduced gradients, and the update
// loop: for each sub-group, acquire (resident in this part), apply the rule with the step's one
// gradient factor while writing the model's copy, write back, release.
#include "engine/optimizer_part.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>

#include "kernels/cpu/cpu_optimizer.h"
#include "optim/builtin_rule.h"
#include "util/cpu_team.h"
#include "util/log.h"

namespace zeroshard::detail {

OptimizerPart::OptimizerPart(const EngineContext& context, const UpdateRule& rule,
                             ParamCoordinator& params, char* full_grads, DType grad_shard_dtype,
                             FlatRange owned_range, PartPlacement placement,
                             OptimizerPart* predecessor)
    : context_(context),
      rule_(rule),
      params_(params),
      full_grads_(full_grads),
      update_backend_(&context.backend),
      owned_begin_(owned_range.begin),
      owned_end_(owned_range.end),
      grad_shard_dtype_(grad_shard_dtype) {
  sub_group_ = context_.config.zero_optimization.sub_group_size;
  if (sub_group_ == 0) {
    sub_group_ = 1;  // a rank that owns no element still has a (never used) tile size
    for (const TensorPiece& piece : context_.layout.pieces(owned_begin_, owned_end_)) {
      sub_group_ = std::max(sub_group_, piece.size);
    }
  }
  const OffloadConfig& offload = context_.config.zero_optimization.offload_optimizer;
  Tier tier = Tier::kDevice;
  if (placement == PartPlacement::kHost) {
    const CpuTeam team = cpu_team_for_share(offload.cpuadam_cores_perc);
    host_team_ = team.size;
    host_backend_ = make_cpu_backend(rule_, host_team_);
    update_backend_ = host_backend_.get();
    tier = offload.pin_memory ? Tier::kPinnedHost : Tier::kPageableHost;
    if (context_.rank == 0) {
      ZEROSHARD_LOG(kInfo, "the offloaded update runs on the host, on "
                               << team.description << ", per rank; the "
                               << cpu_optimizer::to_string(cpu_optimizer::active_isa())
                               << " path (OMP_PLACES and OMP_PROC_BIND place the threads)");
    }
  }
  // The host arrays are first touched by the team that updates them, in the update's schedule.
  const CpuTeamScope first_touch(host_team_);
  const std::int64_t owned = owned_end_ - owned_begin_;
  master_aliases_params_ = !offloaded() && context_.dtype == DType::kFloat32;
  // The predecessor's array, as it stands, or a new one.
  const auto array = [&](TrackedBuffer* given, MemoryCategory category, std::size_t bytes) {
    return given != nullptr ? std::move(*given) : context_.allocate(tier, category, bytes);
  };
  const auto inherited = [predecessor](TrackedBuffer OptimizerPart::*member) {
    return predecessor != nullptr ? &(predecessor->*member) : nullptr;
  };
  const auto inherited_at = [predecessor](std::vector<TrackedBuffer> OptimizerPart::*member,
                                          int i) {
    return predecessor != nullptr ? &(predecessor->*member)[i] : nullptr;
  };
  // With whole gradients (stages 0-1, or handed over at the end of backward) the shard is read
  // where the bucketer reduced it.
  if (full_grads_ == nullptr || offloaded()) {
    grad_shard_ = array(inherited(&OptimizerPart::grad_shard_), MemoryCategory::kGradients,
                        owned * size_of(grad_shard_dtype_));
  }
  if (offloaded() && offload.device == OffloadDevice::kNvme) {
    // The gradient shard stays in host memory, as in DeepSpeed; master and states are swapped,
    // one file per tensor kind so that the report charges each to its category.
    SwappedArraysOptions swap;
    swap.directory = offload.nvme_path;
    swap.rank = context_.rank;
    swap.run_id = context_.run_id;
    swap.aio = context_.config.aio;
    swap.buffer_count = static_cast<int>(offload.buffer_count);  // within int: check_config()
    swap.pipeline_read = offload.pipeline_read;
    swap.pipeline_write = offload.pipeline_write;
    // A parameter file's roll-back needs each of its tiles written at most once per update, which
    // holds when the update walks them in one direction: a descending pass, whose sub-groups are
    // still walked upwards inside, could come back to a tile it already wrote back.
    swap.alternate = !params_.swaps();
    swap.elements = owned;
    swap.tile = sub_group_;
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
      master_ = array(inherited(&OptimizerPart::master_), MemoryCategory::kMasterWeights,
                      owned * sizeof(float));
    }
    for (int s = 0; s < rule_.state_count(); ++s) {
      states_.push_back(array(inherited_at(&OptimizerPart::states_, s),
                              MemoryCategory::kOptimizerStates, owned * sizeof(float)));
    }
  }
  if (offloaded() && offload.super_offload) {
    // check_config() allows it with device cpu only: the arrays are host memory.
    next_arrays_.push_back(array(inherited_at(&OptimizerPart::next_arrays_, 0),
                                 MemoryCategory::kMasterWeights, owned * sizeof(float)));
    for (int s = 0; s < rule_.state_count(); ++s) {
      next_arrays_.push_back(array(inherited_at(&OptimizerPart::next_arrays_, 1 + s),
                                   MemoryCategory::kOptimizerStates, owned * sizeof(float)));
    }
    // What the overlapped update rounds into the parameters' type, for step() to copy in whole.
    overlap_params_ = array(inherited(&OptimizerPart::overlap_params_), MemoryCategory::kParameters,
                            static_cast<std::size_t>(owned) * context_.dsize);
    overlap_copy_done_ = context_.backend.make_copy_event();
    parallel_overlap_ = dynamic_cast<const BuiltinRule*>(&rule_) != nullptr;
    update_thread_ = std::make_unique<WorkThread>();
  }
  if (offloaded() && context_.config.gradient_accumulation_steps == 1) {
    // With more micro-steps a window's gradients land again, added to; they are scanned at step().
    // Scan working memory, charged to communication as the device's norm reduction scratch is.
    const auto tiles = static_cast<std::size_t>(owned / cpu_optimizer::kSquareTile);
    if (tiles > 0) {
      landed_ = context_.allocate(Tier::kPageableHost, MemoryCategory::kCommunication,
                                  static_cast<std::size_t>(cpu_optimizer::tile_sums_bytes(owned)));
      landed_sums_ = {landed_.as<double>(), tiles};
      landed_known_ = {reinterpret_cast<std::uint8_t*>(landed_sums_.data() + tiles), tiles};
      std::fill(landed_known_.begin(), landed_known_.end(), 0);
    }
  }
  array_pointers_.resize(static_cast<std::size_t>(rule_.state_count()) + 1);
  if (context_.dtype != DType::kFloat32) {
    // A backend whose rule cannot read 16-bit gradients widens them here one chunk at a time,
    // never for the whole shard. The chunk is a bounded working buffer, not a copy of the
    // gradients, so it is counted with the other bounded buffers under communication: the
    // model-state categories then hold exactly the ZeRO paper's bytes.
    const std::int64_t chunk = std::max<std::int64_t>(
        2, std::min(sub_group_, update_backend_->working_chunk_elements(owned)));
    scratch_ = context_.allocate(tier, MemoryCategory::kCommunication, chunk * sizeof(float));
  }
}

std::int64_t OptimizerPart::host_bytes() const noexcept {
  if (!offloaded()) return 0;
  std::size_t bytes = grad_shard_.bytes() + master_.bytes() + scratch_.bytes() +
                      overlap_params_.bytes() + landed_.bytes() +
                      (staging_ ? 2 * staging_->half_bytes() : 0);
  for (const TrackedBuffer& buffer : states_) bytes += buffer.bytes();
  for (const TrackedBuffer& buffer : next_arrays_) bytes += buffer.bytes();
  return static_cast<std::int64_t>(bytes);
}

OptimizerPart::~OptimizerPart() {
  // The update thread writes next_arrays_, which the members' order would free before it, and
  // the last kept update's copy may still read overlap_params_.
  update_thread_.reset();
  if (overlap_copy_done_) {
    wait_before_freeing(*overlap_copy_done_, "the copy of super_offload's kept parameters");
  }
}

// Offloaded, the parameters in the device tier are written through staging on either backend, so
// the CPU tests run the GPU's order of operations (on the CPU the halves hand out the parameters
// themselves: HostStaging::acquire_for).
bool OptimizerPart::writes_back_through_staging() const {
  return offloaded() &&
         context_.config.zero_optimization.offload_param.device == OffloadDevice::kNone;
}

bool OptimizerPart::rounds_params_from_master() const {
  return !offloaded() && !master_aliases_params_ &&
         params_.owned_location() != context_.backend.memory().location();
}

void OptimizerPart::expect_deliveries(std::int64_t elements, DType dtype) {
  if (!offloaded()) return;
  const std::int64_t half = host_staging_half_bytes(
      elements * static_cast<std::int64_t>(size_of(dtype)), writes_back_through_staging(),
      owned_end_ - owned_begin_, context_.config.zero_optimization.sub_group_size,
      static_cast<std::int64_t>(context_.dsize));
  staging_ = std::make_unique<HostStaging>(context_, static_cast<std::size_t>(half));
}

void OptimizerPart::before_reuse() {
  if (staging_) staging_->order_compute_after();
}

void* OptimizerPart::reduce_target(std::int64_t lo, std::int64_t /*hi*/, DType dtype) {
  // The collective writes the shard itself when its part replaces what is there and it can reach
  // it (the communicator's buffers are the device's).
  if (!replace_ || grad_shard_.empty() || dtype != grad_shard_dtype_ ||
      grad_shard_.location() != context_.backend.memory().location()) {
    return nullptr;
  }
  return grad_shard_.as<char>() + (lo - owned_begin_) * size_of(grad_shard_dtype_);
}

void OptimizerPart::micro_step_reduced() {
  if (!arrived_) return;
  arrived_ = false;
  replace_ = false;
}

void OptimizerPart::accept_reduced(std::int64_t lo, std::int64_t hi, const void* data,
                                   DType dtype) {
  // Stage 1 on the device reads its shard where the bucketer left it.
  if (grad_shard_.empty()) return;
  arrived_ = true;
  const std::int64_t count = hi - lo;
  void* destination = grad_shard_.as<char>() + (lo - owned_begin_) * size_of(grad_shard_dtype_);
  if (data == destination) {  // reduced in place (reduce_target)
    queue_overlapped(lo, hi);
    note_landed(lo, hi);
    return;
  }
  // The first micro-step of a window stores its parts; later ones add to them.
  // Only parts of the micro-step that began the overlapped update are its to queue; a part
  // still in flight from an earlier one lands as it always did.
  const auto land = [this, destination, dtype, count, lo, hi, replace = replace_,
                     overlapped = overlap_.begun](const void* source) {
    if (!replace) {
      update_backend_->accumulate(destination, grad_shard_dtype_, source, dtype, count);
    } else if (dtype == grad_shard_dtype_) {
      update_backend_->copy(destination, source, count * size_of(dtype));
    } else if (grad_shard_dtype_ == DType::kFloat32) {
      update_backend_->widen(source, dtype, static_cast<float*>(destination), count, 1.0f);
    } else {
      update_backend_->narrow(static_cast<const float*>(source), destination, grad_shard_dtype_,
                              count);
    }
    if (overlapped) queue_overlapped(lo, hi);
    note_landed(lo, hi);
  };
  if (!staging_) {
    land(data);
    return;
  }
  // Offloaded: the bucket travels to the host on the copy stream while backward goes on, and
  // lands in the shard once it has arrived (when its half is needed again, or at the step). A
  // part that replaces what is there in the shard's own type is copied straight into the shard,
  // with no second pass over it on the host.
  const char* host = staging_->acquire();
  const auto bytes = static_cast<std::size_t>(count) * size_of(dtype);
  if (replace_ && dtype == grad_shard_dtype_) {
    staging_->to_host(data, destination, bytes, [this, lo, hi, overlapped = overlap_.begun] {
      if (overlapped) queue_overlapped(lo, hi);
      note_landed(lo, hi);
    });
  } else {
    staging_->to_host(data, bytes, [land, host] { land(host); });
  }
  // The overlapped update and the scan's sums take a part as soon as it has landed: the CPU
  // backend's copies have finished already, a GPU's may have.
  if (overlap_.begun || !landed_known_.empty()) staging_->land_finished();
}

void OptimizerPart::land_gradients() {
  if (staging_) staging_->land_all();
}

void OptimizerPart::finish_write_back() {
  if (staging_) staging_->order_compute_after();
}

void OptimizerPart::note_landed(std::int64_t lo, std::int64_t hi) {
  if (landed_known_.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  constexpr std::int64_t kTile = cpu_optimizer::kSquareTile;
  const auto tiles = static_cast<std::int64_t>(landed_known_.size());
  const std::int64_t from = lo - owned_begin_;
  const std::int64_t to = hi - owned_begin_;
  const std::int64_t touched = std::min(tiles, (to + kTile - 1) / kTile);
  for (std::int64_t k = from / kTile; k < touched; ++k) landed_known_[k] = 0;
  const std::int64_t first = (from + kTile - 1) / kTile;
  const std::int64_t end = std::min(tiles, to / kTile);
  if (first >= end) return;
  const GradView view = gradients();
  const CpuTeamScope team(host_team_);
  cpu_optimizer::tile_square_sums(cpu_optimizer::active_isa(),
                                  view.at(owned_begin_ + first * kTile), view.dtype, end - first,
                                  landed_sums_.data() + first);
  std::fill(landed_known_.begin() + first, landed_known_.begin() + end, 1);
  context_.times.landed_scan += seconds_since(start);
}

void OptimizerPart::zero_gradients() {
  drop_overlapped_update();
  land_gradients();
  std::fill(landed_known_.begin(), landed_known_.end(), 0);
  if (!arrived_) {
    replace_ = true;
    return;
  }
  // Part of this micro-step has arrived: the rest adds to zeros.
  update_backend_->zero(grad_shard_.data(), grad_shard_.bytes());
  replace_ = false;
}

OptimizerPart::GradView OptimizerPart::gradients() const {
  if (!grad_shard_.empty()) return {grad_shard_.as<char>(), owned_begin_, grad_shard_dtype_};
  // The whole gradients are in the type they accumulate in.
  return {full_grads_, 0, grad_shard_dtype_};
}

void OptimizerPart::scan(std::int64_t lo, std::int64_t hi, GradientScan& scan) {
  land_gradients();
  const GradView view = gradients();
  const auto scan_range = [&](std::int64_t begin, std::int64_t end) {
    if (begin >= end) return;
    update_backend_->scan(view.at(begin), view.dtype, end - begin, scan);
  };
  // A device's scan adds one total per call: its range stays one call.
  if (landed_known_.empty()) {
    scan_range(lo, hi);
    return;
  }
  // The tile an earlier range left unfinished is finished first. Then, where the scan's tiles are
  // the landing's, a tile whose sum was taken as it landed is added as the scan would add it.
  constexpr std::int64_t kTile = cpu_optimizer::kSquareTile;
  const std::int64_t unfinished = scan.host.in_tile > 0 ? kTile - scan.host.in_tile : 0;
  std::int64_t begin = std::min(hi, lo + unfinished);
  scan_range(lo, begin);
  const auto tiles = static_cast<std::int64_t>(landed_known_.size());
  std::int64_t tile = (begin - owned_begin_) / kTile;
  if ((begin - owned_begin_) % kTile == 0) {
    // Runs of whole tiles, each all summed as they landed or none.
    while (tile < tiles && begin + kTile <= hi) {
      const std::uint8_t known = landed_known_[tile];
      const std::int64_t run_first = tile;
      std::int64_t end = begin;
      for (; tile < tiles && end + kTile <= hi && landed_known_[tile] == known; ++tile) {
        end += kTile;
      }
      if (known) {
        scan.host.add_tiles({landed_sums_.data() + run_first, landed_sums_.data() + tile});
        context_.times.landed_tiles += tile - run_first;
      } else {
        scan_range(begin, end);
      }
      begin = end;
    }
  }
  scan_range(begin, hi);
}

float* OptimizerPart::master_at(std::int64_t flat) {
  if (master_aliases_params_) return static_cast<float*>(params_.owned_at(flat));
  return master_.as<float>() + (flat - owned_begin_);
}

float* OptimizerPart::state_at(int state, std::int64_t flat) {
  return states_[state].as<float>() + (flat - owned_begin_);
}

void OptimizerPart::load_master(std::int64_t flat, const float* values, std::int64_t count) {
  drop_overlapped_update();
  if (master_aliases_params_) return;
  if (swapped_) {
    swapped_->write(0, flat - owned_begin_, values, count);
    return;
  }
  context_.transfer(master_at(flat), master_.location(), values, MemoryLocation::kHost,
                    count * sizeof(float));
}

template <class UseChunk>
void OptimizerPart::for_each_master_chunk(std::int64_t first, std::int64_t last,
                                          UseChunk use_chunk) {
  std::vector<float> chunk;
  for (std::int64_t begin = first; begin < last; begin += kWriteBackElements) {
    const std::int64_t count = std::min(kWriteBackElements, last - begin);
    chunk.resize(static_cast<std::size_t>(count));
    read_owned(0, begin, chunk.data(), count);
    use_chunk(begin, chunk.data(), count);
  }
}

void OptimizerPart::copy_master_to(float* destination, std::int64_t lo, std::int64_t hi) {
  drop_overlapped_update();
  const std::int64_t first = std::max(lo, owned_begin_);
  const std::int64_t last = std::min(hi, owned_end());
  if (first >= last) return;
  float* const target = destination + (first - lo);
  const MemoryLocation location = context_.backend.memory().location();
  if (swapped_) {
    for_each_master_chunk(first, last,
                          [&](std::int64_t begin, const float* values, std::int64_t count) {
                            context_.transfer(target + (begin - first), location, values,
                                              MemoryLocation::kHost, count * sizeof(float));
                          });
    return;
  }
  context_.transfer(target, location, master_at(first), array_location(0),
                    (last - first) * sizeof(float));
}

float* OptimizerPart::array_at(int array, std::int64_t flat) {
  return array == 0 ? master_at(flat) : state_at(array - 1, flat);
}

MemoryLocation OptimizerPart::array_location(int array) const {
  if (array > 0) return states_[array - 1].location();
  return master_aliases_params_ ? params_.owned_location() : master_.location();
}

const float* OptimizerPart::host_view(int array, std::int64_t flat) {
  drop_overlapped_update();
  if (swapped_) return nullptr;
  return array_location(array) == MemoryLocation::kHost ? array_at(array, flat) : nullptr;
}

void OptimizerPart::read_owned(int array, std::int64_t flat, float* out, std::int64_t count) {
  drop_overlapped_update();
  if (swapped_) {
    swapped_->read(array, flat - owned_begin_, out, count);
    return;
  }
  context_.transfer(out, MemoryLocation::kHost, array_at(array, flat), array_location(array),
                    count * sizeof(float));
}

void OptimizerPart::write_owned(int array, std::int64_t flat, const float* values,
                                std::int64_t count) {
  drop_overlapped_update();
  if (swapped_) {
    swapped_->write(array, flat - owned_begin_, values, count);
    return;
  }
  context_.transfer(array_at(array, flat), array_location(array), values, MemoryLocation::kHost,
                    count * sizeof(float));
}

TrackedBuffer OptimizerPart::staging_for(int array) {
  drop_overlapped_update();
  if (swapped_ || array_location(array) != MemoryLocation::kHost) return {};
  TrackedBuffer twin = array > 0                ? states_[array - 1].uninitialized_twin()
                       : master_aliases_params_ ? params_.staging_for_owned()
                                                : master_.uninitialized_twin();
  const auto owned = static_cast<std::size_t>(owned_end() - owned_begin_);
  if (twin.bytes() != owned * sizeof(float)) return {};
  return twin;
}

void OptimizerPart::adopt_array(int array, TrackedBuffer staged) {
  drop_overlapped_update();
  if (array > 0) {
    std::swap(states_[array - 1], staged);
  } else if (master_aliases_params_) {
    params_.adopt_owned(std::move(staged));
  } else {
    std::swap(master_, staged);
  }
}

void OptimizerPart::refresh_params_from_master() {
  drop_overlapped_update();
  refresh_params(owned_begin_, owned_end());
}

void OptimizerPart::refresh_params(std::int64_t first, std::int64_t last) {
  if (master_aliases_params_) return;
  // Rounded one bounded chunk at a time, as the update writes the 16-bit copy; a master in host
  // memory is read where it lies.
  if (!swapped_ && array_location(0) == MemoryLocation::kHost) {
    for (std::int64_t begin = first; begin < last; begin += kWriteBackElements) {
      params_.store_owned(begin, master_at(begin), std::min(kWriteBackElements, last - begin));
    }
    return;
  }
  for_each_master_chunk(first, last,
                        [&](std::int64_t begin, const float* values, std::int64_t count) {
                          params_.store_owned(begin, values, count);
                        });
}

std::vector<OptimizerPart::Run> OptimizerPart::runs() const {
  std::vector<Run> result;
  for (const TensorPiece& piece : context_.layout.pieces(owned_begin_, owned_end_)) {
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

void OptimizerPart::update(float grad_factor, const GroupContexts& contexts) {
  // One launch per run and sub-group: the zero padding between the pieces of a fused run stays
  // zero under every rule.
  const std::vector<Run> all_runs = runs();
  land_gradients();
  if (swapped_) {
    update_swapped(all_runs, grad_factor, contexts);
    finish_write_back();
    return;
  }
  std::int64_t tile = sub_group_;
  if (writes_back_through_staging()) tile = std::min(tile, kWriteBackElements);
  for (const Run& run : all_runs) {
    for (std::int64_t begin = run.begin; begin < run.end; begin += tile) {
      array_pointers_[0] = master_at(begin);
      for (std::size_t s = 0; s < states_.size(); ++s) {
        array_pointers_[s + 1] = state_at(static_cast<int>(s), begin);
      }
      update_sub_group(begin, std::min(run.end, begin + tile), run.first_param,
                       run.offset_in_param + (begin - run.begin), grad_factor, contexts,
                       array_pointers_, true);
    }
  }
  finish_write_back();
}

void OptimizerPart::update_swapped(const std::vector<Run>& all_runs, float grad_factor,
                                   const GroupContexts& contexts) {
  written_begin_ = written_end_ = owned_begin_;
  swapped_->begin_pass();
  // The pass visits the tiles ascending or descending, whichever keeps the last pass's tiles
  // first; each element's update is its own, so the order changes no bit.
  for (std::int64_t position = 0; position < swapped_->tile_count(); ++position) {
    const std::int64_t tile = swapped_->pass_tile(position);
    const std::int64_t tile_begin = owned_begin_ + swapped_->tile_begin(tile);
    const std::int64_t tile_end = owned_begin_ + swapped_->tile_end(tile);
    const std::span<float* const> arrays = swapped_->acquire(tile);
    auto run = std::partition_point(all_runs.begin(), all_runs.end(),
                                    [&](const Run& r) { return r.end <= tile_begin; });
    for (; run != all_runs.end() && run->begin < tile_end; ++run) {
      const std::int64_t first = std::max(run->begin, tile_begin);
      const std::int64_t last = std::min(run->end, tile_end);
      for (std::int64_t begin = first, end = first; begin < last; begin = end) {
        for (std::size_t a = 0; a < arrays.size(); ++a) {
          array_pointers_[a] = arrays[a] + (begin - tile_begin);
        }
        // A chunk ends where the parameters' memory does (a tile of their swap file), so that the
        // update writes them in place, and fits a staging half when the write-back goes through
        // one. The swap I/O goes on meanwhile on the pass's own thread.
        end = std::min({last, begin + kWriteBackElements, params_.owned_run_end(begin)});
        // Tiles already visited lie on one side of this one; the span may take in the rest of
        // this tile, whose parameters are still rounded from the master and are rounded again
        // alike by a roll-back.
        if (written_begin_ == written_end_) written_begin_ = written_end_ = begin;
        written_begin_ = std::min(written_begin_, begin);
        written_end_ = std::max(written_end_, end);
        update_sub_group(begin, end, run->first_param, run->offset_in_param + (begin - run->begin),
                         grad_factor, contexts, array_pointers_, true);
      }
    }
    swapped_->release(tile);
  }
  swapped_->end_pass();
}

void OptimizerPart::roll_back_update() {
  if (!swapped_) return;
  finish_write_back();
  swapped_->roll_back_pass();
  // The records read back are those this pass read a moment ago; the parameters it wrote are
  // rounded from them again (the model-precision copy is always the rounded master).
  refresh_params(written_begin_, written_end_);
  written_begin_ = written_end_ = owned_begin_;
}

void OptimizerPart::update_sub_group(std::int64_t begin, std::int64_t end, int param,
                                     std::int64_t offset_in_param, float grad_factor,
                                     const GroupContexts& contexts, std::span<float* const> arrays,
                                     bool writes_params) {
  const ParamInfo& p = context_.params[param];
  ShardSlice slice;
  slice.param_name = p.name;
  slice.param_numel = p.numel;
  slice.offset_in_param = offset_in_param;
  slice.size = end - begin;
  slice.param = arrays[0];
  slice.states = arrays.subspan(1);
  const GradView view = gradients();
  FusedStepIo io;
  io.grad = view.at(begin);
  io.grad_dtype = view.dtype;
  io.grad_factor = grad_factor;
  io.param_copy_dtype = context_.dtype;
  if (clears_whole_gradients()) io.grad_to_clear = full_grads_ + begin * size_of(view.dtype);
  // Write back: straight into the parameters when the update can reach them; offloaded, through
  // a staging half whose copy to the device runs while the next tile is updated.
  // The overlapped update leaves the parameters alone, which backward still reads: it writes
  // its copy aside, for step() to copy in at once if it keeps the update.
  const bool staged = writes_params && writes_back_through_staging();
  if (!writes_params) {
    io.param_copy = overlap_params_.as<char>() + (begin - owned_begin_) * context_.dsize;
  } else if (staged) {
    io.param_copy = staging_->acquire_for(params_.owned_at(begin));
  } else if (writes_params && params_.swaps()) {
    // Straight into the parameter file's cached tile: update_swapped() ends chunks at tiles.
    io.param_copy = params_.writable_owned(begin, slice.size);
  } else if (writes_params && !master_aliases_params_ && !rounds_params_from_master()) {
    io.param_copy = params_.owned_at(begin);
  }
  // The overlapped update's chunks run on a team at once: each widens in a block of its own.
  const std::span<float> scratch =
      writes_params ? std::span<float>(scratch_.as<float>(), scratch_.bytes() / sizeof(float))
                    : std::span<float>();
  update_backend_->apply_rule(slice, io, contexts[p.group], scratch);
  if (staged) {
    staging_->to_device(params_.owned_at(begin),
                        static_cast<std::size_t>(slice.size) * context_.dsize);
  } else if (writes_params && rounds_params_from_master()) {
    refresh_params(begin, end);
  }
}

namespace {

// Elements the overlapped update copies and updates at a time: the master and two states of it
// and of their copies take 384 KiB, so the rule reads what the copy just wrote from L2.
constexpr std::int64_t kOverlapChunkElements = std::int64_t{1} << 14;
// From this many elements a landed part is updated by the host team, as the rules' own threading
// threshold (kernels/cpu) starts there.
constexpr std::int64_t kOverlapTeamFrom = std::int64_t{1} << 20;

bool same_contexts(const GroupContexts& a, const GroupContexts& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const StepContext& x, const StepContext& y) {
                      return x.step == y.step && x.lr == y.lr && x.weight_decay == y.weight_decay &&
                             x.momentum == y.momentum;
                    });
}

}  // namespace

void OptimizerPart::begin_overlapped_update(float grad_factor, GroupContexts contexts) {
  drop_overlapped_update();
  overlap_copy_done_->wait();  // the last kept update's copy still reads overlap_params_
  overlap_.begun = true;
  overlap_.grad_factor = grad_factor;
  overlap_.contexts = std::move(contexts);
  overlap_.runs = runs();
  overlap_.run_elements = 0;
  for (const Run& run : overlap_.runs) overlap_.run_elements += run.end - run.begin;
}

void OptimizerPart::queue_overlapped(std::int64_t lo, std::int64_t hi) {
  if (!overlap_.begun) return;
  update_thread_->post([this, lo, hi] { update_overlapped(lo, hi); });
}

void OptimizerPart::update_overlapped(std::int64_t lo, std::int64_t hi) {
  struct Chunk {
    std::int64_t begin;
    std::int64_t end;
    const Run* run;
  };
  std::vector<Chunk> chunks;
  std::int64_t elements = 0;
  const auto first_run = std::partition_point(overlap_.runs.begin(), overlap_.runs.end(),
                                              [lo](const Run& run) { return run.end <= lo; });
  for (auto run = first_run; run != overlap_.runs.end() && run->begin < hi; ++run) {
    const std::int64_t last = std::min(run->end, hi);
    for (std::int64_t begin = std::max(run->begin, lo); begin < last;
         begin += kOverlapChunkElements) {
      chunks.push_back({begin, std::min(last, begin + kOverlapChunkElements), &*run});
      elements += chunks.back().end - begin;
    }
  }
  const auto update_chunk = [this](const Chunk& chunk) {
    std::vector<float*> arrays(next_arrays_.size());
    for (std::size_t a = 0; a < arrays.size(); ++a) {
      arrays[a] = next_arrays_[a].as<float>() + (chunk.begin - owned_begin_);
      std::memcpy(arrays[a], array_at(static_cast<int>(a), chunk.begin),
                  static_cast<std::size_t>(chunk.end - chunk.begin) * sizeof(float));
    }
    update_sub_group(chunk.begin, chunk.end, chunk.run->first_param,
                     chunk.run->offset_in_param + (chunk.begin - chunk.run->begin),
                     overlap_.grad_factor, overlap_.contexts, arrays, false);
  };
  // Chunks write disjoint elements, so the team may take them in any order without changing a
  // bit. A user's rule may keep state of its own and stays on this thread, as do parts too small
  // to pay for waking the team.
  const int team = elements >= kOverlapTeamFrom && parallel_overlap_ ? host_team_ : 1;
  if (team == 1) {
    for (const Chunk& chunk : chunks) update_chunk(chunk);
  } else {
    std::exception_ptr failure;
    std::mutex failure_mutex;
    const auto count = static_cast<std::int64_t>(chunks.size());
#pragma omp parallel for schedule(static) num_threads(team)
    for (std::int64_t c = 0; c < count; ++c) {
      try {
        update_chunk(chunks[static_cast<std::size_t>(c)]);
      } catch (...) {
        const std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
  overlap_.updated += elements;
}

void OptimizerPart::finish_overlapped_update() {
  if (!overlap_.begun) {
    overlap_ = Overlap{};  // one finished for a step that never kept it is of no later step
    return;
  }
  try {
    wait_for_overlapped_update();
  } catch (...) {
    overlap_ = Overlap{};
    throw;
  }
  overlap_.finished = true;
}

void OptimizerPart::wait_for_overlapped_update() {
  // No part of it may still be in flight to land in a later one.
  land_gradients();
  overlap_.begun = false;
  update_thread_->wait();
}

bool OptimizerPart::keep_overlapped_update(float grad_factor, const GroupContexts& contexts) {
  const bool keep = overlap_.finished && overlap_.updated == overlap_.run_elements &&
                    overlap_.grad_factor == grad_factor &&
                    same_contexts(overlap_.contexts, contexts);
  overlap_ = Overlap{};
  if (!keep) return false;
  std::swap(master_, next_arrays_[0]);
  for (std::size_t s = 0; s < states_.size(); ++s) std::swap(states_[s], next_arrays_[s + 1]);
  const std::int64_t count = owned_end_ - owned_begin_;
  if (count == 0) return true;
  if (params_.owned_location() == context_.backend.memory().location()) {
    // One copy on the copy stream; the compute stream's next work (the gathers) waits for it.
    context_.backend.copy_from_host_async(params_.owned_at(owned_begin_), overlap_params_.data(),
                                          static_cast<std::size_t>(count) * context_.dsize,
                                          *overlap_copy_done_);
    overlap_copy_done_->order_compute_after();
  } else {
    params_.write_owned(owned_begin_, overlap_params_.data(), overlap_params_.location(), count);
  }
  return true;
}

void OptimizerPart::drop_overlapped_update() {
  if (!overlap_.begun && !overlap_.finished) return;
  try {
    wait_for_overlapped_update();
  } catch (...) {
    // Dropped with the update it belonged to; the update that replaces it meets the same error.
  }
  overlap_ = Overlap{};
}

}  // namespace zeroshard::detail
