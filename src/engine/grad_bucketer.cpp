// Bucket planning, slots, and the reductions in flight.
#include "engine/grad_bucketer.h"

#include <algorithm>
#include <chrono>

#include "comm/rank_counts.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::detail {

namespace {

// More reductions in flight than this wait for the oldest: it bounds the communication buffers
// at two buckets (one being reduced while the next fills) as DeepSpeed's double buffering does.
constexpr std::size_t kMaxInFlight = 2;

// Stage 0 with reduce_scatter (which a JSON config gives at stage 0 only when it names the key)
// reduces each bucket as stages 1-3 do, a reduce-scatter over the shard boundaries, and then
// gathers the summed parts back, so that every element is summed in the order stages 1-3 sum it
// and stage 0 gives their results bit for bit; a ring all-reduce sends the same bytes. NCCL
// keeps its all-reduce: with uneven shards its reduce-scatter is one reduce per rank and the
// gather one broadcast per rank, where its all-reduce is one call that picks its algorithm.
bool gathers_back(const EngineContext& context) {
  return context.stage == 0 && context.world > 1 &&
         context.config.zero_optimization.reduce_scatter && context.comm.backend() != "nccl";
}

}  // namespace

GradBucketer::GradBucketer(const EngineContext& context, DType comm_dtype, bool whole_gradients,
                           void* adopted, DType accum_dtype)
    : context_(context),
      comm_dtype_(comm_dtype),
      whole_(whole_gradients),
      source_dtype_(whole_gradients ? accum_dtype : context.dtype),
      widens_(comm_dtype != source_dtype_),
      adopted_(adopted != nullptr),
      gather_back_(gathers_back(context)),
      scatter_(gather_back_ ||
               (context.stage >= 1 && context.config.zero_optimization.reduce_scatter)) {
  // On one rank a reduce-scatter only copies into a receive area as large as the bucket; stages
  // 2-3 with whole gradients reduce in place instead, so that they never hold more than stage 0.
  if (whole_ && context_.stage >= 2 && context_.world == 1) scatter_ = false;
  // qgZ replaces stage 3's reduce-scatter; one rank has no reduction to quantize.
  if (context_.stage == 3 && context_.config.zero_optimization.quantized_gradients &&
      context_.world > 1) {
    quantized_ = std::make_unique<QuantizedReduceScatter>(
        make_node_groups(context_.comm, 0, "zero_optimization.zero_quantized_gradients"),
        context_.backend, context_.tracker, context_.resource(Tier::kDevice));
    scatter_ = true;
  }
  const std::size_t full_bytes = context_.layout.padded_total() * context_.dsize;
  if (adopted != nullptr) {
    grads_full_ = TrackedBuffer::adopt(context_.tracker, MemoryCategory::kGradients, full_bytes,
                                       context_.resource(Tier::kDevice), adopted);
    // Gradients are zero at the start of every accumulation window, the padding always.
    zero_full_grads();
  } else if (whole_) {
    grads_full_ = context_.allocate(Tier::kDevice, MemoryCategory::kGradients, full_bytes);
  }
  if (whole_ && accum_dtype != context_.dtype) {
    accumulator_ = context_.allocate(Tier::kDevice, MemoryCategory::kGradients,
                                     context_.layout.padded_total() * size_of(accum_dtype));
  }
  plan();
}

GradBucketer::~GradBucketer() { abandon_in_flight(); }

void GradBucketer::abandon_in_flight() noexcept {
  // A dropped request is waited for quietly (Request's destructor), so every rank still takes
  // part in the collectives it launched alike.
  for (Bucket& bucket : buckets_) bucket.request = Request();
  in_flight_.clear();
  gathers_.clear();
}

void GradBucketer::deliver_to(ReducedGradientSink& sink) {
  sink_ = &sink;
  // Whole gradients are delivered from the whole buffer, in its type.
  sink.expect_deliveries(widest_share_, whole_ ? source_dtype_ : comm_dtype_);
}

double GradBucketer::pre_reduction_factor() const {
  // DeepSpeed's allreduce_bucket: prescale_gradients divides by the world size before the
  // reduction; otherwise gradient_predivide_factor is divided out before and the rest after.
  const Config& config = context_.config;
  return config.prescale_gradients ? 1.0 / context_.world : 1.0 / config.gradient_predivide_factor;
}

