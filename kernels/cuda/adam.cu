// torch.optim.Adam over a flat fp32 shard in one launch: L2 weight decay added to the gradient.
#include "kernels/cuda/adam_update.cuh"
#include "kernels/cuda/kernels.h"

namespace zeroshard::kernels {

void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
               float* max_exp_avg_sq, std::int64_t count, const AdamOptions& options,
               const StepContext& context, cudaStream_t stream) {
  const detail::AdamScalars scalars = detail::adam_scalars(context.momentum.value_or(options.beta1),
                                                           options.beta2, options.eps, context);
  detail::launch_adam<detail::WeightDecay::kL2>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                                count, options.amsgrad, scalars, stream,
                                                "adam_step");
}

}  // namespace zeroshard::kernels
