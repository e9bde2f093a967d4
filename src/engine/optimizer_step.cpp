// One optimizer step: finish the gradient reductions, unscale and average, agree on overflow and
// the global gradient norm across ranks, clip, run the update rule on this rank's shard, and
// redistribute the updated parameters as the stage requires.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "engine/engine_state.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::detail {

namespace {

// DeepSpeed's clip coefficient: max_norm / (norm + 1e-6), applied only when below 1.
constexpr double kClipEpsilon = 1e-6;

}  // namespace

StepResult EngineState::step() {
  require_finalized();
  finish_reductions();
  for (ParamInfo& p : params_) p.grad_ready = false;
  for (Bucket& b : buckets_) b.ready = 0;
  next_launch_ = 0;
  StepResult result;
  result.lr = current_lr();
  if (micro_step_ + 1 < config_.gradient_accumulation_steps) {
    ++micro_step_;
    return result;
  }
  micro_step_ = 0;
  if (stage_ == 3) release_all_after_step();

  const auto update_start = std::chrono::steady_clock::now();
  const std::int64_t lo = update_begin();
  const std::int64_t hi = update_end();
  const std::vector<TensorPiece> pieces = layout_.pieces(lo, hi);
  const bool full_grads = stage_ <= 1;
  const DType grad_dtype = full_grads ? dtype_ : grad_shard_dtype_;
  const std::size_t grad_size = size_of(grad_dtype);
  auto grad_at = [&](std::int64_t flat) -> char* {
    return full_grads ? grads_full_.as<char>() + flat * grad_size
                      : grad_shard_.as<char>() + (flat - layout_.shard_begin(rank_)) * grad_size;
  };
  // Gradients arrive summed over ranks and micro-steps and multiplied by the loss scale.
  const double unscale = post_reduction_factor() /
                         (static_cast<double>(config_.gradient_accumulation_steps) * loss_scale());

  // Pass 1 only inspects the gradients: the norm needs every rank's part before the clip
  // coefficient is known, and pass 2 then unscales and clips with one fp32 factor, one rounding,
  // whatever the gradients' type. The owned range is contiguous (padding between tensors stays
  // zero), so it is one scan.
  const GradientScan scan = backend_->scan(grad_at(lo), grad_dtype, hi - lo);
  // Stage 0 holds identical whole gradients on every rank; the other stages sum their shards.
  bool nonfinite = scan.nonfinite;
  double squares_total = scan.sum_of_squares * unscale * unscale;
  if (stage_ != 0) {
    float partial[2] = {static_cast<float>(squares_total), scan.nonfinite ? 1.0f : 0.0f};
    all_reduce_host(partial, 2, ReduceOp::kSum);
    squares_total = partial[0];
    nonfinite = partial[1] != 0.0f || !std::isfinite(partial[0]);
  } else {
    nonfinite = nonfinite || !std::isfinite(squares_total);
  }
  // bf16 with check_grad_overflow off trusts the gradients, as DeepSpeed's BF16 optimizer does.
  const bool check = dtype_ != DType::kBFloat16 || config_.bf16.check_grad_overflow;
  if (nonfinite && check) {
    if (dtype_ == DType::kFloat16) {
      zero_grad();
      result.skipped = true;
      on_overflow();
      return result;
    }
    // Every rank names the same parameter: the first one, in registration order, that holds a
    // non-finite value in some rank's shard. A float carries the index exactly below 2^24
    // parameters; the per-tensor scans and this extra all-reduce run only on the way to the
    // error.
    int culprit = -1;
    for (const TensorPiece& piece : pieces) {
      if (backend_->scan(grad_at(piece.flat_offset), grad_dtype, piece.size).nonfinite) {
        culprit = tensor_param_[piece.tensor];
        break;
      }
    }
    zero_grad();
    if (stage_ != 0) {
      const auto count = static_cast<float>(params_.size());
      float key = culprit >= 0 ? count - static_cast<float>(culprit) : 0.0f;
      all_reduce_host(&key, 1, ReduceOp::kMax);
      culprit = key > 0.0f ? static_cast<int>(count - key) : -1;
    }
    std::ostringstream os;
    os << "non-finite gradient (inf or NaN) ";
    if (culprit >= 0) {
      os << "in parameter '" << params_[culprit].name << "'";
    } else {
      os << "(the sum of squares of the gradients overflowed fp32)";
    }
    // The check runs after the reduction, so any rank's backward may have produced the value.
    os << " at step " << global_step_ + 1 << " (found after summing the ranks' gradients)";
    if (dtype_ == DType::kBFloat16) {
      // DeepSpeed's BF16 optimizer with check_grad_overflow skips such a step; there is no loss
      // scale to lower, so it only says so.
      if (rank_ == 0) {
        ZEROSHARD_LOG(kProgress, os.str() << ": update skipped on every rank");
      }
      result.skipped = true;
      return result;
    }
    os << "; the update was not applied (parameters and optimizer states are unchanged). Check "
          "the model's backward and the learning rate, or train with fp16 dynamic loss scaling "
          "or bf16 to skip such steps";
    throw UsageError(os.str());
  }
  const double norm = std::sqrt(squares_total);
  last_grad_norm_ = norm;
  result.grad_norm = norm;
  double clip = 1.0;
  if (config_.gradient_clipping > 0.0) {
    const double coefficient = config_.gradient_clipping / (norm + kClipEpsilon);
    if (coefficient < 1.0) clip = coefficient;
  }

  // Pass 2: the update rule over runs of the owned range. A run is one tensor piece, or on a
  // backend with fused kernels every consecutive piece of one parameter group (the zero padding
  // between them stays zero under every rule), so a step is one launch per group.
  struct Run {
    std::int64_t begin;
    std::int64_t end;
    int first_param;
    std::int64_t offset_in_param;
  };
  std::vector<Run> runs;
  for (const TensorPiece& piece : pieces) {
    const int param = tensor_param_[piece.tensor];
    if (backend_->fuses_tensors() && !runs.empty() &&
        params_[runs.back().first_param].group == params_[param].group) {
      runs.back().end = piece.flat_offset + piece.size;
    } else {
      runs.push_back(
          {piece.flat_offset, piece.flat_offset + piece.size, param, piece.offset_in_tensor});
    }
  }
  const ScheduledValues schedule = scheduled();
  const double base_lr = schedule.lr;
  const double default_lr = rule_->default_lr();
  std::vector<float*> state_pointers(states_.size());
  auto apply = [&](const Run& run, std::int64_t offset, std::int64_t size, const float* grad) {
    const ParamInfo& p = params_[run.first_param];
    const ParamGroupOptions& group = groups_[p.group].options;
    StepContext context;
    context.step = global_step_ + 1;
    context.lr =
        group.lr ? (default_lr > 0.0 ? *group.lr * base_lr / default_lr : *group.lr) : base_lr;
    context.weight_decay = group.weight_decay.value_or(rule_->default_weight_decay());
    context.momentum = schedule.momentum;
    const std::int64_t flat = run.begin + offset;
    for (std::size_t s = 0; s < states_.size(); ++s) {
      state_pointers[s] = state_at(static_cast<int>(s), flat);
    }
    ShardSlice slice;
    slice.param_name = p.name;
    slice.param_numel = p.numel;
    slice.offset_in_param = run.offset_in_param + offset;
    slice.size = size;
    slice.param = master_at(flat);
    slice.grad = grad;
    slice.states = state_pointers;
    backend_->apply_rule(slice, context);
  };
  const float factor = static_cast<float>(unscale * clip);
  for (const Run& run : runs) {
    const std::int64_t length = run.end - run.begin;
    if (grad_dtype == DType::kFloat32) {
      float* g = reinterpret_cast<float*>(grad_at(run.begin));
      if (factor != 1.0f) backend_->widen(g, DType::kFloat32, g, length, factor);
      // The rule runs in tiles of sub_group_size elements, as DeepSpeed's step does.
      const std::int64_t tile = config_.zero_optimization.sub_group_size;
      for (std::int64_t done = 0; done < length; done += tile) {
        apply(run, done, std::min(tile, length - done), g + done);
      }
    } else {
      float* w = scratch_.as<float>();
      const std::int64_t chunk = static_cast<std::int64_t>(scratch_.bytes() / sizeof(float));
      for (std::int64_t done = 0; done < length; done += chunk) {
        const std::int64_t n = std::min(chunk, length - done);
        backend_->widen(grad_at(run.begin + done), grad_dtype, w, n, factor);
        apply(run, done, n, w);
      }
    }
    // The model sees the rounded copy of the fp32 master weights it owns.
    if (dtype_ != DType::kFloat32) {
      backend_->narrow(master_at(run.begin), model_param_at(run.begin), dtype_, length);
    }
  }
  const auto gather_start = std::chrono::steady_clock::now();
  update_seconds_ += std::chrono::duration<double>(gather_start - update_start).count();
  if (stage_ == 1 || stage_ == 2) all_gather_parameters();
  if (stage_ == 3) refresh_persistent_params();
  gather_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - gather_start).count();
  zero_grad();
  ++global_step_;
  on_clean_step();
  result.updated = true;
  print_progress(result);
  return result;
}