double GradBucketer::post_reduction_factor() const {
  const Config& config = context_.config;
  return config.prescale_gradients ? 1.0 : config.gradient_predivide_factor / context_.world;
}

void GradBucketer::plan() {
  const ShardLayout& layout = context_.layout;
  const std::int64_t limit = context_.config.zero_optimization.reduce_bucket_size;
  // Buckets tile [0, padded_total) from the top; each closes before it would exceed the limit,
  // and a tensor larger than the limit forms a bucket of its own.
  Bucket current;
  current.end = layout.padded_total();
  for (int t = layout.tensor_count() - 1; t >= 0; --t) {
    if (!current.params.empty() && current.end - layout.offset(t) > limit) {
      current.begin = layout.offset(context_.params[current.params.back()].tensor);
      const std::int64_t next_end = current.begin;
      buckets_.push_back(std::move(current));
      current = Bucket{};
      current.end = next_end;
    }
    current.params.push_back(context_.tensor_param[t]);
  }
  current.begin = 0;
  buckets_.push_back(std::move(current));
  std::int64_t widest = 0;
  std::int64_t widest_recv = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (int index : buckets_[b].params) context_.params[index].bucket = static_cast<int>(b);
    widest = std::max(widest, buckets_[b].end - buckets_[b].begin);
    const auto counts = layout.rank_counts(buckets_[b].begin, buckets_[b].end);
    widest_recv = std::max(widest_recv, counts[context_.rank]);
  }
  widest_share_ = widest_recv;
  if (!whole_) {
    slot_input_elements_ = widest;
    for (Bucket& bucket : buckets_) {
      // The parameters run from the highest offset down: the gaps are what lies between them.
      std::int64_t covered_to = bucket.begin;
      for (auto index = bucket.params.rbegin(); index != bucket.params.rend(); ++index) {
        const ParamInfo& p = context_.params[*index];
        const std::int64_t offset = layout.offset(p.tensor);
        if (offset > covered_to) bucket.gaps.push_back({covered_to, offset});
        covered_to = offset + p.numel;
      }
      if (bucket.end > covered_to) bucket.gaps.push_back({covered_to, bucket.end});
    }
  }
  if (widens_) slot_send_elements_ = widest;
}

// The input area holds a multiple of 16 elements (buckets start and end on tensor boundaries), so
// the fp32 send area after it stays 4-byte aligned.
char* GradBucketer::slot_send(int slot) {
  return slots_[slot].buffer.as<char>() + slot_input_elements_ * context_.dsize;
}

int GradBucketer::acquire_slot(const Bucket& bucket) {
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  // Only the input area is reduced as the model left it; the send area is overwritten whole by
  // the widening.
  const auto zero_gaps = [&](Slot& slot) {
    for (const FlatRange& gap : bucket.gaps) {
      context_.backend.zero(slot.buffer.as<char>() + (gap.begin - bucket.begin) * dsize,
                            static_cast<std::size_t>((gap.end - gap.begin) * dsize));
    }
  };
  for (;;) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s].busy) {
        slots_[s].busy = true;
        // The sink may still be copying what it was handed from this slot.
        if (sink_ != nullptr) sink_->before_reuse();
        zero_gaps(slots_[s]);
        return static_cast<int>(s);
      }
    }
    if (in_flight_.empty()) break;
    complete_oldest();
  }
  if (!warned_slot_growth_ && slots_.size() >= 2 * kMaxInFlight) {
    warned_slot_growth_ = true;
    ZEROSHARD_LOG(kWarning, "rank " << context_.rank << ": " << slots_.size() + 1
                                    << " gradient buckets are being written before any of them "
                                       "could be reduced, each in a communication buffer of its "
                                       "own. A backward that completes its gradients only at its "
                                       "end should call "
                                       "Engine::set_grad_handover(GradHandover::kAtEnd)");
  }
  const std::int64_t bytes =
      slot_input_elements_ * dsize + slot_send_elements_ * static_cast<std::int64_t>(sizeof(float));
  slots_.push_back({context_.allocate(Tier::kDevice, MemoryCategory::kCommunication, bytes), true});
  return static_cast<int>(slots_.size()) - 1;
}

