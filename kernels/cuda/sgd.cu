// torch.optim.SGD over a flat fp32 shard in one launch: L2 weight decay, momentum with dampening,
// Nesterov.
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernels.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

using detail::load;
using detail::store;
using detail::Vec;

struct SgdScalars {
  float lr;
  float weight_decay;
  float momentum;
  float one_minus_dampening;
  bool first_step;  ///< PyTorch starts a new momentum buffer as a copy of the gradient
  bool nesterov;
};

template <bool kMomentum>
struct SgdUpdate {
  float* param;
  const float* grad;
  float* momentum_buffer;
  SgdScalars s;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    Vec<K, float> p = load<K>(param + i);
    const Vec<K, float> g = load<K>(grad + i);
    Vec<K, float> buf;
    if constexpr (kMomentum) {
      if (!s.first_step) buf = load<K>(momentum_buffer + i);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float d = g.v[k];
      if (s.weight_decay != 0.0f) d = d + s.weight_decay * p.v[k];
      if constexpr (kMomentum) {
        buf.v[k] = s.first_step ? d : s.momentum * buf.v[k] + s.one_minus_dampening * d;
        d = s.nesterov ? d + s.momentum * buf.v[k] : buf.v[k];
      }
      p.v[k] = p.v[k] - s.lr * d;
    }
    store<K>(param + i, p);
    if constexpr (kMomentum) store<K>(momentum_buffer + i, buf);
  }
};

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t count,
              const SgdOptions& options, const StepContext& context, cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "sgd_step: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(context.step >= 1,
                        "sgd_step: step count must start at 1, got " << context.step);
  const double momentum = context.momentum.value_or(options.momentum);
  ZEROSHARD_CHECK_USAGE(count == 0 || (param && grad), "sgd_step: null parameter or gradient");
  ZEROSHARD_CHECK_USAGE(count == 0 || momentum == 0.0 || momentum_buffer,
                        "sgd_step: momentum " << momentum << " needs a momentum buffer");
  const SgdScalars scalars{static_cast<float>(context.lr),
                           static_cast<float>(context.weight_decay),
                           static_cast<float>(momentum),
                           static_cast<float>(1.0 - options.dampening),
                           context.step == 1,
                           options.nesterov};
  if (momentum != 0.0) {
    const detail::VectorSplit split =
        detail::split_for_vectors({{param, 4}, {grad, 4}, {momentum_buffer, 4}}, count);
    detail::launch_elementwise(SgdUpdate<true>{param, grad, momentum_buffer, scalars}, split,
                               stream, "sgd_step");
  } else {
    const detail::VectorSplit split = detail::split_for_vectors({{param, 4}, {grad, 4}}, count);
    detail::launch_elementwise(SgdUpdate<false>{param, grad, nullptr, scalars}, split, stream,
                               "sgd_step");
  }
}

}  // namespace zeroshard::kernels
