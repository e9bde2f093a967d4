// Element types of parameters, gradients and communication buffers, and conversions between
// fp32 and the 16-bit types for a model that computes in fp32 on 16-bit parameters.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zeroshard {

/// The element types zeroshard stores and communicates.
enum class DType { kFloat32, kFloat16, kBFloat16 };

constexpr std::size_t size_of(DType dtype) noexcept { return dtype == DType::kFloat32 ? 4 : 2; }

/// "fp32", "fp16" or "bf16".
const char* to_string(DType dtype) noexcept;

/// Writes `count` fp32 values at `out` from `count` elements of type `from` at `in`; exact (a
/// copy for fp32). E.g. a working copy of a 16-bit Parameter::raw_data() for the forward.
void to_float(const void* in, DType from, float* out, std::int64_t count) noexcept;
/// Writes `count` elements of type `to` at `out` from fp32 `in`, rounded to nearest even (beyond
/// the type's range: +-inf; a copy for fp32). E.g. storing a gradient into Parameter::raw_grad().
/// The same rounding the engine uses for its 16-bit copies, on every CPU.
void from_float(const float* in, void* out, DType to, std::int64_t count) noexcept;

}  // namespace zeroshard
