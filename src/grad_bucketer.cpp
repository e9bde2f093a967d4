// Gradient buckets: contiguous ranges of the flat gradient buffer, reduced in a fixed order
// (last registered parameters first, as backward produces them) so that every rank issues the
// same collectives in the same order whatever order its gradients arrive in.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "check.h"
#include "engine_state.h"
#include "half_conversion.h"

namespace zeroshard::detail {

namespace {

// More reductions in flight than this wait for the oldest: it bounds the communication buffers
// at two buckets (one being reduced while the next fills) as DeepSpeed's double buffering does.
constexpr std::size_t kMaxInFlight = 2;

void add_into(void* dst, DType dst_dtype, const void* src, DType src_dtype, std::int64_t count,
              float* scratch, std::int64_t scratch_count) {
  if (dst_dtype == DType::kFloat32 && src_dtype == DType::kFloat32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
#pragma omp simd
    for (std::int64_t i = 0; i < count; ++i) d[i] += s[i];
    return;
  }
  // 16-bit operands are widened chunk by chunk; the sum is rounded once when stored.
  const std::int64_t half = scratch_count / 2;
  for (std::int64_t done = 0; done < count; done += half) {
    const std::int64_t n = std::min(half, count - done);
    float* a = scratch;
    float* b = scratch + half;
    convert_to_float(static_cast<const char*>(dst) + done * size_of(dst_dtype), dst_dtype, a, n);
    convert_to_float(static_cast<const char*>(src) + done * size_of(src_dtype), src_dtype, b, n);
    for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
    convert_from_float(a, static_cast<char*>(dst) + done * size_of(dst_dtype), dst_dtype, n);
  }
}

void scale_in_place(void* data, DType dtype, std::int64_t count, float factor, float* scratch,
                    std::int64_t scratch_count) {
  if (dtype == DType::kFloat32) {
    float* d = static_cast<float*>(data);
#pragma omp simd
    for (std::int64_t i = 0; i < count; ++i) d[i] *= factor;
    return;
  }
  for (std::int64_t done = 0; done < count; done += scratch_count) {
    const std::int64_t n = std::min(scratch_count, count - done);
    char* at = static_cast<char*>(data) + done * size_of(dtype);
    convert_to_float(at, dtype, scratch, n);
    for (std::int64_t i = 0; i < n; ++i) scratch[i] *= factor;
    convert_from_float(scratch, at, dtype, n);
  }
}

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
  if (stage_ >= 1 && config_.zero_optimization.reduce_scatter) slot_recv_elements_ = widest_recv;
}

int EngineState::acquire_slot() {
  for (;;) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s].busy) {
        slots_[s].busy = true;
        std::memset(slots_[s].buffer.data(), 0, slots_[s].buffer.bytes());
        return static_cast<int>(s);
      }
    }
    if (in_flight_.empty()) break;
    complete_oldest();
  }
  const std::int64_t bytes = (slot_input_elements_ + slot_recv_elements_) * dsize_;
  slots_.push_back({TrackedBuffer(tracker_, MemoryCategory::kCommunication, bytes), true});
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
  if (const double factor = pre_reduction_factor(); factor != 1.0) {
    scale_in_place(input, dtype_, length, static_cast<float>(factor), scratch_.as<float>(),
                   static_cast<std::int64_t>(scratch_.bytes() / sizeof(float)));
  }
  if (scatter) {
    if (stage_ == 1) bucket.slot = acquire_slot();
    char* recv = slots_[bucket.slot].buffer.as<char>() + slot_input_elements_ * dsize_;
    const auto counts = layout_.rank_counts(bucket.begin, bucket.end);
    bucket.request = comm_->reduce_scatter_async(input, recv, counts, dtype_, ReduceOp::kSum);
  } else {
    bucket.request = comm_->all_reduce_async(input, length, dtype_, ReduceOp::kSum);
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
  if (stage_ == 0) return;
  const std::int64_t shard_lo = layout_.shard_begin(rank_);
  const std::int64_t lo = std::max(bucket.begin, shard_lo);
  const std::int64_t hi = std::min(bucket.end, layout_.shard_end(rank_));
  const bool scatter = config_.zero_optimization.reduce_scatter;
  if (hi > lo) {
    const char* slot_base = bucket.slot >= 0 ? slots_[bucket.slot].buffer.as<char>() : nullptr;
    const char* reduced = scatter       ? slot_base + slot_input_elements_ * dsize_
                          : stage_ == 1 ? grads_full_.as<char>() + lo * dsize_
                                        : slot_base + (lo - bucket.begin) * dsize_;
    if (stage_ == 1) {
      if (scatter) std::memcpy(grads_full_.as<char>() + lo * dsize_, reduced, (hi - lo) * dsize_);
    } else {
      void* dst = grad_shard_.as<char>() + (lo - shard_lo) * size_of(grad_shard_dtype_);
      add_into(dst, grad_shard_dtype_, reduced, dtype_, hi - lo, scratch_.as<float>(),
               static_cast<std::int64_t>(scratch_.bytes() / sizeof(float)));
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
