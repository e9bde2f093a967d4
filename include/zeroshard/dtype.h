// Element types of parameters, gradients and communication buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zeroshard/export.h"

namespace zeroshard {

/// The element types zeroshard stores and communicates. Parameters and gradients are fp32, fp16
/// or bf16 (the config's choice); fp64 is for a program's own collectives, conversions and
/// weight exports.
enum class DType { kFloat32, kFloat16, kBFloat16, kFloat64 };

constexpr std::size_t size_of(DType dtype) noexcept {
  return dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
}

/// "fp32", "fp16", "bf16" or "fp64".
ZEROSHARD_API const char* to_string(DType dtype) noexcept;

/// Converts `count` elements from one type to another with round-to-nearest-even (SIMD where the
/// CPU has it), e.g. a 16-bit parameter into an fp32 working copy and an fp32 gradient back.
/// `in` and `out` must not overlap unless the types are equal.
ZEROSHARD_API void convert(const void* in, DType from, void* out, DType to,
                           std::int64_t count) noexcept;

}  // namespace zeroshard
