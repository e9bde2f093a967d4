// Gradient buckets: contiguous ranges of the flat gradient buffer, reduced in a fixed order (last
// registered parameters first, as backward produces them) so that every rank issues the same
// collectives in the same order whatever order its gradients arrive in. Each reduced part of
// this rank's shard is handed to a sink (the optimizer shard) as its bucket completes. The model
// writes either one whole gradient buffer (stages 0-1, or gradients handed over at the end of
// backward) or, at stages 2-3, a slot per bucket that is reduced as soon as it is complete. Whole
// 16-bit gradients may accumulate in fp32 (DeepSpeed's BF16_Optimizer): an engine buffer the
// model's is emptied into at every micro-step's end, reduced in fp32 once per window.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm/quantized_reduce_scatter.h"
#include "engine/engine_context.h"

namespace zeroshard::detail {

/// Receives this rank's part of each reduced bucket, stages 1-3: elements [lo, hi) of the flat
/// buffer, summed over the ranks, in `dtype` at `data` (engine memory, unchanged until the next
/// before_reuse()).
class ReducedGradientSink {
 public:
  virtual ~ReducedGradientSink() = default;
  /// Where the reduction may write part [lo, hi) in `dtype` itself, or null for a receive area;
  /// accept_reduced() is then called with that address.
  virtual void* reduce_target(std::int64_t lo, std::int64_t hi, DType dtype) = 0;
  virtual void accept_reduced(std::int64_t lo, std::int64_t hi, const void* data, DType dtype) = 0;
  /// Before the first delivery: no delivery holds more than `elements` elements of `dtype`.
  virtual void expect_deliveries(std::int64_t elements, DType dtype) = 0;
  /// Called before memory once handed to accept_reduced() is written or freed: a sink that reads
  /// it with copies in flight makes later work on the compute stream wait for them.
  virtual void before_reuse() = 0;
  /// Every part of the micro-step's reductions has been accepted.
  virtual void micro_step_reduced() = 0;
};

class GradBucketer {
 public:
  /// Plans the buckets and, with `whole_gradients` (always at stages 0-1), allocates the whole
  /// gradient buffer the model writes, reduced once per accumulation window; `adopted`, when not
  /// null, is the model's own flat gradient memory used as that buffer instead. Whole gradients
  /// accumulate across micro-steps in `accum_dtype`: the model's type in that buffer, or fp32 in
  /// an accumulator of the engine's (not with `adopted`), reduced in fp32 (`comm_dtype`).
  GradBucketer(const EngineContext& context, DType comm_dtype, bool whole_gradients, void* adopted,
               DType accum_dtype);
  /// Waits for every reduction in flight before the buffers it writes are freed.
  ~GradBucketer();
  GradBucketer(const GradBucketer&) = delete;
  GradBucketer& operator=(const GradBucketer&) = delete;

  void deliver_to(ReducedGradientSink& sink);

  /// Where the model writes the gradient of parameter `index` in this micro-step. A place not
  /// zeroed since it was last reduced (a slot's, or whole gradients left by the last window) is
  /// zeroed at its first fetch, unless `may_assign`: then the model writes it whole instead.
  GradTarget grad(int index, bool may_assign);
  /// The gradient was written; launches every bucket that is now complete, in order.
  void mark_ready(int index, std::int64_t micro_step);
  /// Launches what is left and waits for every reduction; readiness starts over.
  void finish(std::int64_t micro_step);
  /// Drops the micro-step in progress (Engine::zero_grad() before step()): waits for the
  /// reductions it launched, which every rank launched alike, without delivering their sums,
  /// frees its slots, and starts readiness over. Nothing is launched.
  void drop_micro_step();
  /// The engine is going: waits for every reduction and gather in flight, which write the sink's
  /// memory and this object's, without delivering their sums.
  void abandon_in_flight() noexcept;
  /// Lets the transport advance the reductions in flight (MPI moves non-blocking collectives only
  /// inside MPI calls): called at every grad_ready() and gather(), so that a reduction proceeds
  /// while the model computes instead of all at once when it is waited for.
  void poll();
  /// The whole gradients as they are reduced at the boundary, in the accumulation type (the fp32
  /// accumulator, or the buffer the model writes); null without whole_gradients.
  char* full_grads() const {
    return accumulator_.empty() ? grads_full_.as<char>() : accumulator_.as<char>();
  }
  /// Ends the whole gradients' window: zeroes them but for elements [cleared_begin, cleared_end),
  /// which the update has already cleared, unless leaves_full_grads() (then nothing is written).
  void zero_full_grads(std::int64_t cleared_begin = 0, std::int64_t cleared_end = 0);
  /// True when the engine's own whole gradients need no zeroing at the window's end: every
  /// trainable gradient was first fetched through grad_target() in its last window, so the next
  /// window hands each place out to be written, zeroes it at a first fetch by raw_grad(), or
  /// zeroes it at the reduction when it is never fetched.
  bool leaves_full_grads() const;

