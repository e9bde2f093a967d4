// Conversions between fp32 and the 16-bit types (fp16, bf16) with round-to-nearest-even, scalar
// and bulk; the bulk forms use F16C / AVX-512 where the CPU has them.
#pragma once

#include <cstdint>

#include "zeroshard/dtype.h"

namespace zeroshard::detail {

// Every path below gives bit-identical results, NaN payloads included, so that a run does not
// depend on the CPU it lands on: fp32 -> 16-bit rounds to nearest even, overflows to +-inf, keeps
// subnormals, and turns a NaN into a quiet NaN that keeps its sign and the payload bits that fit
// (what F16C and AVX512-BF16 do in hardware); 16-bit -> fp32 is exact, except that a signalling
// NaN comes back quiet.
std::uint16_t float_to_half(float value) noexcept;
float half_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_bfloat16(float value) noexcept;
float bfloat16_to_float(std::uint16_t bits) noexcept;

// The bulk forms write nothing when `count` <= 0; `in` and `out` must not overlap unless they
// are the same fp32 buffer, and 16-bit buffers must be 2-byte aligned.

/// Writes `count` elements of `to_dtype` at `out` from fp32 `in` (a plain copy for fp32).
void convert_from_float(const float* in, void* out, DType to_dtype, std::int64_t count) noexcept;
/// Writes `count` fp32 elements at `out` from `in` of `from_dtype` (a plain copy for fp32).
void convert_to_float(const void* in, DType from_dtype, float* out, std::int64_t count) noexcept;

/// The same conversions without SIMD, for tests to compare the run-time-chosen path against.
void convert_from_float_portable(const float* in, void* out, DType to_dtype,
                                 std::int64_t count) noexcept;
void convert_to_float_portable(const void* in, DType from_dtype, float* out,
                               std::int64_t count) noexcept;

/// Whether the CPU has F16C's fp16 conversions (x86 only; false elsewhere).
bool cpu_has_f16c() noexcept;

/// Names the instruction set the bulk conversions use for `dtype` on this CPU ("f16c",
/// "avx512bf16", "avx2" or "portable"), for test logs and benchmark labels.
const char* bulk_conversion_isa(DType dtype) noexcept;

}  // namespace zeroshard::detail