void GradBucketer::zero_unfetched(const Bucket& bucket, char* input) {
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  for (int index : bucket.params) {
    ParamInfo& p = context_.params[index];
    if (p.grad_fetched) continue;
    p.grad_fetched = true;
    const std::int64_t offset = context_.layout.offset(p.tensor) - bucket.begin;
    context_.backend.zero(input + offset * dsize, static_cast<std::size_t>(p.numel * dsize));
  }
}

GradTarget GradBucketer::grad(int index, bool may_assign) {
  ParamInfo& p = context_.params[index];
  ZEROSHARD_CHECK_USAGE(p.trainable, "parameter '" << p.name
                                                   << "' is frozen (trainable = false) and has "
                                                      "no gradient buffer");
  ZEROSHARD_CHECK_USAGE(!p.grad_ready, "the gradient of '"
                                           << p.name
                                           << "' was already handed over with grad_ready() in "
                                              "this micro-step; write it before calling it");
  const std::int64_t offset = context_.layout.offset(p.tensor);
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  char* data = nullptr;
  if (whole_) {
    data = grads_full_.as<char>() + offset * dsize;
  } else {
    Bucket& bucket = buckets_[p.bucket];
    if (bucket.slot < 0) bucket.slot = acquire_slot(bucket);
    data = slots_[bucket.slot].buffer.as<char>() + (offset - bucket.begin) * dsize;
  }
  if (p.grad_fetched || adopted_) return {data, true};
  p.grad_fetched = true;
  if (whole_) {
    p.writes_grad = may_assign;
    // Zeroed at the last window's end.
    if (!full_grads_left_) return {data, true};
  }
  if (may_assign) return {data, false};
  context_.backend.zero(data, static_cast<std::size_t>(p.numel * dsize));
  return {data, true};
}

void GradBucketer::mark_ready(int index, std::int64_t micro_step) {
  ParamInfo& p = context_.params[index];
  ZEROSHARD_CHECK_USAGE(p.trainable, "grad_ready('" << p.name << "'): the parameter is frozen");
  ZEROSHARD_CHECK_USAGE(!p.grad_ready,
                        "grad_ready('" << p.name << "') called twice in one micro-step");
  p.grad_ready = true;
  ++buckets_[p.bucket].ready;
  launch_ready(micro_step);
  poll();
}

void GradBucketer::poll() {
  for (int b : in_flight_) buckets_[b].request.test();
  for (Request& gather : gathers_) gather.test();
}

void GradBucketer::launch_ready(std::int64_t micro_step) {
  // Whole gradients are reduced once per accumulation window, at its boundary.
  if (whole_ && !context_.gradient_accumulation_boundary(micro_step)) return;
  while (next_launch_ < buckets_.size()) {
    Bucket& bucket = buckets_[next_launch_];
    if (bucket.ready < static_cast<int>(bucket.params.size())) return;
    launch(static_cast<int>(next_launch_++));
  }
}

void GradBucketer::finish(std::int64_t micro_step) {
  if (!whole_ || context_.gradient_accumulation_boundary(micro_step)) {
    while (next_launch_ < buckets_.size()) launch(static_cast<int>(next_launch_++));
  } else if (!accumulator_.empty()) {
    accumulate_wide(0, context_.layout.padded_total());
  }
  while (!in_flight_.empty()) complete_oldest();
  while (!gathers_.empty()) wait_oldest_gather();
  sink_->micro_step_reduced();
  // Slots beyond what the reductions in flight need were held by buckets written out of order:
  // the pool shrinks back so that the next step starts from the bound.
  if (slots_.size() > kMaxInFlight) {
    if (sink_ != nullptr) sink_->before_reuse();
    slots_.erase(slots_.begin() + static_cast<std::ptrdiff_t>(kMaxInFlight), slots_.end());
  }
  restart_readiness();
}

void GradBucketer::restart_readiness() {
  for (ParamInfo& p : context_.params) {
    p.grad_ready = false;
    // Whole gradients are fetched once per window: zero_full_grads() starts the next.
    if (!whole_) p.grad_fetched = false;
  }
  for (Bucket& b : buckets_) b.ready = 0;
  next_launch_ = 0;
}

