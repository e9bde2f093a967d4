// Element types of parameters, gradients and communication buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zeroshard/export.h"

namespace zeroshard {

/// The element types zeroshard stores and communicates.
enum class DType { kFloat32, kFloat16, kBFloat16 };

constexpr std::size_t size_of(DType dtype) noexcept { return dtype == DType::kFloat32 ? 4 : 2; }

/// "fp32", "fp16" or "bf16".
ZEROSHARD_API const char* to_string(DType dtype) noexcept;

/// Converts `count` elements from one type to another with round-to-nearest-even (SIMD where the
/// CPU has it), e.g. a 16-bit parameter into an fp32 working copy and an fp32 gradient back.
/// `in` and `out` must not overlap unless the types are equal.
ZEROSHARD_API void convert(const void* in, DType from, void* out, DType to,
                           std::int64_t count) noexcept;

}  // namespace zeroshard
