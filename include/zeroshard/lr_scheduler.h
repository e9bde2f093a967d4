// Learning-rate (and momentum) schedules with the names, parameters and formulas of DeepSpeed's
// deepspeed/runtime/lr_schedules.py: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
// LRRangeTest.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "zeroshard/export.h"

namespace zeroshard {

struct SchedulerConfig;

/// What a schedule sets for one optimizer step.
struct ScheduledValues {
  double lr = 0.0;
  /// Set only by OneCycle with momentum cycling: replaces beta1 (Adam, AdamW, Lion) or momentum
  /// (SGD) for the step, see StepContext::momentum.
  std::optional<double> momentum;
};

/// A schedule is a pure function of the iteration, so it holds no state to checkpoint beyond the
/// iteration count the caller keeps.
class ZEROSHARD_API LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  /// DeepSpeed's type name, e.g. "WarmupLR".
  virtual std::string name() const = 0;
  /// Values for the optimizer step with 0-based index `iteration` (DeepSpeed's
  /// last_batch_iteration when that step runs): the values DeepSpeed's scheduler holds once its
  /// last_batch_iteration equals `iteration`.
  ///
  /// DeepSpeed's engine steps the scheduler after the optimizer, so its first update runs with
  /// last_batch_iteration -1, i.e. with the values the scheduler set when it was built. A negative
  /// `iteration` returns exactly those (WarmupLR: warmup_min_lr; WarmupCosineLR: 0; OneCycle:
  /// cycle_min_lr and cycle_min_mom; LRRangeTest: lr_range_test_min_lr). To reproduce DeepSpeed
  /// step for step, pass (number of updates done so far) - 1; steps skipped for overflow do not
  /// count, since DeepSpeed does not step the scheduler on them.
  virtual ScheduledValues at(std::int64_t iteration) const = 0;
};

/// Builds the schedule `config` describes, or returns nullptr when config.type is empty.
/// `optimizer_lr` is the optimizer's learning rate: WarmupCosineLR scales it, and WarmupLR warms up
/// to it when warmup_max_lr is not given (newest DeepSpeed; WarmupDecayLR keeps 0.001).
/// `optimizer_beta1` is the rule's beta1, or nullopt for rules without betas (SGD, Adagrad): as in
/// DeepSpeed, OneCycle then does not cycle momentum, and an explicit `cycle_momentum: true` is an
/// error. Throws ConfigError naming "scheduler.type" or "scheduler.params.<name>" on an unknown
/// type, an unknown or missing parameter, or a value out of range.
ZEROSHARD_API std::unique_ptr<LrScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                                             double optimizer_lr,
                                                             std::optional<double> optimizer_beta1);

}  // namespace zeroshard
