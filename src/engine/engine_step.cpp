// One optimizer step: finish the gradient reductions, agree on overflow and the global gradient
// norm across ranks, fold unscaling, averaging and clipping into one gradient factor, run the
// optimizer shard's update, and spread the updated parameters as the stage requires.
#include <chrono>
#include <cmath>
#include <sstream>
#include <vector>

#include "engine/engine_state.h"
#include "monitor/comms_report.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::detail {

namespace {

// DeepSpeed's clip coefficient: max_norm / (norm + 1e-6), applied only when below 1.
constexpr double kClipEpsilon = 1e-6;

}  // namespace

void EngineState::begin_overlapped_update_if_due() {
  if (!optimizer_->overlaps_update() || !overlap_next_update_ ||
      optimizer_->overlapped_update_begun() ||
      micro_step_ + 1 < config_.gradient_accumulation_steps) {
    return;
  }
  // Speculative: clip 1, this step's learning rates and loss scale as they stand now. step()
  // keeps it only if they are what it finds.
  optimizer_->begin_overlapped_update(static_cast<float>(gradient_unscale()), step_contexts());
}

double EngineState::gradient_unscale() const {
  // Gradients arrive summed over ranks and micro-steps and multiplied by the loss scale.
  return bucketer_->post_reduction_factor() /
         (static_cast<double>(config_.gradient_accumulation_steps) * loss_scale());
}

StepResult EngineState::step() {
  require_finalized();
  bucketer_->finish(micro_step_);
  StepResult result;
  result.lr = current_lr();
  if (micro_step_ + 1 < config_.gradient_accumulation_steps) {
    ++micro_step_;
    return result;
  }
  micro_step_ = 0;
  coordinator_->release_all_after_step();

  const auto update_start = std::chrono::steady_clock::now();
  const GradientSummary gradients = scan_gradients();
  if (gradients.nonfinite && checks_nonfinite()) {
    result = skip_nonfinite_step(result);
    monitor_step(result);
    if (settles_offload_ratio_) settle_auto_offload_ratio();
    return result;
  }
  const double norm = std::sqrt(gradients.sum_of_squares);
  last_grad_norm_ = norm;
  result.grad_norm = norm;
  const double clip = clip_coefficient(norm);
  result.overlapped = run_update(static_cast<float>(gradients.unscale * clip), gradients.contexts);
  overlap_next_update_ = clip == 1.0;
  times_.update += seconds_since(update_start);
  refresh_parameters();
  clear_gradients_after_update();
  ++global_step_;
  on_clean_step();
  result.updated = true;
  monitor_step(result);
  print_progress(result);
  if (settles_offload_ratio_) settle_auto_offload_ratio();
  return result;
}

EngineState::GradientSummary EngineState::scan_gradients() {
  GradientSummary summary;
  summary.unscale = gradient_unscale();
  // Every stage scans this rank's shard and sums the ranks' parts: stage 0, which holds the whole
  // reduced gradients, then finds the norm stages 1-3 find, bit for bit. The norm needs every
  // rank's part before the clip coefficient is known, so this pass only inspects the gradients;
  // the update then applies unscale x clip as one fp32 factor as it reads them. The owned range
  // is contiguous (padding between tensors stays zero), so it is one scan.
  const auto scan_start = std::chrono::steady_clock::now();
  const GradientScan scan = optimizer_->scan(layout_.shard_begin(rank_), layout_.shard_end(rank_));
  times_.scan += seconds_since(scan_start);
  const auto norm_start = std::chrono::steady_clock::now();
  // After the scan, which lands the last parts of super_offload's update and reads the gradients
  // while its thread finishes them.
  try {
    optimizer_->finish_overlapped_update();
  } catch (...) {
    zero_grad();
    throw;
  }
  summary.contexts = step_contexts();
  // The sum that finds the norm also carries the digest of what every rank must step with.
  std::vector<float> partial(2 + step_agreement_floats());
  partial[0] = static_cast<float>(scan.sum_of_squares() * summary.unscale * summary.unscale);
  partial[1] = scan.nonfinite() ? 1.0f : 0.0f;
  pack_step_agreement(summary.contexts, partial.data() + 2);
  all_reduce_host(partial.data(), static_cast<int>(partial.size()), ReduceOp::kSum);
  times_.norm_wait += seconds_since(norm_start);
  check_step_agreement(summary.contexts, partial.data() + 2);
  summary.sum_of_squares = partial[0];
  summary.nonfinite = partial[1] != 0.0f || !std::isfinite(partial[0]);
  return summary;
}

