// One optimizer step: finish the gradient reductions, unscale and average, agree on overflow and
// the global gradient norm across ranks, clip, run the update rule on this rank's shard, and
// redistribute the updated parameters as the stage requires.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "check.h"
#include "engine_state.h"
#include "half_conversion.h"

namespace zeroshard::detail {

namespace {

struct GradScan {
  double sum_of_squares = 0.0;
  std::int64_t nonfinite = 0;
  int first_nonfinite_param = -1;
};

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
  const std::int64_t chunk = scratch_.empty() ? 0 : scratch_.bytes() / sizeof(float);

  // Pass 1 only inspects the gradients: the norm needs every rank's part before the clip
  // coefficient is known, and pass 2 then unscales and clips with one fp32 factor, one rounding,
  // whatever the gradients' type. 16-bit gradients are widened chunk by chunk in both passes, so
  // the shard is never held twice in fp32.
  GradScan scan;
  for (const TensorPiece& piece : pieces) {
    const int param = tensor_param_[piece.tensor];
    const std::int64_t before = scan.nonfinite;
    if (grad_dtype == DType::kFloat32) {
      const float* g = reinterpret_cast<const float*>(grad_at(piece.flat_offset));
      double squares = 0.0;
      std::int64_t bad = 0;
#pragma omp simd reduction(+ : squares, bad)
      for (std::int64_t i = 0; i < piece.size; ++i) {
        const double v = g[i] * unscale;
        bad += std::isfinite(v) ? 0 : 1;
        squares += v * v;
      }
      scan.sum_of_squares += squares;
      scan.nonfinite += bad;
    } else {
      float* w = scratch_.as<float>();
      for (std::int64_t done = 0; done < piece.size; done += chunk) {
        const std::int64_t n = std::min(chunk, piece.size - done);
        convert_to_float(grad_at(piece.flat_offset + done), grad_dtype, w, n);
        for (std::int64_t i = 0; i < n; ++i) {
          const double v = w[i] * unscale;
          scan.nonfinite += std::isfinite(v) ? 0 : 1;
          scan.sum_of_squares += v * v;
        }
      }
    }
    if (scan.nonfinite > before && scan.first_nonfinite_param < 0) {
      scan.first_nonfinite_param = param;
    }
  }
  // Stage 0 holds identical whole gradients on every rank; the other stages sum their shards.
  std::int64_t nonfinite_total = scan.nonfinite;
  double squares_total = scan.sum_of_squares;
  if (stage_ != 0) {
    float partial[2] = {static_cast<float>(scan.sum_of_squares),
                        static_cast<float>(scan.nonfinite)};
    comm_->all_reduce(partial, 2, DType::kFloat32, ReduceOp::kSum);
    squares_total = partial[0];
    nonfinite_total = partial[1] != 0.0f || !std::isfinite(partial[0]) ? 1 : 0;
  }
  // bf16 with check_grad_overflow off trusts the gradients, as DeepSpeed's BF16 optimizer does.
  const bool check = dtype_ != DType::kBFloat16 || config_.bf16.check_grad_overflow;
  if (nonfinite_total > 0 && check) {
    zero_grad();
    if (dtype_ == DType::kFloat16) {
      result.skipped = true;
      on_overflow();
      return result;
    }
    // Every rank names the same parameter: the first one, in registration order, that holds a
    // non-finite value in some rank's shard. A float carries the index exactly below 2^24
    // parameters; this extra all-reduce runs only on the way to the error.
    int culprit = scan.first_nonfinite_param;
    if (stage_ != 0) {
      const auto count = static_cast<float>(params_.size());
      float key = culprit >= 0 ? count - static_cast<float>(culprit) : 0.0f;
      comm_->all_reduce(&key, 1, DType::kFloat32, ReduceOp::kMax);
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
        std::printf("[zeroshard] %s: update skipped on every rank\n", os.str().c_str());
        std::fflush(stdout);
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

  // Pass 2: the update rule on every tensor piece this rank owns.
  const ScheduledValues schedule = scheduled();
  const double base_lr = schedule.lr;
  const double default_lr = rule_->default_lr();
  std::vector<float*> state_pointers(states_.size());
  auto apply = [&](const TensorPiece& piece, std::int64_t offset, std::int64_t size,
                   const float* grad) {
    const ParamInfo& p = params_[tensor_param_[piece.tensor]];
    const ParamGroupOptions& group = groups_[p.group].options;
    StepContext context;
    context.step = global_step_ + 1;
    context.lr =
        group.lr ? (default_lr > 0.0 ? *group.lr * base_lr / default_lr : *group.lr) : base_lr;
    context.weight_decay = group.weight_decay.value_or(rule_->default_weight_decay());
    context.momentum = schedule.momentum;
    const std::int64_t flat = piece.flat_offset + offset;
    for (std::size_t s = 0; s < states_.size(); ++s) {
      state_pointers[s] = state_at(static_cast<int>(s), flat);
    }
    ShardSlice slice;
    slice.param_name = p.name;
    slice.param_numel = p.numel;
    slice.offset_in_param = piece.offset_in_tensor + offset;
    slice.size = size;
    slice.param = master_at(flat);
    slice.grad = grad;
    slice.states = state_pointers;
    rule_->apply(slice, context);
  };
  const float factor = static_cast<float>(unscale * clip);
  for (const TensorPiece& piece : pieces) {
    if (grad_dtype == DType::kFloat32) {
      float* g = reinterpret_cast<float*>(grad_at(piece.flat_offset));
      if (factor != 1.0f) {
#pragma omp simd
        for (std::int64_t i = 0; i < piece.size; ++i) g[i] *= factor;
      }
      // The rule runs in tiles of sub_group_size elements, as DeepSpeed's step does.
      const std::int64_t tile = config_.zero_optimization.sub_group_size;
      for (std::int64_t done = 0; done < piece.size; done += tile) {
        apply(piece, done, std::min(tile, piece.size - done), g + done);
      }
    } else {
      float* w = scratch_.as<float>();
      for (std::int64_t done = 0; done < piece.size; done += chunk) {
        const std::int64_t n = std::min(chunk, piece.size - done);
        convert_to_float(grad_at(piece.flat_offset + done), grad_dtype, w, n);
        for (std::int64_t i = 0; i < n; ++i) w[i] *= factor;
        apply(piece, done, n, w);
      }
    }
  }
  if (dtype_ != DType::kFloat32) {
    // The model sees the rounded copy of the fp32 master weights it owns.
    for (const TensorPiece& piece : pieces) {
      convert_from_float(master_at(piece.flat_offset), model_param_at(piece.flat_offset), dtype_,
                         piece.size);
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
    std::printf(
        "[zeroshard] OVERFLOW at step %lld: update skipped on every rank, loss scale now "
        "%g\n",
        static_cast<long long>(global_step_ + 1), loss_scale());
    std::fflush(stdout);
  }
}

void EngineState::on_clean_step() {
  if (!scaler_) return;
  scaler_->update(false);
}

void EngineState::zero_grad() {
  require_finalized();
  if (!grads_full_.empty()) std::memset(grads_full_.data(), 0, grads_full_.bytes());
  if (!grad_shard_.empty()) std::memset(grad_shard_.data(), 0, grad_shard_.bytes());
}

void EngineState::print_progress(const StepResult& result) {
  const std::int64_t every = config_.steps_per_print;
  if (rank_ != 0 || every <= 0 || global_step_ % every != 0) return;
  std::ostringstream os;
  os << "[zeroshard] step " << global_step_ << " | lr " << result.lr << " | grad_norm "
     << result.grad_norm;
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
    os << " | model states " << report.model_state_bytes() / 1048576.0 << " MiB, communication "
       << report.at(MemoryCategory::kCommunication).current / 1048576.0 << " MiB, peak total "
       << report.total_peak[0] / 1048576.0 << " MiB";
  }
  std::printf("%s\n", os.str().c_str());
  std::fflush(stdout);
}

}  // namespace zeroshard::detail
