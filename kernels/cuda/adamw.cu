// torch.optim.AdamW over a flat fp32 shard in one launch: decoupled weight decay, then Adam.
#include "kernels/cuda/adam_update.cuh"
#include "kernels/cuda/kernels.h"

namespace zeroshard::kernels {

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                float* max_exp_avg_sq, std::int64_t count, const AdamWOptions& options,
                const StepContext& context, cudaStream_t stream) {
  const detail::AdamScalars scalars = detail::adam_scalars(context.momentum.value_or(options.beta1),
                                                           options.beta2, options.eps, context);
  detail::launch_adam<detail::WeightDecay::kDecoupled>(param, grad, exp_avg, exp_avg_sq,
                                                       max_exp_avg_sq, count, options.amsgrad,
                                                       scalars, stream, "adamw_step");
}

}  // namespace zeroshard::kernels
