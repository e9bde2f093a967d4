// The rule behind both Adam and AdamW. They differ only in where weight decay enters (folded into
// the gradient as an L2 term, or applied to the weights before the step), so they share one kernel.
#pragma once

#include <memory>

#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

enum class AdamWeightDecay { kL2, kDecoupled };

/// Options common to torch.optim.Adam and torch.optim.AdamW.
struct AdamCoreOptions {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool amsgrad;
};

/// Validates `options` as torch.optim.Adam does and builds the rule ("adam" for kL2, "adamw" for
/// kDecoupled).
std::unique_ptr<UpdateRule> make_adam_core(const AdamCoreOptions& options,
                                           AdamWeightDecay weight_decay);

}  // namespace zeroshard::detail