bool EngineState::checks_nonfinite() const {
  // bf16 with check_grad_overflow off trusts the gradients, as DeepSpeed's BF16 optimizer does.
  return dtype_ != DType::kBFloat16 || config_.bf16.check_grad_overflow;
}

double EngineState::clip_coefficient(double norm) const {
  if (config_.gradient_clipping <= 0.0) return 1.0;
  const double coefficient = config_.gradient_clipping / (norm + kClipEpsilon);
  return coefficient < 1.0 ? coefficient : 1.0;
}

bool EngineState::run_update(float grad_factor, const GroupContexts& contexts) {
  optimizer_->leave_whole_gradients(bucketer_->leaves_full_grads());
  const auto rule_start = std::chrono::steady_clock::now();
  const bool kept = optimizer_->keep_overlapped_update(grad_factor, contexts);
  if (!kept) apply_update(grad_factor, contexts);
  times_.rule += seconds_since(rule_start);
  return kept;
}

void EngineState::refresh_parameters() {
  const auto gather_start = std::chrono::steady_clock::now();
  coordinator_->after_update();
  times_.gather += seconds_since(gather_start);
}

void EngineState::clear_gradients_after_update() {
  if (optimizer_->clears_whole_gradients()) {
    zero_grad(optimizer_->owned_begin(), optimizer_->owned_end());
  } else {
    zero_grad();
  }
}

