// The overflow check of mixed precision: one pass that sets a device flag when any element of a
// buffer is inf or NaN, tested on the raw exponent bits.
#include <cstdint>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernels.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

template <DType kDType>
struct FindNonfinite {
  const detail::Storage<kDType>* data;

  template <int K>
  __device__ bool apply(std::int64_t i) const {
    const detail::Vec<K, detail::Storage<kDType>> x = detail::load<K>(data + i);
    bool nonfinite = false;
#pragma unroll
    for (int k = 0; k < K; ++k) nonfinite |= detail::is_nonfinite<kDType>(x.v[k]);
    return nonfinite;
  }
};

template <DType kDType>
void launch_check(const void* data, std::int64_t count, int* flag, cudaStream_t stream) {
  const auto* typed = static_cast<const detail::Storage<kDType>*>(data);
  const detail::VectorSplit split = detail::split_for_vectors({{typed, size_of(kDType)}}, count);
  detail::launch_elementwise(FindNonfinite<kDType>{typed}, split, stream, "check_nonfinite", flag);
}

}  // namespace

void check_nonfinite(const void* data, DType dtype, std::int64_t count, int* flag,
                     cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "check_nonfinite: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(flag != nullptr, "check_nonfinite: null flag");
  ZEROSHARD_CHECK_USAGE(count == 0 || data != nullptr, "check_nonfinite: null data");
  switch (dtype) {
    case DType::kFloat32:
      return launch_check<DType::kFloat32>(data, count, flag, stream);
    case DType::kFloat16:
      return launch_check<DType::kFloat16>(data, count, flag, stream);
    case DType::kBFloat16:
      return launch_check<DType::kBFloat16>(data, count, flag, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("check_nonfinite", dtype);
}

}  // namespace zeroshard::kernels
