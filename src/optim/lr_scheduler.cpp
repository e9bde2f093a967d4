// DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py) as pure functions of
// the iteration, and the reading and validation of the config's `scheduler.params`.
#include "zeroshard/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numbers>
#include <string>
#include <string_view>

#include "util/text.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

std::string key_path(std::string_view param) { return "scheduler.params." + std::string(param); }

// Step counts arrive as doubles; above 2^53 a double no longer holds every integer.
constexpr double kLargestExactInteger = 9007199254740992.0;

/// Reads `scheduler.params` for one schedule type, after checking that every given key is one
/// that type accepts.
class SchedulerParams {
 public:
  SchedulerParams(const SchedulerConfig& config, std::initializer_list<std::string_view> allowed)
      : config_(config) {
    auto reject_unknown = [&](const std::string& key) {
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) return;
      std::string list;
      for (std::string_view name : allowed) list += (list.empty() ? "" : ", ") + std::string(name);
      throw ConfigError(key_path(key), "unknown parameter for scheduler type '" + config.type +
                                           "'; allowed: " + list);
    };
    for (const auto& [key, value] : config.params) reject_unknown(key);
    for (const auto& [key, value] : config.string_params) reject_unknown(key);
  }

  bool has(std::string_view key) const {
    return config_.params.contains(std::string(key)) ||
           config_.string_params.contains(std::string(key));
  }

  std::optional<double> optional_number(std::string_view key) const {
    if (config_.string_params.contains(std::string(key))) {
      throw ConfigError(key_path(key), "expected a number, got a string");
    }
    const auto it = config_.params.find(std::string(key));
    if (it == config_.params.end()) return std::nullopt;
    return it->second;
  }

  double number(std::string_view key, double fallback) const {
    return optional_number(key).value_or(fallback);
  }

  double required_number(std::string_view key) const {
    const std::optional<double> value = optional_number(key);
    if (!value) {
      throw ConfigError(key_path(key), "required by scheduler type '" + config_.type + "'");
    }
    return *value;
  }

  /// A number that must be at least `min`.
  double at_least(std::string_view key, double fallback, double min) const {
    return check_at_least(key, number(key, fallback), min);
  }

  static double check_at_least(std::string_view key, double value, double min) {
    if (!(value >= min)) {
      throw ConfigError(key_path(key), "got " + detail::format_number(value) +
                                           ", expected a number >= " + detail::format_number(min));
    }
    return value;
  }

  static std::int64_t check_integer(std::string_view key, double value, double min) {
    if (!(value >= min) || value != std::floor(value) || value > kLargestExactInteger) {
      throw ConfigError(key_path(key),
                        "got " + detail::format_number(value) +
                            ", expected an integer >= " + detail::format_number(min));
    }
    return static_cast<std::int64_t>(value);
  }

  std::int64_t integer(std::string_view key, double fallback, double min) const {
    return check_integer(key, number(key, fallback), min);
  }

  /// A momentum (beta1), in [0, 1) as the update rules require.
  double momentum(std::string_view key, double fallback) const {
    const double value = number(key, fallback);
    if (!(value >= 0.0 && value < 1.0)) {
      throw ConfigError(key_path(key),
                        "got " + detail::format_number(value) + ", expected a number in [0, 1)");
    }
    return value;
  }

  bool flag(std::string_view key, bool fallback) const {
    const double value = number(key, fallback ? 1.0 : 0.0);
    if (value != 0.0 && value != 1.0) {
      throw ConfigError(key_path(key),
                        "expected true or false, got " + detail::format_number(value));
    }
    return value == 1.0;
  }

  std::string text(std::string_view key, std::string_view fallback) const {
    if (config_.params.contains(std::string(key))) {
      throw ConfigError(key_path(key), "expected a string, got a number");
    }
    const auto it = config_.string_params.find(std::string(key));
    return it == config_.string_params.end() ? std::string(fallback) : it->second;
  }

 private:
  const SchedulerConfig& config_;
};

ScheduledValues lr_only(double lr) {
  ScheduledValues values;
  values.lr = lr;
  return values;
}

enum class WarmupType { kLog, kLinear };

