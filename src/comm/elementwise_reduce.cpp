// inout = in (op) inout over fp32, fp64, fp16 and bf16, the 16-bit types through fp32 arithmetic.
#include "comm/elementwise_reduce.h"

#include <cmath>

#include "precision/half_conversion.h"

namespace zeroshard::detail {
namespace {

// NaN wins: a > NaN is false, so a NaN in `b` is kept as well.
template <class T>
T max_propagating_nan(T a, T b) noexcept {
  return (a > b || std::isnan(a)) ? a : b;
}

template <class T, bool kMax>
void reduce_wide(const T* a, T* b, std::int64_t count) noexcept {
  for (std::int64_t i = 0; i < count; ++i)
    b[i] = kMax ? max_propagating_nan(a[i], b[i]) : a[i] + b[i];
}

template <float (*ToFloat)(std::uint16_t), std::uint16_t (*FromFloat)(float), bool kMax>
void reduce_16bit(const std::uint16_t* a, std::uint16_t* b, std::int64_t count) noexcept {
  for (std::int64_t i = 0; i < count; ++i) {
    const float x = ToFloat(a[i]);
    const float y = ToFloat(b[i]);
    b[i] = FromFloat(kMax ? max_propagating_nan(x, y) : x + y);
  }
}

}  // namespace

void reduce_into(const void* in, void* inout, std::int64_t count, DType dtype,
                 ReduceOp op) noexcept {
  const bool max = op == ReduceOp::kMax;
  const auto* a16 = static_cast<const std::uint16_t*>(in);
  auto* b16 = static_cast<std::uint16_t*>(inout);
  switch (dtype) {
    case DType::kFloat32: {
      const auto* a = static_cast<const float*>(in);
      auto* b = static_cast<float*>(inout);
      return max ? reduce_wide<float, true>(a, b, count) : reduce_wide<float, false>(a, b, count);
    }
    case DType::kFloat64: {
      const auto* a = static_cast<const double*>(in);
      auto* b = static_cast<double*>(inout);
      return max ? reduce_wide<double, true>(a, b, count) : reduce_wide<double, false>(a, b, count);
    }
    case DType::kFloat16:
      return max ? reduce_16bit<half_to_float, float_to_half, true>(a16, b16, count)
                 : reduce_16bit<half_to_float, float_to_half, false>(a16, b16, count);
    case DType::kBFloat16:
      return max ? reduce_16bit<bfloat16_to_float, float_to_bfloat16, true>(a16, b16, count)
                 : reduce_16bit<bfloat16_to_float, float_to_bfloat16, false>(a16, b16, count);
  }
}

}  // namespace zeroshard::detail
