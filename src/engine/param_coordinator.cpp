// Stage 3: gathering a module's parameter shards into a whole copy, prefetching the modules that
// came next in the previous step, and releasing copies unless they are reused soon. Decisions
// depend only on the call sequence, so every rank that makes the same calls issues the same
// collectives in the same order.
#include <algorithm>
#include <chrono>

#include "engine/engine_state.h"
#include "util/check.h"

namespace zeroshard::detail {

namespace {
std::int64_t module_size(const ModuleInfo& m) { return m.flat_end - m.flat_begin; }
}  // namespace

void EngineState::gather(ModuleId module) {
  require_finalized();
  ZEROSHARD_CHECK_USAGE(module >= 0 && module < static_cast<ModuleId>(modules_.size()),
                        "gather(" << module << "): no such module");
  if (stage_ != 3) return;
  ModuleInfo& m = modules_[module];
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
  if (!m.sharded) return;
  if (m.residency == ModuleResidency::kReleased) {
    const std::int64_t limit = config_.zero_optimization.max_live_parameters;
    // Copies kept only for reuse are the first to go when the live budget is short.
    for (std::size_t other = 0; other < modules_.size() && live_elements_ + module_size(m) > limit;
         ++other) {
      ModuleInfo& o = modules_[other];
      if (o.sharded && o.users == 0 && o.residency != ModuleResidency::kReleased) {
        free_module(static_cast<ModuleId>(other));
      }
    }
    ZEROSHARD_CHECK_USAGE(live_elements_ + module_size(m) <= limit,
                          "gathering module '"
                              << m.name << "' (" << module_size(m) << " elements) would hold "
                              << live_elements_ + module_size(m)
                              << " gathered elements, more than "
                                 "zero_optimization.stage3_max_live_parameters = "
                              << limit << ": release modules after use or raise the limit");
    start_gather(module);
  }
  if (m.residency == ModuleResidency::kInFlight) finish_gather(module);
  if (trace_valid_) prefetch_after(trace_position_);
  poll_transfers();
}

void EngineState::start_gather(ModuleId module) {
  ModuleInfo& m = modules_[module];
  const auto start = std::chrono::steady_clock::now();
  m.gathered = allocate(MemoryCategory::kParameters, module_size(m) * dsize_);
  const std::int64_t lo = std::max(m.flat_begin, layout_.shard_begin(rank_));
  const std::int64_t hi = std::min(m.flat_end, layout_.shard_end(rank_));
  if (hi > lo) {
    backend_->copy(m.gathered.as<char>() + (lo - m.flat_begin) * dsize_, model_param_at(lo),
                   (hi - lo) * dsize_);
  }
  const auto counts = layout_.rank_counts(m.flat_begin, m.flat_end);
  m.pending = comm_->all_gather_async(m.gathered.data(), counts, dtype_);
  m.residency = ModuleResidency::kInFlight;
  live_elements_ += module_size(m);
  gather_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void EngineState::finish_gather(ModuleId module) {
  ModuleInfo& m = modules_[module];
  const auto start = std::chrono::steady_clock::now();
  m.pending.wait();
  m.residency = ModuleResidency::kAvailable;
  gather_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void EngineState::free_module(ModuleId module) {
  ModuleInfo& m = modules_[module];
  if (m.residency == ModuleResidency::kInFlight) m.pending.wait();
  m.gathered.reset();
  m.residency = ModuleResidency::kReleased;
  live_elements_ -= module_size(m);
}

void EngineState::prefetch_after(std::size_t trace_index) {
  std::int64_t budget = config_.zero_optimization.prefetch_bucket_size;
  const std::int64_t limit = config_.zero_optimization.max_live_parameters;
  for (std::size_t i = trace_index; i < trace_.size(); ++i) {
    ModuleInfo& m = modules_[trace_[i]];
    if (!m.sharded || m.users > 0) continue;
    const std::int64_t size = module_size(m);
    if (size > budget) return;
    budget -= size;
    if (m.residency != ModuleResidency::kReleased) continue;  // already on its way
    if (live_elements_ + size > limit) return;
    start_gather(trace_[i]);
  }
}

bool EngineState::reused_soon(ModuleId module) const {
  if (!trace_valid_) return false;
  // DeepSpeed's rule: walk the upcoming modules, counting their elements, until
  // stage3_max_reuse_distance is reached; a module met on the way is kept.
  const std::int64_t distance = config_.zero_optimization.max_reuse_distance;
  std::int64_t traversed = 0;
  for (std::size_t i = trace_position_; i < trace_.size(); ++i) {
    if (traversed >= distance) return false;
    if (trace_[i] == module) return true;
    traversed += module_size(modules_[trace_[i]]);
  }
  return false;
}

void EngineState::release(ModuleId module) {
  ZEROSHARD_CHECK_USAGE(module >= 0 && module < static_cast<ModuleId>(modules_.size()),
                        "release(" << module << "): no such module");
  if (stage_ != 3) return;
  ModuleInfo& m = modules_[module];
  ZEROSHARD_CHECK_USAGE(m.users > 0, "release('" << m.name << "') without a matching gather()");
  if (--m.users > 0 || !m.sharded) return;
  if (!reused_soon(module)) free_module(module);
}

void EngineState::release_all_after_step() {
  for (std::size_t i = 0; i < modules_.size(); ++i) {
    ModuleInfo& m = modules_[i];
    ZEROSHARD_CHECK_USAGE(m.users == 0, "step() while module '"
                                            << m.name
                                            << "' is still gathered: release every module "
                                               "(or end every GatheredModule) before step()");
    // The update changes the shards, so a kept copy would be stale.
    if (m.sharded && m.residency != ModuleResidency::kReleased) {
      free_module(static_cast<ModuleId>(i));
    }
  }
  if (!recording_.empty()) {
    trace_ = std::move(recording_);
    recording_.clear();
    trace_valid_ = true;
  }
  trace_position_ = 0;
}

void EngineState::refresh_persistent_params() {
  std::vector<Request> requests;
  for (ParamInfo& p : params_) {
    if (!p.persistent) continue;
    const std::int64_t lo = layout_.offset(p.tensor);
    const std::int64_t hi = lo + p.numel;
    const std::int64_t a = std::max(lo, layout_.shard_begin(rank_));
    const std::int64_t b = std::min(hi, layout_.shard_end(rank_));
    if (b > a) {
      backend_->copy(p.persistent_copy.as<char>() + (a - lo) * dsize_, model_param_at(a),
                     (b - a) * dsize_);
    }
    requests.push_back(
        comm_->all_gather_async(p.persistent_copy.data(), layout_.rank_counts(lo, hi), dtype_));
  }
  for (Request& r : requests) r.wait();
}

}  // namespace zeroshard::detail
