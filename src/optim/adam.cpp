// torch.optim.Adam: weight decay as an L2 term added to the gradient.
#include "optim/adam_core.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {

std::unique_ptr<UpdateRule> make_adam(const AdamOptions& options) {
  return detail::make_adam_core({.lr = options.lr,
                                 .beta1 = options.beta1,
                                 .beta2 = options.beta2,
                                 .eps = options.eps,
                                 .weight_decay = options.weight_decay,
                                 .amsgrad = options.amsgrad},
                                detail::AdamWeightDecay::kL2);
}

}  // namespace zeroshard
