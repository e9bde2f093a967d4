// The Adam update shared by adam.cu (L2 weight decay added to the gradient) and adamw.cu
// (decoupled weight decay), with its host-computed step scalars.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "util/check.h"
#include "zeroshard/optimizer.h"

namespace zeroshard::kernels::detail {

enum class WeightDecay { kL2, kDecoupled };

/// The step's scalars, computed once on the host in double and rounded to float once, as
/// PyTorch passes Python floats to its kernels.
struct AdamScalars {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;               ///< kL2: added to the gradient as wd * p
  float decay;                      ///< kDecoupled: p *= 1 - lr * wd
  float step_size;                  ///< lr / (1 - beta1^step)
  float inv_bias_correction2_sqrt;  ///< 1 / sqrt(1 - beta2^step)
};

inline AdamScalars adam_scalars(double beta1, double beta2, double eps,
                                const StepContext& context) {
  ZEROSHARD_CHECK_USAGE(context.step >= 1, "Adam step count must start at 1, got " << context.step);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(context.step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(context.step));
  return {static_cast<float>(beta1),
          static_cast<float>(1.0 - beta1),
          static_cast<float>(beta2),
          static_cast<float>(1.0 - beta2),
          static_cast<float>(eps),
          static_cast<float>(context.weight_decay),
          static_cast<float>(1.0 - context.lr * context.weight_decay),
          static_cast<float>(context.lr / bias_correction1),
          static_cast<float>(1.0 / std::sqrt(bias_correction2))};
}

template <WeightDecay kWeightDecay, bool kAmsgrad>
struct AdamUpdate {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;
  AdamScalars s;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    Vec<K, float> p = load<K>(param + i);
    const Vec<K, float> g = load<K>(grad + i);
    Vec<K, float> m = load<K>(exp_avg + i);
    Vec<K, float> v = load<K>(exp_avg_sq + i);
    Vec<K, float> v_max;
    if constexpr (kAmsgrad) v_max = load<K>(max_exp_avg_sq + i);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float gk = g.v[k];
      if (s.weight_decay != 0.0f) {
        if constexpr (kWeightDecay == WeightDecay::kL2) {
          gk = gk + s.weight_decay * p.v[k];
        } else {
          p.v[k] = p.v[k] * s.decay;
        }
      }
      m.v[k] = s.beta1 * m.v[k] + s.one_minus_beta1 * gk;
      v.v[k] = s.beta2 * v.v[k] + s.one_minus_beta2 * gk * gk;
      float second_moment = v.v[k];
      if constexpr (kAmsgrad) {
        v_max.v[k] = fmaxf(v_max.v[k], v.v[k]);
        second_moment = v_max.v[k];
      }
      // A product with the reciprocal, as the CPU rule computes it (offload/cpu_rule_kernels.inc):
      // the two paths round alike, so that a GPU run equals its CPU reference bit for bit.
      const float denom = sqrtf(second_moment) * s.inv_bias_correction2_sqrt + s.eps;
      p.v[k] = p.v[k] - s.step_size * m.v[k] / denom;
    }
    store<K>(param + i, p);
    store<K>(exp_avg + i, m);
    store<K>(exp_avg_sq + i, v);
    if constexpr (kAmsgrad) store<K>(max_exp_avg_sq + i, v_max);
  }
};

template <WeightDecay kWeightDecay>
void launch_adam(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, std::int64_t count, bool amsgrad,
                 const AdamScalars& scalars, cudaStream_t stream, const char* what) {
  ZEROSHARD_CHECK_USAGE(count >= 0, what << ": negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || (param && grad && exp_avg && exp_avg_sq),
                        what << ": null parameter, gradient or state pointer");
  ZEROSHARD_CHECK_USAGE(count == 0 || !amsgrad || max_exp_avg_sq,
                        what << ": amsgrad needs the max_exp_avg_sq state array");
  if (amsgrad) {
    const VectorSplit split = split_for_vectors(
        {{param, 4}, {grad, 4}, {exp_avg, 4}, {exp_avg_sq, 4}, {max_exp_avg_sq, 4}}, count);
    launch_elementwise(
        AdamUpdate<kWeightDecay, true>{param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, scalars},
        split, stream, what);
  } else {
    const VectorSplit split =
        split_for_vectors({{param, 4}, {grad, 4}, {exp_avg, 4}, {exp_avg_sq, 4}}, count);
    launch_elementwise(
        AdamUpdate<kWeightDecay, false>{param, grad, exp_avg, exp_avg_sq, nullptr, scalars}, split,
        stream, what);
  }
}

}  // namespace zeroshard::kernels::detail