void GradBucketer::drop_micro_step() {
  while (!in_flight_.empty()) {
    buckets_[in_flight_.front()].request.wait();
    in_flight_.pop_front();
  }
  while (!gathers_.empty()) wait_oldest_gather();
  // A freed slot is reused only through acquire_slot(), which waits for the sink's copies first.
  for (Bucket& bucket : buckets_) {
    if (bucket.slot >= 0) slots_[bucket.slot].busy = false;
    bucket.slot = -1;
  }
  restart_readiness();
}

void GradBucketer::launch(int b) {
  Bucket& bucket = buckets_[b];
  // Whole gradients are reduced after backward, with no compute left to overlap: one reduction
  // at a time keeps the receive area at one bucket's share of this rank's shard, so that smaller
  // buckets never need more than larger ones.
  const std::size_t max_in_flight = whole_ ? 1 : kMaxInFlight;
  while (in_flight_.size() >= max_in_flight) complete_oldest();
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t length = bucket.end - bucket.begin;
  void* input = nullptr;
  if (whole_) {
    // The window's last micro-step joins the sum as its buckets are launched.
    if (!accumulator_.empty()) accumulate_wide(bucket.begin, bucket.end);
    input = whole_at(bucket.begin);
    if (full_grads_left_) zero_unfetched(bucket, static_cast<char*>(input));
  } else {
    if (bucket.slot < 0) bucket.slot = acquire_slot(bucket);
    input = slots_[bucket.slot].buffer.data();
    zero_unfetched(bucket, static_cast<char*>(input));
  }
  if (widens_) {
    // communication_data_type fp32: the 16-bit gradients travel widened, so the reduction adds
    // in fp32 and the sum is rounded at most once, when it is stored.
    if (bucket.slot < 0) bucket.slot = acquire_slot(bucket);
    float* send = reinterpret_cast<float*>(slot_send(bucket.slot));
    context_.backend.widen(input, context_.dtype, send, length, 1.0f);
    input = send;
  }
  // After the widening, as DeepSpeed divides the tensor already cast to the communication type.
  if (const double factor = pre_reduction_factor(); factor != 1.0) {
    context_.backend.scale(input, comm_dtype_, length, static_cast<float>(factor));
  }
  if (scatter_) {
    const auto counts = context_.layout.rank_counts(bucket.begin, bucket.end);
    // Stages 2-3 with slots: this rank's part may go straight into the gradient shard, so that
    // it is neither copied there nor zeroed before. Otherwise it is reduced in place, in its own
    // position in what is sent: the whole gradients keep it there, and stage 0 gathers the other
    // parts around it.
    const std::int64_t lo = std::max(bucket.begin, context_.layout.shard_begin(context_.rank));
    const std::int64_t hi = std::min(bucket.end, context_.layout.shard_end(context_.rank));
    bucket.output = !whole_ && hi > lo ? sink_->reduce_target(lo, hi, comm_dtype_) : nullptr;
    if (bucket.output == nullptr) {
      const std::int64_t before = offset_of(counts, context_.rank);
      bucket.output =
          static_cast<char*>(input) + before * static_cast<std::int64_t>(size_of(comm_dtype_));
    }
    bucket.request = quantized_ ? quantized_->start(input, bucket.output, counts, comm_dtype_)
                                : context_.comm.reduce_scatter_async(input, bucket.output, counts,
                                                                     comm_dtype_, ReduceOp::kSum);
  } else {
    bucket.request = context_.comm.all_reduce_async(input, length, comm_dtype_, ReduceOp::kSum);
  }
  in_flight_.push_back(b);
  context_.times.reduce += seconds_since(start);
  // Without overlap_comm each reduction finishes before backward goes on (DeepSpeed's meaning).
  if (!context_.config.zero_optimization.overlap_comm) complete_oldest();
}

