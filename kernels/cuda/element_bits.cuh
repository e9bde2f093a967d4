// Device conversions between fp32 and the raw 16-bit patterns of fp16 and bf16 (round to nearest
// even), and non-finite tests on raw bits; 16-bit data travels as uint16_t so that no half type
// reaches a kernel's interface.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "zeroshard/dtype.h"
#include "zeroshard/error.h"

namespace zeroshard::kernels::detail {

/// The kernels handle the model precisions (fp32, fp16, bf16); fp64 is only ever communicated.
[[noreturn]] inline void throw_not_model_dtype(const char* kernel, DType dtype) {
  throw UsageError(std::string(kernel) + ": got " + to_string(dtype) +
                   " data, expected fp32, fp16 or bf16");
}

/// The storage type of a DType's elements on the device.
template <DType kDType>
using Storage = std::conditional_t<kDType == DType::kFloat32, float, std::uint16_t>;

template <DType kDType>
__device__ __forceinline__ float to_float(Storage<kDType> x) {
  if constexpr (kDType == DType::kFloat32) {
    return x;
  } else if constexpr (kDType == DType::kFloat16) {
    return __half2float(__ushort_as_half(x));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(x));
  }
}

template <DType kDType>
__device__ __forceinline__ Storage<kDType> from_float(float x) {
  if constexpr (kDType == DType::kFloat32) {
    return x;
  } else if constexpr (kDType == DType::kFloat16) {
    return __half_as_ushort(__float2half_rn(x));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
}

/// True for inf and NaN: all exponent bits set.
template <DType kDType>
__device__ __forceinline__ bool is_nonfinite(Storage<kDType> x) {
  if constexpr (kDType == DType::kFloat32) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
  } else if constexpr (kDType == DType::kFloat16) {
    return (x & 0x7c00u) == 0x7c00u;
  } else {
    return (x & 0x7f80u) == 0x7f80u;
  }
}

}  // namespace zeroshard::kernels::detail
