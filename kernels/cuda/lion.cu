// Lion (Chen et al. 2023, as lion-pytorch and DeepSpeed's FusedLion) over a flat fp32 shard in one
// launch: decoupled weight decay, a sign update, then the momentum update.
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernels.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

using detail::load;
using detail::store;
using detail::Vec;

struct LionScalars {
  float lr;
  float decay;  ///< 1 - lr * wd
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
};

struct LionUpdate {
  float* param;
  const float* grad;
  float* exp_avg;
  LionScalars s;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    Vec<K, float> p = load<K>(param + i);
    const Vec<K, float> g = load<K>(grad + i);
    Vec<K, float> m = load<K>(exp_avg + i);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      p.v[k] = p.v[k] * s.decay;
      const float c = s.beta1 * m.v[k] + s.one_minus_beta1 * g.v[k];
      // torch.sign: -1, 0 or +1 (0 for NaN as well).
      const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
      p.v[k] = p.v[k] - s.lr * sign;
      m.v[k] = s.beta2 * m.v[k] + s.one_minus_beta2 * g.v[k];
    }
    store<K>(param + i, p);
    store<K>(exp_avg + i, m);
  }
};

}  // namespace

void lion_step(float* param, const float* grad, float* exp_avg, std::int64_t count,
               const LionOptions& options, const StepContext& context, cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "lion_step: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || (param && grad && exp_avg),
                        "lion_step: null parameter, gradient or state pointer");
  const double beta1 = context.momentum.value_or(options.beta1);
  const LionScalars scalars{static_cast<float>(context.lr),
                            static_cast<float>(1.0 - context.lr * context.weight_decay),
                            static_cast<float>(beta1),
                            static_cast<float>(1.0 - beta1),
                            static_cast<float>(options.beta2),
                            static_cast<float>(1.0 - options.beta2)};
  const detail::VectorSplit split =
      detail::split_for_vectors({{param, 4}, {grad, 4}, {exp_avg, 4}}, count);
  detail::launch_elementwise(LionUpdate{param, grad, exp_avg, scalars}, split, stream, "lion_step");
}

}  // namespace zeroshard::kernels
