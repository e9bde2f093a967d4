// Element types of parameters, gradients and communication buffers.
#pragma once

#include <cstddef>

namespace zeroshard {

/// The element types zeroshard stores and communicates.
enum class DType { kFloat32, kFloat16, kBFloat16 };

constexpr std::size_t size_of(DType dtype) noexcept { return dtype == DType::kFloat32 ? 4 : 2; }

/// "fp32", "fp16" or "bf16".
const char* to_string(DType dtype) noexcept;

}  // namespace zeroshard
