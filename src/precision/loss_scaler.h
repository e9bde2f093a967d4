// Loss scaling for fp16 training: DeepSpeed's dynamic loss scaler (growth window, hysteresis,
// floor) and its static counterpart, as a small state machine the engine drives once per step.
#pragma once

#include <cstdint>

#include "zeroshard/config.h"

namespace zeroshard::detail {

/// What a checkpoint keeps of a LossScaler, with DeepSpeed's meanings.
struct LossScalerState {
  double scale = 1.0;                          ///< DeepSpeed's cur_scale
  std::int64_t iterations_since_overflow = 1;  ///< cur_iter - last_overflow_iter; 1 at the start
  int hysteresis_left = 1;                     ///< cur_hysteresis
  std::int64_t overflows = 0;                  ///< steps skipped for overflow so far
  std::int64_t iteration = 0;                  ///< cur_iter: update() calls so far
};

/// DeepSpeed's loss scaler (deepspeed/runtime/fp16/loss_scaler.py). With `fp16.loss_scale` 0 it is
/// DynamicLossScaler: it starts at 2^initial_scale_power, halves after `hysteresis` overflows
/// (never below min_loss_scale) and doubles after loss_scale_window clean steps. With
/// `fp16.loss_scale` > 0 the scale is static. Either way an overflowing step must be skipped.
class LossScaler {
 public:
  /// Throws ConfigError naming the `fp16.*` key when a value DeepSpeed would reject is given.
  explicit LossScaler(const Fp16Config& config);

  double scale() const noexcept { return scale_; }
  bool dynamic() const noexcept { return dynamic_; }

  /// Records one optimizer step's outcome; returns true if the step must be skipped (overflow).
  /// Throws UsageError, changing nothing, on an overflow with the dynamic scale already at
  /// fp16.min_loss_scale (DeepSpeed raises there too, rather than skip every step from then on).
  bool update(bool overflow);

  /// For checkpoints. A static scaler keeps its configured scale on restore, so that a run
  /// resumed with a new fp16.loss_scale uses it; the counters are restored either way. restore()
  /// throws UsageError on a state no scaler can reach (e.g. a scale that is not finite and > 0).
  LossScalerState state() const noexcept;
  void restore(const LossScalerState& state);

 private:
  bool dynamic_;
  double scale_;
  // DeepSpeed's names for the settings and counters, to make the code easy to hold against it.
  std::int64_t scale_window_;
  int delayed_shift_;
  bool consecutive_hysteresis_;
  double min_scale_;
  int cur_hysteresis_;
  std::int64_t cur_iter_ = 0;
  std::int64_t last_overflow_iter_ = -1;
  std::int64_t overflows_ = 0;
};

}  // namespace zeroshard::detail