void GradBucketer::complete_oldest() {
  const int b = in_flight_.front();
  in_flight_.pop_front();
  Bucket& bucket = buckets_[b];
  const auto start = std::chrono::steady_clock::now();
  bucket.request.wait();
  if (gather_back_) gather_back(bucket);
  context_.times.reduce += seconds_since(start);
  const int stage = context_.stage;
  const DType dtype = context_.dtype;
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  // Stage 0 keeps the whole reduced gradients in grads_full_: a sum reduced in fp32 is stored
  // back rounded, once.
  if (stage == 0 && widens_) {
    context_.backend.narrow(reinterpret_cast<const float*>(slot_send(bucket.slot)),
                            grads_full_.as<char>() + bucket.begin * dsize, dtype,
                            bucket.end - bucket.begin);
  }
  const std::int64_t lo = std::max(bucket.begin, context_.layout.shard_begin(context_.rank));
  const std::int64_t hi = std::min(bucket.end, context_.layout.shard_end(context_.rank));
  if (stage >= 1 && hi > lo) {
    // This rank's part of the sum: the receive area, or its slice of what was all-reduced.
    const char* reduced = nullptr;
    if (scatter_) {
      reduced = static_cast<const char*>(bucket.output);
    } else if (widens_) {
      reduced = slot_send(bucket.slot) + (lo - bucket.begin) * sizeof(float);
    } else if (whole_) {
      reduced = whole_at(lo);
    } else {
      reduced = slots_[bucket.slot].buffer.as<char>() + (lo - bucket.begin) * dsize;
    }
    if (whole_) {
      // Stages 1-3 with whole gradients keep the reduced shard there, in their type.
      char* dst = whole_at(lo);
      if (widens_) {
        context_.backend.narrow(reinterpret_cast<const float*>(reduced), dst, dtype, hi - lo);
      }
      sink_->accept_reduced(lo, hi, dst, source_dtype_);
    } else {
      sink_->accept_reduced(lo, hi, reduced, comm_dtype_);
    }
  }
  if (bucket.slot >= 0) {
    slots_[bucket.slot].busy = false;
    bucket.slot = -1;
  }
}

void GradBucketer::gather_back(const Bucket& bucket) {
  // This rank's summed part was reduced in place in the bucket (the fp32 send area when the
  // gradients travel widened), where the all-gather fills in the other ranks' parts around it.
  const auto counts = context_.layout.rank_counts(bucket.begin, bucket.end);
  char* reduced = widens_ ? slot_send(bucket.slot) : whole_at(bucket.begin);
  gathers_.push_back(context_.comm.all_gather_async(reduced, counts, comm_dtype_));
  // The gather overlaps the next bucket's reduce-scatter, each in the bucket's own place in the
  // whole gradients; widened sums are narrowed from the slot once gathered, so those wait here.
  if (widens_ || gathers_.size() > kMaxInFlight) wait_oldest_gather();
}

void GradBucketer::wait_oldest_gather() {
  gathers_.front().wait();
  gathers_.pop_front();
}

char* GradBucketer::whole_at(std::int64_t flat) const {
  return full_grads() + flat * static_cast<std::int64_t>(size_of(source_dtype_));
}

void GradBucketer::accumulate_wide(std::int64_t begin, std::int64_t end) {
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  char* model = grads_full_.as<char>() + begin * dsize;
  context_.backend.accumulate(whole_at(begin), source_dtype_, model, context_.dtype, end - begin);
  context_.backend.zero(model, static_cast<std::size_t>((end - begin) * dsize));
}

bool GradBucketer::leaves_full_grads() const {
  // The accumulator is added to, never written whole.
  if (!whole_ || adopted_ || !accumulator_.empty()) return false;
  return std::all_of(context_.params.begin(), context_.params.end(),
                     [](const ParamInfo& p) { return !p.trainable || p.writes_grad; });
}

void GradBucketer::zero_full_grads(std::int64_t cleared_begin, std::int64_t cleared_end) {
  if (sink_ != nullptr) sink_->before_reuse();
  full_grads_left_ = leaves_full_grads();
  for (ParamInfo& p : context_.params) p.grad_fetched = false;
  if (full_grads_left_) return;
  // The model's buffer is emptied into the accumulator at every micro-step's end, but a dropped
  // micro-step (Engine::zero_grad() before step()) leaves its part there.
  if (!accumulator_.empty()) context_.backend.zero(grads_full_.data(), grads_full_.bytes());
  const auto element = static_cast<std::int64_t>(size_of(source_dtype_));
  const std::int64_t total = whole_ ? context_.layout.padded_total() : 0;
  char* base = full_grads();
  if (cleared_begin > 0)
    context_.backend.zero(base, static_cast<std::size_t>(cleared_begin * element));
  if (cleared_end < total) {
    context_.backend.zero(base + cleared_end * element,
                          static_cast<std::size_t>((total - cleared_end) * element));
  }
}

}  // namespace zeroshard::detail
