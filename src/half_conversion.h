// Conversions between fp32 and the 16-bit types (fp16, bf16) with round-to-nearest-even, scalar
// and bulk; the bulk forms use F16C / AVX-512 where the CPU has them.
#pragma once

#include <cstdint>

#include "zeroshard/dtype.h"

namespace zeroshard::detail {

std::uint16_t float_to_half(float value) noexcept;
float half_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_bfloat16(float value) noexcept;
float bfloat16_to_float(std::uint16_t bits) noexcept;

/// Writes `count` elements of `to_dtype` at `out` from fp32 `in` (a plain copy for fp32).
void convert_from_float(const float* in, void* out, DType to_dtype, std::int64_t count) noexcept;
/// Writes `count` fp32 elements at `out` from `in` of `from_dtype` (a plain copy for fp32).
void convert_to_float(const void* in, DType from_dtype, float* out, std::int64_t count) noexcept;

}  // namespace zeroshard::detail
