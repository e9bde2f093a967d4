// DeepSpeed's static and dynamic loss scaling rules, step by step as
// deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler.update_scale) has them.
#include "precision/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "util/check.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

// DeepSpeed's scale_factor; no config key changes it.
constexpr double kScaleFactor = 2.0;

template <typename T>
[[noreturn]] void reject(const char* key, const T& value, const char* expected) {
  std::ostringstream message;
  message << "got " << value << ", expected " << expected;
  throw ConfigError(key, message.str());
}

// The checks of deepspeed/runtime/loss_scale_validation.py, applied where DeepSpeed applies them:
// loss_scale always, the dynamic settings only when the scale is dynamic.
void validate(const Fp16Config& config) {
  if (!std::isfinite(config.loss_scale) || config.loss_scale < 0) {
    reject("fp16.loss_scale", config.loss_scale, "0 (dynamic) or a finite static scale > 0");
  }
  if (config.loss_scale > 0) return;
  const double initial_scale = std::ldexp(1.0, config.initial_scale_power);
  if (!std::isfinite(initial_scale) || initial_scale <= 0) {
    reject("fp16.initial_scale_power", config.initial_scale_power,
           "an exponent whose 2^power is a finite double > 0 (-1074..1023; DeepSpeed's default "
           "is 16)");
  }
  if (config.loss_scale_window <= 0) {
    reject("fp16.loss_scale_window", config.loss_scale_window, "an integer > 0");
  }
  if (config.hysteresis < 0) reject("fp16.hysteresis", config.hysteresis, "an integer >= 0");
  if (!std::isfinite(config.min_loss_scale) || config.min_loss_scale <= 0) {
    reject("fp16.min_loss_scale", config.min_loss_scale, "a finite number > 0");
  }
}

}  // namespace

LossScaler::LossScaler(const Fp16Config& config)
    : dynamic_(config.loss_scale == 0),
      scale_(config.loss_scale),
      scale_window_(config.loss_scale_window),
      delayed_shift_(config.hysteresis),
      consecutive_hysteresis_(config.consecutive_hysteresis),
      min_scale_(config.min_loss_scale),
      cur_hysteresis_(config.hysteresis) {
  validate(config);
  if (dynamic_) {
    scale_ = std::ldexp(1.0, config.initial_scale_power);
  } else {
    // A static scale ignores fp16.hysteresis, which may then hold anything; 1 keeps state()
    // restorable into any scaler.
    delayed_shift_ = 1;
    cur_hysteresis_ = 1;
  }
}

bool LossScaler::update(bool overflow) {
  // DeepSpeed's static LossScaler never changes its scale, but the fp16 optimizers still skip a
  // step whose gradients overflowed; the counters below are zeroshard's, for reporting.
  if (!dynamic_) {
    if (overflow) {
      last_overflow_iter_ = cur_iter_;
      ++overflows_;
    }
    ++cur_iter_;
    return overflow;
  }
  if (overflow) {
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      // raise_error_at_min_scale is always true when DeepSpeed builds the scaler from a config.
      if (scale_ == min_scale_) {
        std::ostringstream message;
        message << "fp16 loss scaling: the gradients overflowed at step " << cur_iter_
                << " with the loss scale already at its minimum, fp16.min_loss_scale = "
                << min_scale_
                << " (DeepSpeed: \"Current loss scale already at minimum - cannot decrease scale "
                   "anymore. Exiting run.\"). Training in fp16 has diverged or its gradients are "
                   "inf/NaN at any scale; use bf16 (bf16.enabled), or a static fp16.loss_scale to "
                   "skip such steps without stopping, or a smaller fp16.min_loss_scale.";
        throw UsageError(message.str());
      }
      scale_ = std::max(scale_ / kScaleFactor, min_scale_);
    } else if (cur_hysteresis_ > 0) {
      // With hysteresis 0 DeepSpeed's counter runs below 0 and never reaches 1: the scale is
      // never lowered. Stopping at 0 keeps that and a restorable state.
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
    ++overflows_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
    // Newest DeepSpeed counts the clean steps after the overflow step (older releases grew one
    // step earlier, at (cur_iter - last_overflow_iter) % scale_window == 0).
    const std::int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
    if (stable_interval > 0 && stable_interval % scale_window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      scale_ *= kScaleFactor;
    }
  }
  ++cur_iter_;
  return overflow;
}

LossScalerState LossScaler::state() const noexcept {
  return LossScalerState{.scale = scale_,
                         .iterations_since_overflow = cur_iter_ - last_overflow_iter_,
                         .hysteresis_left = cur_hysteresis_,
                         .overflows = overflows_,
                         .iteration = cur_iter_};
}

void LossScaler::restore(const LossScalerState& state) {
  ZEROSHARD_CHECK_USAGE(
      std::isfinite(state.scale) && state.scale > 0,
      "loss scaler state: scale " << state.scale << " is not a finite number > 0");
  ZEROSHARD_CHECK_USAGE(state.iteration >= 0,
                        "loss scaler state: iteration " << state.iteration << " is negative");
  ZEROSHARD_CHECK_USAGE(state.iterations_since_overflow >= 1 &&
                            state.iterations_since_overflow <= state.iteration + 1,
                        "loss scaler state: iterations_since_overflow "
                            << state.iterations_since_overflow << ", expected 1.."
                            << state.iteration + 1);
  ZEROSHARD_CHECK_USAGE(state.hysteresis_left >= 0, "loss scaler state: hysteresis_left "
                                                        << state.hysteresis_left
                                                        << ", expected >= 0");
  ZEROSHARD_CHECK_USAGE(
      state.overflows >= 0 && state.overflows <= state.iteration,
      "loss scaler state: overflows " << state.overflows << ", expected 0.." << state.iteration);
  if (dynamic_) scale_ = state.scale;
  cur_iter_ = state.iteration;
  last_overflow_iter_ = state.iteration - state.iterations_since_overflow;
  cur_hysteresis_ = state.hysteresis_left;
  overflows_ = state.overflows;
}

}  // namespace zeroshard::detail