  /// Factors DeepSpeed applies around the reduction (prescale_gradients, predivide factor).
  double pre_reduction_factor() const;
  double post_reduction_factor() const;

 private:
  /// A contiguous range of the flat gradient buffer reduced by one collective.
  struct Bucket {
    std::int64_t begin = 0;
    std::int64_t end = 0;
    std::vector<int> params;
    int ready = 0;
    int slot = -1;  ///< stages 1-3: the communication buffer it uses
    /// Slots: the parts of [begin, end) that no parameter's gradient covers (padding), which
    /// must be zero in what is reduced.
    std::vector<FlatRange> gaps;
    void* output = nullptr;  ///< where the reduce-scatter writes this rank's part
    Request request;
  };
  /// A reusable communication buffer: input area (stages 2-3), then the fp32 send area (16-bit
  /// gradients reduced in fp32). A reduce-scatter writes this rank's part in place in what it
  /// sends, or straight into the gradient shard, so no slot has a receive area.
  struct Slot {
    TrackedBuffer buffer;
    bool busy = false;
  };

  void plan();
  char* slot_send(int slot);
  /// A free slot with `bucket`'s padding zeroed: the gradients' places are zeroed when they are
  /// fetched or launched unfetched, so that a gradient the model writes whole is written once.
  int acquire_slot(const Bucket& bucket);
  /// Zeroes the places of the bucket's gradients that were not fetched in this micro-step (slots)
  /// or window (whole gradients left by the last one); `input` is where the bucket begins.
  void zero_unfetched(const Bucket& bucket, char* input);
  void launch_ready(std::int64_t micro_step);
  /// No gradient handed over or fetched in the micro-step, no bucket launched.
  void restart_readiness();
  void launch(int bucket);
  void complete_oldest();
  /// Stage 0: the bucket's reduce-scatter has completed; starts putting every rank's sum in its
  /// place (and waits for it when the sums travel widened, to be narrowed from the slot).
  void gather_back(const Bucket& bucket);
  void wait_oldest_gather();
  /// Element `flat` of the whole gradients as full_grads() gives them.
  char* whole_at(std::int64_t flat) const;
  /// Adds the model's gradients of elements [begin, end) into the fp32 accumulator and zeroes
  /// them there, so that the model's next micro-step adds to zero.
  void accumulate_wide(std::int64_t begin, std::int64_t end);

  const EngineContext& context_;
  DType comm_dtype_;
  bool whole_ = false;  ///< the model writes grads_full_, not slots
  /// The type what is reduced is in before it is sent: full_grads()' with whole gradients, the
  /// model's in slots.
  DType source_dtype_;
  bool widens_ = false;   ///< 16-bit sources travel widened to fp32 (communication_data_type)
  bool adopted_ = false;  ///< grads_full_ is the model's memory: zeroed at every window's end
  /// This window's whole gradients hold the last window's values until each place is fetched.
  bool full_grads_left_ = false;
  bool gather_back_ = false;  ///< stage 0 reduces as stages 1-3 do, then all-gathers the sums
  bool scatter_ = false;      ///< reduce-scatter: each rank receives its part only
  /// zero_quantized_gradients: the reduce-scatters run quantized over the hosts' node groups.
  std::unique_ptr<QuantizedReduceScatter> quantized_;
  ReducedGradientSink* sink_ = nullptr;
  TrackedBuffer grads_full_;
  /// Whole 16-bit gradients accumulated in fp32 (data_types.grad_accum_dtype); empty otherwise.
  TrackedBuffer accumulator_;
  std::vector<Bucket> buckets_;           ///< in launch order (last registered parameters first)
  std::int64_t slot_input_elements_ = 0;  ///< model dtype
  std::int64_t slot_send_elements_ = 0;   ///< fp32, when 16-bit gradients are sent widened
  std::int64_t widest_share_ = 0;         ///< elements of the largest delivery to the sink
  std::vector<Slot> slots_;
  std::deque<int> in_flight_;
  /// Stage 0: gathers of summed buckets still in flight, oldest first.
  std::deque<Request> gathers_;
  std::size_t next_launch_ = 0;
  bool warned_slot_growth_ = false;
};

}  // namespace zeroshard::detail