StepResult EngineState::skip_nonfinite_step(StepResult result) {
  if (dtype_ == DType::kFloat16) {
    zero_grad();
    result.skipped = true;
    on_overflow();
    return result;
  }
  const int culprit = first_nonfinite_parameter();
  zero_grad();
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

int EngineState::first_nonfinite_parameter() {
  // Every rank names the same parameter: the first one, in registration order, that holds a
  // non-finite value in some rank's shard. A float carries the index exactly below 2^24
  // parameters; the per-tensor scans and this extra all-reduce run only on the way to the error.
  int culprit = -1;
  for (const TensorPiece& piece :
       layout_.pieces(layout_.shard_begin(rank_), layout_.shard_end(rank_))) {
    if (optimizer_->scan(piece.flat_offset, piece.flat_offset + piece.size).nonfinite()) {
      culprit = tensor_param_[piece.tensor];
      break;
    }
  }
  const auto count = static_cast<float>(params_.size());
  float key = culprit >= 0 ? count - static_cast<float>(culprit) : 0.0f;
  all_reduce_host(&key, 1, ReduceOp::kMax);
  return key > 0.0f ? static_cast<int>(count - key) : -1;
}

GroupContexts EngineState::step_contexts() const {
  const ScheduledValues schedule = scheduled();
  const double default_lr = rule_->default_lr();
  GroupContexts contexts;
  for (const GroupInfo& group : groups_) {
    const ParamGroupOptions& options = group.options;
    StepContext context;
    context.step = global_step_ + 1;
    context.lr = options.lr
                     ? (default_lr > 0.0 ? *options.lr * schedule.lr / default_lr : *options.lr)
                     : schedule.lr;
    context.weight_decay = options.weight_decay.value_or(rule_->default_weight_decay());
    context.momentum = schedule.momentum;
    contexts.push_back(context);
  }
  return contexts;
}

void EngineState::apply_update(float grad_factor, const GroupContexts& contexts) {
  if (!optimizer_->swaps()) {
    optimizer_->update(grad_factor, contexts);
    return;
  }
  // Swap files can fail part-way through a rank's update while the others finish theirs. Every
  // rank learns of it before the parameters are spread, and all go back to the step's start.
  const SwapTimes before = optimizer_->swap_times();
  std::exception_ptr failure;
  bool updating = false;
  try {
    // A parameter shard on NVMe writes its cache back first: if that fails, this rank's update
    // has not begun and nothing of it is undone below.
    coordinator_->begin_update();
    updating = true;
    optimizer_->update(grad_factor, contexts);
    coordinator_->flush_update();
  } catch (...) {
    failure = std::current_exception();
  }
  const SwapTimes after = optimizer_->swap_times();
  times_.swap_read_wait += after.read_wait - before.read_wait;
  times_.swap_write_wait += after.write_wait - before.write_wait;
  float failed = failure ? 1.0f : 0.0f;
  all_reduce_host(&failed, 1, ReduceOp::kMax);
  if (failed == 0.0f) return;
  const std::string first = failure_on_any_rank(failure);
  coordinator_->roll_back_update();
  // Going back reads the records current before the step. The step did not read those of the
  // sub-groups the step before left in the buffers, so damage to them on disk shows only here.
  std::exception_ptr lost;
  try {
    if (updating) optimizer_->roll_back_update();
  } catch (...) {
    lost = std::current_exception();
  }
  const std::string unrestored = failure_on_any_rank(lost);
  zero_grad();
  const std::string step_failed =
      "step " + std::to_string(global_step_ + 1) + " failed on " + first;
  if (!unrestored.empty()) {
    throw IoError(step_failed + "; going back to the step's start failed too, on " + unrestored +
                  ": that rank's master weights and optimizer states before the step are lost "
                  "and its parameters may hold part of the update: load the last checkpoint");
  }
  throw IoError(step_failed +
                "; the update was not applied on any rank (parameters and optimizer states are "
                "as before the step, this window's gradients are dropped): fix the cause and go "
                "on training, or load the last checkpoint");
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

void EngineState::zero_grad(std::int64_t cleared_begin, std::int64_t cleared_end) {
  require_finalized();
  bucketer_->zero_full_grads(cleared_begin, cleared_end);
  optimizer_->zero_gradients();
}

void EngineState::print_progress(const StepResult& result) {
  const std::int64_t every = config_.steps_per_print;
  if (rank_ != 0 || every <= 0 || global_step_ % every != 0) return;
  std::ostringstream os;
  os << "step " << global_step_ << " | lr " << result.lr << " | grad_norm " << result.grad_norm;
  if (dtype_ == DType::kFloat16) os << " | loss_scale " << loss_scale();
  if (config_.wall_clock_breakdown) {
    const double per_step = 1000.0 / static_cast<double>(every);
    // The update's parts after the gathers: scripts/gpu-check.sh reads "update X ms | gather".
    os << " | reduce " << times_.reduce * per_step << " ms | update " << times_.update * per_step
       << " ms | gather " << times_.gather * per_step << " ms | update = scan "
       << times_.scan * per_step << " ms + norm waits " << times_.norm_wait * per_step
       << " ms + rule " << times_.rule * per_step << " ms";
    if (optimizer_->offloaded()) {
      os << " | host-device copy wait " << times_.copy_wait * per_step
         << " ms (of backward and the update) | scan as gradients landed "
         << times_.landed_scan * per_step << " ms, "
         << static_cast<double>(times_.landed_tiles) / static_cast<double>(every) << " tiles of "
         << cpu_optimizer::kSquareTile << " a step";
    }
    if (optimizer_->swaps()) {
      os << " | NVMe read wait " << times_.swap_read_wait * per_step << " ms, write wait "
         << times_.swap_write_wait * per_step << " ms (of the update)";
    }
    os << " (per step, averaged over " << every << ")";
    times_ = StepTimes{};
    monitored_times_ = StepTimes{};
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
  if (config_.comms_logger.enabled) {
    const std::vector<CollectiveTiming> now = comm_->timings();
    detail::log(LogLevel::kProgress, "comms_logger, steps " +
                                         std::to_string(global_step_ - every + 1) + "-" +
                                         std::to_string(global_step_) + ":\n" +
                                         comms_table(timings_since(printed_timings_, now), world_));
    printed_timings_ = now;
  }
}

}  // namespace zeroshard::detail