/// The warmup ramp shared by WarmupLR, WarmupDecayLR and WarmupCosineLR: 0 at iteration 0, rising
/// to 1 at warmup_num_steps.
class WarmupRamp {
 public:
  explicit WarmupRamp(const SchedulerParams& params)
      : num_steps_(std::max<std::int64_t>(2, params.integer("warmup_num_steps", 1000, 0))),
        inverse_log_num_steps_(1.0 / std::log(static_cast<double>(num_steps_))) {
    // DeepSpeed warns and falls back to log on an unknown type; a typo should not pass silently.
    const std::string type = params.text("warmup_type", "log");
    if (type == "linear") {
      type_ = WarmupType::kLinear;
    } else if (type != "log") {
      throw ConfigError(key_path("warmup_type"), "got '" + type + "', expected 'log' or 'linear'");
    }
  }

  /// DeepSpeed raises warmup_num_steps to 2 so that log(warmup_num_steps) is not 0; 0, the
  /// Hugging Face Trainer's default, is raised too.
  std::int64_t num_steps() const { return num_steps_; }
  bool in_warmup(std::int64_t iteration) const { return iteration < num_steps_; }

  double gamma(std::int64_t iteration) const {
    const auto x = static_cast<double>(iteration);
    if (type_ == WarmupType::kLog) return inverse_log_num_steps_ * std::log(x + 1.0);
    return x / static_cast<double>(num_steps_);
  }

 private:
  std::int64_t num_steps_;
  double inverse_log_num_steps_;
  WarmupType type_ = WarmupType::kLog;
};

/// total_num_steps: required, and no shorter than the warmup (DeepSpeed only warns).
std::int64_t read_total_num_steps(const SchedulerParams& params) {
  const std::int64_t total = SchedulerParams::check_integer(
      "total_num_steps", params.required_number("total_num_steps"), 1);
  const std::int64_t warmup = params.integer("warmup_num_steps", 1000, 0);
  if (total < warmup) {
    throw ConfigError(key_path("total_num_steps"), "got " + std::to_string(total) +
                                                       ", expected at least warmup_num_steps (" +
                                                       std::to_string(warmup) + ")");
  }
  return total;
}

/// WarmupLR (no total_num_steps): ramps from warmup_min_lr to warmup_max_lr, then holds.
/// WarmupDecayLR (with total_num_steps): after the ramp, decays linearly back to warmup_min_lr at
/// total_num_steps and stays there.
class WarmupLr final : public LrScheduler {
 public:
  WarmupLr(const SchedulerParams& params, double max_lr_default,
           std::optional<std::int64_t> total_num_steps)
      : ramp_(params),
        min_lr_(params.at_least("warmup_min_lr", 0.0, 0.0)),
        delta_lr_(params.at_least("warmup_max_lr", max_lr_default, 0.0) - min_lr_),
        total_num_steps_(total_num_steps) {}

  std::string name() const override { return total_num_steps_ ? "WarmupDecayLR" : "WarmupLR"; }

  ScheduledValues at(std::int64_t iteration) const override {
    if (iteration < 0) return lr_only(min_lr_);
    return lr_only(min_lr_ + delta_lr_ * gamma(iteration));
  }

 private:
  double gamma(std::int64_t iteration) const {
    if (ramp_.in_warmup(iteration)) return ramp_.gamma(iteration);
    if (!total_num_steps_) return 1.0;
    const auto total = static_cast<double>(*total_num_steps_);
    const double decay_steps = std::max(1.0, total - static_cast<double>(ramp_.num_steps()));
    return std::max(0.0, (total - static_cast<double>(iteration)) / decay_steps);
  }

  WarmupRamp ramp_;
  double min_lr_;
  double delta_lr_;
  std::optional<std::int64_t> total_num_steps_;
};

/// WarmupCosineLR: a ratio of the optimizer's lr, ramping from warmup_min_ratio to 1, then
/// following half a cosine down to cos_min_ratio at total_num_steps and staying there.
class WarmupCosineLr final : public LrScheduler {
 public:
  WarmupCosineLr(const SchedulerParams& params, double optimizer_lr)
      : ramp_(params),
        total_num_steps_(read_total_num_steps(params)),
        warmup_min_ratio_(params.at_least("warmup_min_ratio", 0.0, 0.0)),
        cos_min_ratio_(params.at_least("cos_min_ratio", 0.0001, 0.0)),
        optimizer_lr_(optimizer_lr) {}

  std::string name() const override { return "WarmupCosineLR"; }

