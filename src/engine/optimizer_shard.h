// The optimizer shard: this rank's owned elements of the flat layout, the fp32 master weights,
// the rule's states and the reduced gradients, in one part or, under offload_optimizer.ratio below
// 1, two: the first `ratio` of the owned elements on the host, updated there by the CPU backend,
// and the rest on the device, updated at the same time by the device's kernels (DeepSpeed's
// Twin-Flow). Each call is split at the parts' boundary; the engine sees one shard.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/grad_bucketer.h"
#include "engine/optimizer_part.h"

namespace zeroshard::detail {

class OptimizerShard final : public ReducedGradientSink {
 public:
  OptimizerShard(const EngineContext& context, const UpdateRule& rule, ParamCoordinator& params,
                 char* full_grads, DType grad_shard_dtype);

  /// Some part is updated on the host (offload_optimizer).
  bool offloaded() const noexcept;
  /// The host part's master weights and states live in swap files (offload_optimizer nvme).
  bool swaps() const noexcept { return host_part().swaps(); }
  SwapTimes swap_times() const noexcept { return host_part().swap_times(); }
  /// Tests only: a fault in the host part's swap file of `array` (0 the master, 1 + k state k).
  void inject_swap_fault(int array, const IoFault& fault) {
    host_part().inject_swap_fault(array, fault);
  }
  /// Owned elements the host part holds: all of them at ratio 1, none without offload.
  std::int64_t host_elements() const noexcept;

  void* reduce_target(std::int64_t lo, std::int64_t hi, DType dtype) override;
  void accept_reduced(std::int64_t lo, std::int64_t hi, const void* data, DType dtype) override;
  void expect_deliveries(std::int64_t elements, DType dtype) override;
  void before_reuse() override;
  void micro_step_reduced() override;
  /// Drops this window's gradients: the next micro-step's arrivals replace the shard.
  void zero_gradients();
  /// Sum of squares and inf/NaN check of the reduced gradients of owned elements [lo, hi): bit
  /// for bit the same however the parts divide the range, on CPU ranks.
  GradientScan scan(std::int64_t lo, std::int64_t hi);

  /// Sets the master weights of owned elements [flat, flat + count) from host fp32 values.
  void load_master(std::int64_t flat, const float* values, std::int64_t count);
  /// Copies the owned master weights of flat elements [lo, hi) into `destination` (device
  /// memory, element lo at destination[0]); the rest of it is left as it was.
  void copy_master_to(float* destination, std::int64_t lo, std::int64_t hi);

  /// Checkpoints: array 0 is the master, array 1 + k the rule's state k, each over the owned range.
  int array_count() const noexcept { return parts_.front()->array_count(); }
  std::int64_t owned_begin() const noexcept { return parts_.front()->owned_begin(); }
  std::int64_t owned_end() const noexcept { return parts_.back()->owned_end(); }
  /// Owned elements [flat, flat + count) of the array where they lie in host memory, in one
  /// part, to be read in place; else null.
  const float* host_view(int array, std::int64_t flat, std::int64_t count);
  /// Copies owned elements [flat, flat + count) of `array` to or from host memory.
  void read_owned(int array, std::int64_t flat, float* out, std::int64_t count);
  void write_owned(int array, std::int64_t flat, const float* values, std::int64_t count);
  /// Host memory to stage a new owned range of `array` in, which adopt_array() then puts in the
  /// array's place instead of copying it: empty when the array cannot be replaced whole (device
  /// memory, swap files, the model's own memory, a gather in flight from it, two parts); the
  /// caller then stages elsewhere and uses write_owned().
  TrackedBuffer staging_for(int array);
  /// `staged`, from staging_for(array) and filled with the owned range, becomes the array; the
  /// previous one is freed.
  void adopt_array(int array, TrackedBuffer staged);
  /// After write_owned() of the master: rounds it into the model-precision copy of the owned
  /// range (the stage's spread to other ranks is ParamCoordinator::after_update()).
  void refresh_params_from_master();

  /// Runs the rule over the owned range (OptimizerPart::update): the device part's kernels are
  /// queued first, so that they run while the host updates its part.
  void update(float grad_factor, const GroupContexts& contexts);
  /// Whether update() left the bucketer's whole gradients zero over the owned range
  /// (OptimizerPart::clears_whole_gradients), in every part.
  bool clears_whole_gradients() const noexcept;
  void leave_whole_gradients(bool leave) noexcept;
  /// super_offload: the host part's update can run during backward on a thread of its own.
  bool overlaps_update() const noexcept { return host_part().overlaps_update(); }
  /// OptimizerPart's overlapped update, for the host part; a device part is updated by
  /// keep_overlapped_update(), when the host part's is kept.
  void begin_overlapped_update(float grad_factor, GroupContexts contexts);
  bool overlapped_update_begun() const noexcept { return host_part().overlapped_update_begun(); }
  void finish_overlapped_update();
  /// Keeps the host part's finished overlapped update when it applies (OptimizerPart), and then
  /// updates the device part: the whole step is done. Otherwise returns false and update() runs.
  bool keep_overlapped_update(float grad_factor, const GroupContexts& contexts);
  /// offload_optimizer.ratio "auto", once the first step has measured the device, on a shard that
  /// is one host part: its first `host_elements` owned elements stay there and the rest moves to
  /// a new device part, values as they stand, so training goes on bit for bit on CPU ranks. The
  /// host part keeps its arrays whole (pinned memory is not returned in part): host memory stays
  /// as at ratio 1.
  void keep_on_host(std::int64_t host_elements);
  /// Host memory the host part holds (OptimizerPart::host_bytes).
  std::int64_t host_bytes() const noexcept { return host_part().host_bytes(); }

  /// After update() failed on some rank (an I/O error on swap files): OptimizerPart's roll-back.
  /// Swap files hold the whole shard (check_config refuses nvme with a ratio below 1).
  void roll_back_update();

 private:
  /// The part that offload places on the host, else the only one.
  OptimizerPart& host_part() const noexcept { return *parts_.front(); }
  /// Calls use(part, first, last) for each part holding some of owned elements [lo, hi), with
  /// the elements [first, last) of them that it holds, in element order.
  template <class Use>
  void for_each_part(std::int64_t lo, std::int64_t hi, Use use);

  std::unique_ptr<OptimizerPart> make_part(FlatRange range, PartPlacement placement,
                                           OptimizerPart* predecessor = nullptr) const;

  const EngineContext& context_;
  const UpdateRule& rule_;
  ParamCoordinator& params_;
  char* const full_grads_;
  const DType grad_shard_dtype_;
  /// Host part first, then the device part; one part when there is nothing to split.
  std::vector<std::unique_ptr<OptimizerPart>> parts_;
  /// The bucketer's announcement (expect_deliveries), for parts built after it.
  std::int64_t expected_elements_ = 0;
  DType expected_dtype_ = DType::kFloat32;
};

}  // namespace zeroshard::detail
