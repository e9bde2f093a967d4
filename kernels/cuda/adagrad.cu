// torch.optim.Adagrad over a flat fp32 shard in one launch: L2 weight decay, the decayed learning
// rate computed on the host, and the accumulator's initial value folded into the first step.
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernels.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

using detail::load;
using detail::store;
using detail::Vec;

struct AdagradScalars {
  float clr;  ///< lr / (1 + (step - 1) * lr_decay)
  float weight_decay;
  float eps;
  /// initial_accumulator_value on step 1, else 0: the engine hands over zeroed state, and
  /// 0 + init + g*g rounds exactly as PyTorch's init + g*g.
  float accumulator_offset;
};

struct AdagradUpdate {
  float* param;
  const float* grad;
  float* state_sum;
  AdagradScalars s;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    Vec<K, float> p = load<K>(param + i);
    const Vec<K, float> g = load<K>(grad + i);
    Vec<K, float> sum = load<K>(state_sum + i);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float d = g.v[k];
      if (s.weight_decay != 0.0f) d = d + s.weight_decay * p.v[k];
      sum.v[k] = (sum.v[k] + s.accumulator_offset) + d * d;
      const float denom = sqrtf(sum.v[k]) + s.eps;
      p.v[k] = p.v[k] - s.clr * d / denom;
    }
    store<K>(param + i, p);
    store<K>(state_sum + i, sum);
  }
};

}  // namespace

void adagrad_step(float* param, const float* grad, float* state_sum, std::int64_t count,
                  const AdagradOptions& options, const StepContext& context, cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "adagrad_step: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(context.step >= 1,
                        "adagrad_step: step count must start at 1, got " << context.step);
  ZEROSHARD_CHECK_USAGE(count == 0 || (param && grad && state_sum),
                        "adagrad_step: null parameter, gradient or state pointer");
  const double clr = context.lr / (1.0 + static_cast<double>(context.step - 1) * options.lr_decay);
  const AdagradScalars scalars{
      static_cast<float>(clr), static_cast<float>(context.weight_decay),
      static_cast<float>(options.eps),
      context.step == 1 ? static_cast<float>(options.initial_accumulator_value) : 0.0f};
  const detail::VectorSplit split =
      detail::split_for_vectors({{param, 4}, {grad, 4}, {state_sum, 4}}, count);
  detail::launch_elementwise(AdagradUpdate{param, grad, state_sum, scalars}, split, stream,
                             "adagrad_step");
}

}  // namespace zeroshard::kernels