void EngineState::all_gather_parameters() {
  const std::int64_t chunk =
      std::max<std::int64_t>(config_.zero_optimization.allgather_bucket_size, layout_.world_size());
  const std::int64_t total = layout_.padded_total();
  std::vector<Request> requests;
  for (std::int64_t lo = 0; lo < total; lo += chunk) {
    const std::int64_t hi = std::min(total, lo + chunk);
    if (config_.zero_optimization.allgather_partitions) {
      requests.push_back(comm_->all_gather_async(params_full_.as<char>() + lo * dsize_,
                                                 layout_.rank_counts(lo, hi), dtype_));
    } else {
      // DeepSpeed's allgather_partitions=false: each owner broadcasts its part instead.
      const auto counts = layout_.rank_counts(lo, hi);
      std::int64_t offset = lo;
      for (int r = 0; r < world_; ++r) {
        if (counts[r] > 0) {
          requests.push_back(comm_->broadcast_async(params_full_.as<char>() + offset * dsize_,
                                                    counts[r], dtype_, r));
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

void EngineState::on_overflow() {
  scaler_->update(true);
  if (rank_ == 0) {
    ZEROSHARD_LOG(kProgress, "OVERFLOW at step "
                                 << global_step_ + 1
                                 << ": update skipped on every rank, loss scale now "
                                 << loss_scale());
  }
}

void EngineState::on_clean_step() {
  if (!scaler_) return;
  scaler_->update(false);
}

void EngineState::zero_grad() {
  require_finalized();
  backend_->zero(grads_full_.data(), grads_full_.bytes());
  backend_->zero(grad_shard_.data(), grad_shard_.bytes());
}

void EngineState::print_progress(const StepResult& result) {
  const std::int64_t every = config_.steps_per_print;
  if (rank_ != 0 || every <= 0 || global_step_ % every != 0) return;
  std::ostringstream os;
  os << "step " << global_step_ << " | lr " << result.lr << " | grad_norm " << result.grad_norm;
  if (dtype_ == DType::kFloat16) os << " | loss_scale " << loss_scale();
  if (config_.wall_clock_breakdown) {
    const double per_step = 1000.0 / static_cast<double>(every);
    os << " | reduce " << reduce_seconds_ * per_step << " ms | update "
       << update_seconds_ * per_step << " ms | gather " << gather_seconds_ * per_step
       << " ms (per step, averaged over " << every << ")";
    reduce_seconds_ = update_seconds_ = gather_seconds_ = 0.0;
  }
  if (config_.memory_breakdown) {
    const MemoryReport report = tracker_.report(rank_, world_);
    const MemoryLocation where = backend_->memory().location();
    os << " | model states " << report.model_state_bytes(where) / 1048576.0
       << " MiB, communication "
       << report.at(MemoryCategory::kCommunication, where).current / 1048576.0
       << " MiB, peak total " << report.total_peak[static_cast<int>(where)] / 1048576.0 << " MiB"
       << (where == MemoryLocation::kDevice ? " on the GPU" : "");
  }
  detail::log(LogLevel::kProgress, os.str());
}

}  // namespace zeroshard::detail