  ScheduledValues at(std::int64_t iteration) const override {
    // DeepSpeed sets lr 0 when it builds this scheduler, so its first update does not move.
    if (iteration < 0) return lr_only(0.0);
    return lr_only(optimizer_lr_ * ratio(iteration));
  }

 private:
  double ratio(std::int64_t iteration) const {
    if (ramp_.in_warmup(iteration)) {
      return warmup_min_ratio_ + ramp_.gamma(iteration) * (1.0 - warmup_min_ratio_);
    }
    const auto steps_into_decay = static_cast<double>(iteration - ramp_.num_steps() + 1);
    const auto decay_steps =
        static_cast<double>(std::max<std::int64_t>(1, total_num_steps_ - ramp_.num_steps()));
    const double progress = std::min(1.0, steps_into_decay / decay_steps);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }

  WarmupRamp ramp_;
  std::int64_t total_num_steps_;
  double warmup_min_ratio_;
  double cos_min_ratio_;
  double optimizer_lr_;
};

/// OneCycle: one cycle of lr rising from cycle_min_lr to cycle_max_lr and back (momentum moving
/// the other way between cycle_max_mom and cycle_min_mom), optionally in stairs, then a decay
/// phase.
class OneCycle final : public LrScheduler {
 public:
  OneCycle(const SchedulerParams& params, std::optional<double> optimizer_beta1)
      : min_lr_(params.check_at_least("cycle_min_lr", params.required_number("cycle_min_lr"), 0.0)),
        max_lr_(params.check_at_least("cycle_max_lr", params.required_number("cycle_max_lr"), 0.0)),
        decay_lr_rate_(params.at_least("decay_lr_rate", 0.0, 0.0)),
        first_step_size_(static_cast<double>(params.integer("cycle_first_step_size", 2000, 1))),
        second_step_size_(
            static_cast<double>(params.integer("cycle_second_step_size", first_step_size_, 0))),
        total_size_(first_step_size_ + second_step_size_),
        step_ratio_(first_step_size_ / total_size_),
        first_stair_count_(params.integer("cycle_first_stair_count", 0, -1)),
        second_stair_count_(params.integer("cycle_second_stair_count",
                                           static_cast<double>(first_stair_count_), -1)),
        decay_step_size_(static_cast<double>(params.integer("decay_step_size", 0, 0))),
        min_mom_(params.momentum("cycle_min_mom", 0.8)),
        max_mom_(params.momentum("cycle_max_mom", 0.9)),
        decay_mom_rate_(params.number("decay_mom_rate", 0.0)) {
    cycle_momentum_ = params.flag("cycle_momentum", true);
    if (cycle_momentum_ && !optimizer_beta1) {
      // DeepSpeed cycles only optimizers with betas and turns the default off with a warning.
      if (params.has("cycle_momentum")) {
        throw ConfigError(key_path("cycle_momentum"),
                          "the optimizer has no betas (sgd, adagrad), so its momentum cannot "
                          "cycle; set cycle_momentum to false");
      }
      cycle_momentum_ = false;
    }
  }

  std::string name() const override { return "OneCycle"; }

  ScheduledValues at(std::int64_t iteration) const override {
    ScheduledValues values;
    if (iteration < 0) {
      // DeepSpeed's constructor sets cycle_min_lr and cycle_min_mom, not the formula's value.
      values.lr = min_lr_;
      if (cycle_momentum_) values.momentum = min_mom_;
      return values;
    }
    const auto x = static_cast<double>(iteration);
    if (x < total_size_) {
      const double scale = scale_factor(x + 1.0);
      values.lr = min_lr_ + (max_lr_ - min_lr_) * scale;
      if (cycle_momentum_) values.momentum = max_mom_ - (max_mom_ - min_mom_) * scale;
      return values;
    }
    // After the cycle: lr and momentum hold at cycle_min_lr and cycle_max_mom unless both
    // decay_step_size and the decay rate are non-zero (DeepSpeed's skip_*_decay).
    const bool decays = decay_step_size_ != 0.0;
    const double decay_interval = decays ? (x - total_size_ + 1.0) / decay_step_size_ : 0.0;
    values.lr = min_lr_;
    if (decays && decay_lr_rate_ != 0.0) values.lr /= 1.0 + decay_lr_rate_ * decay_interval;
    if (cycle_momentum_) {
      values.momentum = max_mom_;
      if (decays && decay_mom_rate_ != 0.0)
        *values.momentum *= 1.0 + decay_mom_rate_ * decay_interval;
    }
    return values;
  }

