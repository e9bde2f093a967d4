// Gradient buckets: contiguous ranges of the flat gradient buffer, reduced in a fixed order
// (last registered parameters first, as backward produces them) so that every rank issues the
// same collectives in the same order whatever order its gradients arrive in.
#include <algorithm>
#include <chrono>

#include "engine/engine_state.h"
#include "util/check.h"

namespace zeroshard::detail {

namespace {

// More reductions in flight than this wait for the oldest: it bounds the communication buffers
// at two buckets (one being reduced while the next fills) as DeepSpeed's double buffering does.
constexpr std::size_t kMaxInFlight = 2;

}  // namespace

double EngineState::pre_reduction_factor() const {
  // DeepSpeed's allreduce_bucket: prescale_gradients divides by the world size before the
  // reduction; otherwise gradient_predivide_factor is divided out before and the rest after.
  return config_.prescale_gradients ? 1.0 / world_ : 1.0 / config_.gradient_predivide_factor;
}

double EngineState::post_reduction_factor() const {
  return config_.prescale_gradients ? 1.0 : config_.gradient_predivide_factor / world_;
}

void EngineState::plan_buckets() {
  const std::int64_t limit = config_.zero_optimization.reduce_bucket_size;
  // Buckets tile [0, padded_total) from the top; each closes before it would exceed the limit,
  // and a tensor larger than the limit forms a bucket of its own.
  Bucket current;
  current.end = layout_.padded_total();
  for (int t = layout_.tensor_count() - 1; t >= 0; --t) {
    if (!current.params.empty() && current.end - layout_.offset(t) > limit) {
      current.begin = layout_.offset(params_[current.params.back()].tensor);
      const std::int64_t next_end = current.begin;
      buckets_.push_back(std::move(current));
      current = Bucket{};
      current.end = next_end;
    }
    current.params.push_back(tensor_param_[t]);
  }
  current.begin = 0;
  buckets_.push_back(std::move(current));
  std::int64_t widest = 0;
  std::int64_t widest_recv = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (int index : buckets_[b].params) params_[index].bucket = static_cast<int>(b);
    widest = std::max(widest, buckets_[b].end - buckets_[b].begin);
    const auto counts = layout_.rank_counts(buckets_[b].begin, buckets_[b].end);
    widest_recv = std::max(widest_recv, counts[rank_]);
  }
  if (stage_ >= 2) slot_input_elements_ = widest;
  if (comm_dtype_ != dtype_) slot_send_elements_ = widest;
  if (stage_ >= 1 && config_.zero_optimization.reduce_scatter) slot_recv_elements_ = widest_recv;
}

// The input area holds a multiple of 16 elements (buckets start and end on tensor boundaries), so
// the fp32 areas after it stay 4-byte aligned.
char* EngineState::slot_send(int slot) {
  return slots_[slot].buffer.as<char>() + slot_input_elements_ * dsize_;
}

char* EngineState::slot_recv(int slot) {
  return slot_send(slot) + slot_send_elements_ * sizeof(float);
}

int EngineState::acquire_slot() {
  for (;;) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s].busy) {
        slots_[s].busy = true;
        backend_->zero(slots_[s].buffer.data(), slots_[s].buffer.bytes());
        return static_cast<int>(s);
      }
    }
    if (in_flight_.empty()) break;
    complete_oldest();
  }
  const std::int64_t bytes = slot_input_elements_ * dsize_ + slot_send_elements_ * sizeof(float) +
                             slot_recv_elements_ * size_of(comm_dtype_);
  slots_.push_back({allocate(MemoryCategory::kCommunication, bytes), true});
  return static_cast<int>(slots_.size()) - 1;
}

void* EngineState::bucket_grad_pointer(int index) {
  const ParamInfo& p = params_[index];
  Bucket& bucket = buckets_[p.bucket];
  if (bucket.slot < 0) bucket.slot = acquire_slot();
  return slots_[bucket.slot].buffer.as<char>() + (layout_.offset(p.tensor) - bucket.begin) * dsize_;
}

void EngineState::mark_grad_ready(int index) {
  require_finalized();
  ParamInfo& p = params_[index];
  ZEROSHARD_CHECK_USAGE(p.trainable, "grad_ready('" << p.name << "'): the parameter is frozen");
  ZEROSHARD_CHECK_USAGE(!p.grad_ready,
                        "grad_ready('" << p.name << "') called twice in one micro-step");
  p.grad_ready = true;
  ++buckets_[p.bucket].ready;
  launch_ready_buckets();
  poll_transfers();
}

void EngineState::poll_transfers() {
  for (int b : in_flight_) buckets_[b].request.test();
  for (ModuleInfo& m : modules_) {
    if (m.residency == ModuleResidency::kInFlight) m.pending.test();
  }
}

