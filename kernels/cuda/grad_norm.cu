// The sum of squares behind the global gradient norm: one CUB DeviceReduce::TransformReduce over
// a buffer, accumulated in double so the result does not depend on the count's magnitude.
#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/kernels.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

template <DType kDType>
struct Square {
  __device__ double operator()(detail::Storage<kDType> x) const {
    const double value = detail::to_float<kDType>(x);
    return value * value;
  }
};

// With workspace == nullptr only computes the workspace size, as CUB does.
template <DType kDType>
void transform_reduce(const void* data, std::int64_t count, double* result, void* workspace,
                      std::size_t& workspace_bytes, cudaStream_t stream) {
  ZEROSHARD_CUDA_CHECK(cub::DeviceReduce::TransformReduce(
      workspace, workspace_bytes, static_cast<const detail::Storage<kDType>*>(data), result, count,
      ::cuda::std::plus<double>{}, Square<kDType>{}, 0.0, stream));
}

void dispatch(const void* data, DType dtype, std::int64_t count, double* result, void* workspace,
              std::size_t& workspace_bytes, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32:
      return transform_reduce<DType::kFloat32>(data, count, result, workspace, workspace_bytes,
                                               stream);
    case DType::kFloat16:
      return transform_reduce<DType::kFloat16>(data, count, result, workspace, workspace_bytes,
                                               stream);
    case DType::kBFloat16:
      return transform_reduce<DType::kBFloat16>(data, count, result, workspace, workspace_bytes,
                                                stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("sum_of_squares", dtype);
}

}  // namespace

std::size_t sum_of_squares_workspace_bytes(DType dtype, std::int64_t count) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "sum_of_squares: negative element count " << count);
  std::size_t bytes = 0;
  dispatch(nullptr, dtype, count, nullptr, nullptr, bytes, nullptr);
  return bytes;
}

void sum_of_squares(const void* data, DType dtype, std::int64_t count, double* result,
                    void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "sum_of_squares: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(result != nullptr && (count == 0 || data != nullptr),
                        "sum_of_squares: null data or result");
  const std::size_t needed = sum_of_squares_workspace_bytes(dtype, count);
  ZEROSHARD_CHECK_USAGE(
      workspace != nullptr && workspace_bytes >= needed,
      "sum_of_squares: workspace of " << workspace_bytes << " bytes, needs " << needed);
  dispatch(data, dtype, count, result, workspace, workspace_bytes, stream);
}

}  // namespace zeroshard::kernels
