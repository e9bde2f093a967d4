// torch.optim.AdamW: decoupled weight decay, p *= 1 - lr * weight_decay before the Adam step.
#include "optim/adam_core.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {

std::unique_ptr<UpdateRule> make_adamw(const AdamWOptions& options) {
  return detail::make_adam_core({.lr = options.lr,
                                 .beta1 = options.beta1,
                                 .beta2 = options.beta2,
                                 .eps = options.eps,
                                 .weight_decay = options.weight_decay,
                                 .amsgrad = options.amsgrad},
                                detail::AdamWeightDecay::kDecoupled);
}

}  // namespace zeroshard