 private:
  /// Position in the cycle: 0 at its ends, 1 at the peak.
  double scale_factor(double batch_iteration) const {
    const double cycle = std::floor(1.0 + batch_iteration / total_size_);
    const double x = 1.0 + batch_iteration / total_size_ - cycle;
    double scale;
    std::int64_t stair_count;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stair_count = first_stair_count_;
    } else {
      scale = (x - 1.0) / (step_ratio_ - 1.0);
      stair_count = second_stair_count_;
    }
    if (stair_count <= 0) return scale;
    // Stairs are counted from the integer offset in the cycle, as DeepSpeed does: flooring the
    // float scale could land a whole stair low at a half-cycle boundary.
    const double stairs = static_cast<double>(stair_count);
    const double cycle_iteration = std::fmod(batch_iteration, total_size_);
    const double position = cycle_iteration <= first_step_size_
                                ? cycle_iteration * stairs / first_step_size_
                                : (total_size_ - cycle_iteration) * stairs / second_step_size_;
    return std::floor(position) / stairs;
  }

  double min_lr_;
  double max_lr_;
  double decay_lr_rate_;
  double first_step_size_;
  double second_step_size_;
  double total_size_;
  double step_ratio_;
  std::int64_t first_stair_count_;
  std::int64_t second_stair_count_;
  double decay_step_size_;
  double min_mom_;
  double max_mom_;
  double decay_mom_rate_;
  bool cycle_momentum_ = true;
};

/// LRRangeTest: lr grows from lr_range_test_min_lr by step_rate every step_size iterations,
/// continuously or in stairs.
class LrRangeTest final : public LrScheduler {
 public:
  explicit LrRangeTest(const SchedulerParams& params)
      : min_lr_(params.at_least("lr_range_test_min_lr", 1e-3, 0.0)),
        step_size_(static_cast<double>(params.integer("lr_range_test_step_size", 2000, 1))),
        step_rate_(params.at_least("lr_range_test_step_rate", 1.0, 0.0)),
        staircase_(params.flag("lr_range_test_staircase", false)) {}

  std::string name() const override { return "LRRangeTest"; }

  ScheduledValues at(std::int64_t iteration) const override {
    if (iteration < 0) return lr_only(min_lr_);
    const double interval = static_cast<double>(iteration + 1) / step_size_;
    return lr_only(min_lr_ * (1.0 + step_rate_ * (staircase_ ? std::floor(interval) : interval)));
  }

 private:
  double min_lr_;
  double step_size_;
  double step_rate_;
  bool staircase_;
};

}  // namespace

std::unique_ptr<LrScheduler> make_lr_scheduler(const SchedulerConfig& config, double optimizer_lr,
                                               std::optional<double> optimizer_beta1) {
  const std::string& type = config.type;
  if (type.empty()) return nullptr;
  if (type == "WarmupLR") {
    const SchedulerParams params(
        config, {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"});
    return std::make_unique<WarmupLr>(params, optimizer_lr, std::nullopt);
  }
  if (type == "WarmupDecayLR") {
    const SchedulerParams params(config, {"total_num_steps", "warmup_min_lr", "warmup_max_lr",
                                          "warmup_num_steps", "warmup_type"});
    return std::make_unique<WarmupLr>(params, 0.001, read_total_num_steps(params));
  }
  if (type == "WarmupCosineLR") {
    const SchedulerParams params(config, {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                          "cos_min_ratio", "warmup_type"});
    return std::make_unique<WarmupCosineLr>(params, optimizer_lr);
  }
  if (type == "OneCycle") {
    const SchedulerParams params(
        config,
        {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
         "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
         "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"});
    return std::make_unique<OneCycle>(params, optimizer_beta1);
  }
  if (type == "LRRangeTest") {
    const SchedulerParams params(config, {"lr_range_test_min_lr", "lr_range_test_step_size",
                                          "lr_range_test_step_rate", "lr_range_test_staircase"});
    return std::make_unique<LrRangeTest>(params);
  }
  throw ConfigError("scheduler.type", "got '" + type +
                                          "', expected one of WarmupLR, WarmupDecayLR, "
                                          "WarmupCosineLR, OneCycle, LRRangeTest (as DeepSpeed "
                                          "spells them)");
}

}  // namespace zeroshard
