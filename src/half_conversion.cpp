// TEMPORARY scalar fp32 <-> fp16/bf16 conversions with round-to-nearest-even, so the comm branch
// builds and tests its 16-bit reductions; the real (SIMD) implementation replaces this at merge.
#include "half_conversion.h"

#include <bit>
#include <cstring>

namespace zeroshard::detail {

std::uint16_t float_to_half(float value) noexcept {
  constexpr std::uint32_t kFloatInfinity = 255u << 23;
  constexpr std::uint32_t kHalfOverflow = (127u + 16u) << 23;  // 2^16: rounds to inf or is NaN
  constexpr std::uint32_t kSmallestNormal = 113u << 23;        // 2^-14
  // 0.5 has an ulp of 2^-24, the fp16 subnormal step: adding it puts the subnormal mantissa in
  // the low bits of the sum, and the FPU's own round-to-nearest-even does the rounding.
  constexpr std::uint32_t kSubnormalMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;

  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  std::uint32_t out;
  if (bits >= kHalfOverflow) {
    out = bits > kFloatInfinity ? 0x7e00u : 0x7c00u;  // NaN stays a (quiet) NaN
  } else if (bits < kSmallestNormal) {
    const float shifted = std::bit_cast<float>(bits) + std::bit_cast<float>(kSubnormalMagic);
    out = std::bit_cast<std::uint32_t>(shifted) - kSubnormalMagic;
  } else {
    const std::uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
    out = bits >> 13;  // a carry into the exponent rounds up to the next binade or to inf
  }
  return static_cast<std::uint16_t>(out | (sign >> 16));
}

float half_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

std::uint16_t float_to_bfloat16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // keep NaN a quiet NaN
  }
  const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding_bias) >> 16);
}

float bfloat16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

void convert_from_float(const float* in, void* out, DType to_dtype, std::int64_t count) noexcept {
  auto* out16 = static_cast<std::uint16_t*>(out);
  switch (to_dtype) {
    case DType::kFloat32:
      std::memcpy(out, in, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16:
      for (std::int64_t i = 0; i < count; ++i) out16[i] = float_to_half(in[i]);
      return;
    case DType::kBFloat16:
      for (std::int64_t i = 0; i < count; ++i) out16[i] = float_to_bfloat16(in[i]);
      return;
  }
}

void convert_to_float(const void* in, DType from_dtype, float* out, std::int64_t count) noexcept {
  const auto* in16 = static_cast<const std::uint16_t*>(in);
  switch (from_dtype) {
    case DType::kFloat32:
      std::memcpy(out, in, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16:
      for (std::int64_t i = 0; i < count; ++i) out[i] = half_to_float(in16[i]);
      return;
    case DType::kBFloat16:
      for (std::int64_t i = 0; i < count; ++i) out[i] = bfloat16_to_float(in16[i]);
      return;
  }
}

}  // namespace zeroshard::detail
