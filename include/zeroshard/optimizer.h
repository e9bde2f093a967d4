// Element-wise update rules (AdamW, Adam, SGD, Lion, Adagrad) and the interface for a user's own
// rule. A rule only ever sees this rank's shard of the fp32 master weights.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "zeroshard/export.h"

namespace zeroshard {

class Config;

/// The piece of one parameter tensor that falls inside this rank's shard. Rules that need
/// per-tensor quantities (LAMB-style trust ratios) use the boundaries; purely element-wise rules
/// ignore them.
struct ShardSlice {
  std::string_view param_name;
  std::int64_t param_numel = 0;      ///< elements of the whole tensor
  std::int64_t offset_in_param = 0;  ///< where this slice starts inside the tensor
  std::int64_t size = 0;             ///< elements in this slice
  float* param = nullptr;            ///< fp32 master weights of the slice (updated in place)
  const float* grad = nullptr;       ///< the reduced, unscaled, clipped fp32 gradient
  std::span<float* const> states;    ///< state_count() arrays of `size` elements, zero at start
};

/// Per-step scalars, after the learning-rate schedule and the parameter group's overrides.
struct StepContext {
  std::int64_t step = 1;  ///< 1 on the first update, as in PyTorch
  double lr = 0.0;
  double weight_decay = 0.0;
  /// Set by schedulers that cycle momentum (OneCycle): replaces beta1 (Adam, AdamW, Lion) or
  /// momentum (SGD) for this step.
  std::optional<double> momentum;
};

/// An element-wise update rule over fp32 shards. Implementations are stateless apart from their
/// options: the per-element state lives in the arrays the engine hands over.
class ZEROSHARD_API UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  /// Lower-case name, e.g. "adamw".
  virtual std::string name() const = 0;
  /// Number of fp32 state arrays per element (Adam 2, SGD with momentum 1, plain SGD 0).
  virtual int state_count() const = 0;
  /// The learning rate and weight decay the rule was built with (parameter groups override them).
  virtual double default_lr() const = 0;
  virtual double default_weight_decay() const = 0;
  /// The first-moment coefficient a momentum schedule (OneCycle) cycles; none for rules without
  /// betas.
  virtual std::optional<double> beta1() const { return std::nullopt; }
  /// Updates one slice in place.
  virtual void apply(const ShardSlice& slice, const StepContext& context) const = 0;
};

/// torch.optim.AdamW: decoupled weight decay.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;  ///< adds a third state array (max of v)
};
/// torch.optim.Adam: L2 weight decay added to the gradient.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
};
/// torch.optim.SGD.
struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};
/// Lion (Chen et al. 2023), as in lion-pytorch / DeepSpeed's FusedLion.
struct LionOptions {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
};
/// torch.optim.Adagrad.
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

/// Factories; each validates its options in PyTorch's words ("Invalid learning rate: -1") and
/// throws ConfigError (key path "optimizer.params.<name>") on a bad value.
ZEROSHARD_API std::unique_ptr<UpdateRule> make_adamw(const AdamWOptions& options = {});
ZEROSHARD_API std::unique_ptr<UpdateRule> make_adam(const AdamOptions& options = {});
ZEROSHARD_API std::unique_ptr<UpdateRule> make_sgd(const SgdOptions& options = {});
ZEROSHARD_API std::unique_ptr<UpdateRule> make_lion(const LionOptions& options = {});
ZEROSHARD_API std::unique_ptr<UpdateRule> make_adagrad(const AdagradOptions& options = {});

/// The rule a config's `optimizer` section describes (DeepSpeed's names, case-insensitive:
/// adam, adamw, sgd, lion, adagrad; `adam` honours `adam_w_mode`, default true). Throws
/// ConfigError when the config has no optimizer section or names one zeroshard does not have.
ZEROSHARD_API std::unique_ptr<UpdateRule> make_update_rule(const Config& config);

}  // namespace zeroshard
