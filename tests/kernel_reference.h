// Plain, one-element-at-a-time CPU references of the CUDA kernels (llm.c's dev/cuda habit): the
// same formulas and operation order as kernels/, written for reading, not speed.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>

#include "zeroshard/optimizer.h"

namespace zeroshard::reference {

inline void adam_family_step(bool decoupled, std::span<float> param, std::span<const float> grad,
                             std::span<float> exp_avg, std::span<float> exp_avg_sq,
                             std::span<float> max_exp_avg_sq, bool amsgrad, double beta1_option,
                             double beta2, double eps, const StepContext& context) {
  const double beta1 = context.momentum.value_or(beta1_option);
  const auto step = static_cast<double>(context.step);
  const float b1 = static_cast<float>(beta1);
  const float one_minus_b1 = static_cast<float>(1.0 - beta1);
  const float b2 = static_cast<float>(beta2);
  const float one_minus_b2 = static_cast<float>(1.0 - beta2);
  const float wd = static_cast<float>(context.weight_decay);
  const float decay = static_cast<float>(1.0 - context.lr * context.weight_decay);
  const float step_size = static_cast<float>(context.lr / (1.0 - std::pow(beta1, step)));
  const float inv_bias_correction2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2, step)));
  const float eps_f = static_cast<float>(eps);
  for (std::size_t i = 0; i < param.size(); ++i) {
    float g = grad[i];
    if (wd != 0.0f) {
      if (decoupled) {
        param[i] = param[i] * decay;
      } else {
        g = g + wd * param[i];
      }
    }
    exp_avg[i] = b1 * exp_avg[i] + one_minus_b1 * g;
    exp_avg_sq[i] = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    float second_moment = exp_avg_sq[i];
    if (amsgrad) {
      max_exp_avg_sq[i] = std::max(max_exp_avg_sq[i], exp_avg_sq[i]);
      second_moment = max_exp_avg_sq[i];
    }
    const float denom = std::sqrt(second_moment) * inv_bias_correction2_sqrt + eps_f;
    param[i] = param[i] - step_size * exp_avg[i] / denom;
  }
}

inline void adamw_step(std::span<float> param, std::span<const float> grad,
                       std::span<float> exp_avg, std::span<float> exp_avg_sq,
                       std::span<float> max_exp_avg_sq, const AdamWOptions& options,
                       const StepContext& context) {
  adam_family_step(true, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, options.amsgrad,
                   options.beta1, options.beta2, options.eps, context);
}

inline void adam_step(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                      std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq,
                      const AdamOptions& options, const StepContext& context) {
  adam_family_step(false, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, options.amsgrad,
                   options.beta1, options.beta2, options.eps, context);
}

inline void sgd_step(std::span<float> param, std::span<const float> grad,
                     std::span<float> momentum_buffer, const SgdOptions& options,
                     const StepContext& context) {
  const double momentum = context.momentum.value_or(options.momentum);
  const float lr = static_cast<float>(context.lr);
  const float wd = static_cast<float>(context.weight_decay);
  const float mu = static_cast<float>(momentum);
  const float one_minus_dampening = static_cast<float>(1.0 - options.dampening);
  for (std::size_t i = 0; i < param.size(); ++i) {
    float d = grad[i];
    if (wd != 0.0f) d = d + wd * param[i];
    if (momentum != 0.0) {
      momentum_buffer[i] =
          context.step == 1 ? d : mu * momentum_buffer[i] + one_minus_dampening * d;
      d = options.nesterov ? d + mu * momentum_buffer[i] : momentum_buffer[i];
    }
    param[i] = param[i] - lr * d;
  }
}

inline void lion_step(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                      const LionOptions& options, const StepContext& context) {
  const double beta1 = context.momentum.value_or(options.beta1);
  const float lr = static_cast<float>(context.lr);
  const float decay = static_cast<float>(1.0 - context.lr * context.weight_decay);
  const float b1 = static_cast<float>(beta1);
  const float one_minus_b1 = static_cast<float>(1.0 - beta1);
  const float b2 = static_cast<float>(options.beta2);
  const float one_minus_b2 = static_cast<float>(1.0 - options.beta2);
  for (std::size_t i = 0; i < param.size(); ++i) {
    param[i] = param[i] * decay;
    const float c = b1 * exp_avg[i] + one_minus_b1 * grad[i];
    const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
    param[i] = param[i] - lr * sign;
    exp_avg[i] = b2 * exp_avg[i] + one_minus_b2 * grad[i];
  }
}

inline void adagrad_step(std::span<float> param, std::span<const float> grad,
                         std::span<float> state_sum, const AdagradOptions& options,
                         const StepContext& context) {
  const float clr = static_cast<float>(
      context.lr / (1.0 + static_cast<double>(context.step - 1) * options.lr_decay));
  const float wd = static_cast<float>(context.weight_decay);
  const float eps = static_cast<float>(options.eps);
  const float initial = static_cast<float>(options.initial_accumulator_value);
  for (std::size_t i = 0; i < param.size(); ++i) {
    // PyTorch starts the accumulator at initial_accumulator_value; the engine's state starts at 0.
    if (context.step == 1) state_sum[i] = initial;
    float d = grad[i];
    if (wd != 0.0f) d = d + wd * param[i];
    state_sum[i] = state_sum[i] + d * d;
    const float denom = std::sqrt(state_sum[i]) + eps;
    param[i] = param[i] - clr * d / denom;
  }
}

/// fp32 -> fp16 bits, round to nearest even, overflow to inf, subnormals kept (F. Giesen's
/// float_to_half_fast3_rtne).
inline std::uint16_t float_to_half(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  std::uint16_t result;
  if (bits >= (127u + 16u) << 23) {  // >= 65536: inf, or NaN
    result = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (bits < 113u << 23) {  // below fp16's smallest normal: subnormal or zero
    // Adding 0.5 aligns the 10 mantissa bits at the bottom; the FPU's own rounding is RNE.
    const float aligned = std::bit_cast<float>(bits) + 0.5f;
    result = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(aligned) - 0x3f000000u);
  } else {
    const std::uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
    result = static_cast<std::uint16_t>(bits >> 13);
  }
  return static_cast<std::uint16_t>(result | sign);
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// fp32 -> bf16 bits, round to nearest even; NaN stays NaN.
inline std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

inline float bfloat16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace zeroshard::reference