void EngineState::launch_ready_buckets() {
  // Stages 0-1 keep whole gradients and reduce once per accumulation window, at its boundary.
  const bool boundary = micro_step_ + 1 >= config_.gradient_accumulation_steps;
  if (stage_ <= 1 && !boundary) return;
  while (next_launch_ < buckets_.size()) {
    Bucket& bucket = buckets_[next_launch_];
    if (bucket.ready < static_cast<int>(bucket.params.size())) return;
    launch(static_cast<int>(next_launch_++));
  }
}

void EngineState::launch_all_buckets() {
  const bool boundary = micro_step_ + 1 >= config_.gradient_accumulation_steps;
  if (stage_ <= 1 && !boundary) return;
  while (next_launch_ < buckets_.size()) launch(static_cast<int>(next_launch_++));
}

void EngineState::launch(int b) {
  Bucket& bucket = buckets_[b];
  while (in_flight_.size() >= kMaxInFlight) complete_oldest();
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t length = bucket.end - bucket.begin;
  const bool scatter = stage_ >= 1 && config_.zero_optimization.reduce_scatter;
  void* input = nullptr;
  if (stage_ <= 1) {
    input = grads_full_.as<char>() + bucket.begin * dsize_;
  } else {
    if (bucket.slot < 0) bucket.slot = acquire_slot();
    input = slots_[bucket.slot].buffer.data();
  }
  if (comm_dtype_ != dtype_) {
    // communication_data_type fp32: the 16-bit gradients travel widened, so the reduction adds
    // in fp32 and the sum is rounded at most once, when it is stored.
    if (bucket.slot < 0) bucket.slot = acquire_slot();
    float* send = reinterpret_cast<float*>(slot_send(bucket.slot));
    backend_->widen(input, dtype_, send, length, 1.0f);
    input = send;
  }
  // After the widening, as DeepSpeed divides the tensor already cast to the communication type.
  if (const double factor = pre_reduction_factor(); factor != 1.0) {
    backend_->scale(input, comm_dtype_, length, static_cast<float>(factor));
  }
  if (scatter) {
    if (bucket.slot < 0) bucket.slot = acquire_slot();
    const auto counts = layout_.rank_counts(bucket.begin, bucket.end);
    bucket.request = comm_->reduce_scatter_async(input, slot_recv(bucket.slot), counts, comm_dtype_,
                                                 ReduceOp::kSum);
  } else {
    bucket.request = comm_->all_reduce_async(input, length, comm_dtype_, ReduceOp::kSum);
  }
  in_flight_.push_back(b);
  reduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Without overlap_comm each reduction finishes before backward goes on (DeepSpeed's meaning).
  if (!config_.zero_optimization.overlap_comm) complete_oldest();
}

void EngineState::complete_oldest() {
  const int b = in_flight_.front();
  in_flight_.pop_front();
  Bucket& bucket = buckets_[b];
  const auto start = std::chrono::steady_clock::now();
  bucket.request.wait();
  reduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool widened = comm_dtype_ != dtype_;
  const bool scatter = stage_ >= 1 && config_.zero_optimization.reduce_scatter;
  // Stage 0 keeps the whole reduced gradients in grads_full_: a sum reduced in fp32 is stored
  // back rounded, once.
  if (stage_ == 0 && widened) {
    backend_->narrow(reinterpret_cast<const float*>(slot_send(bucket.slot)),
                     grads_full_.as<char>() + bucket.begin * dsize_, dtype_,
                     bucket.end - bucket.begin);
  }
  const std::int64_t shard_lo = layout_.shard_begin(rank_);
  const std::int64_t lo = std::max(bucket.begin, shard_lo);
  const std::int64_t hi = std::min(bucket.end, layout_.shard_end(rank_));
  if (stage_ >= 1 && hi > lo) {
    // This rank's part of the sum: the receive area, or its slice of what was all-reduced.
    const char* reduced = nullptr;
    if (scatter) {
      reduced = slot_recv(bucket.slot);
    } else if (widened) {
      reduced = slot_send(bucket.slot) + (lo - bucket.begin) * sizeof(float);
    } else if (stage_ == 1) {
      reduced = grads_full_.as<char>() + lo * dsize_;
    } else {
      reduced = slots_[bucket.slot].buffer.as<char>() + (lo - bucket.begin) * dsize_;
    }
    if (stage_ == 1) {
      char* dst = grads_full_.as<char>() + lo * dsize_;
      if (widened) {
        backend_->narrow(reinterpret_cast<const float*>(reduced), dst, dtype_, hi - lo);
      } else if (scatter) {
        backend_->copy(dst, reduced, (hi - lo) * dsize_);
      }
    } else {
      void* dst = grad_shard_.as<char>() + (lo - shard_lo) * size_of(grad_shard_dtype_);
      backend_->accumulate(dst, grad_shard_dtype_, reduced, comm_dtype_, hi - lo);
    }
  }
  if (bucket.slot >= 0) {
    slots_[bucket.slot].busy = false;
    bucket.slot = -1;
  }
}

void EngineState::finish_reductions() {
  launch_all_buckets();
  while (!in_flight_.empty()) complete_oldest();
}

}  // namespace zeroshard::detail
