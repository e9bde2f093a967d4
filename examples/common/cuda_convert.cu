// The fp32 <-> fp16/bf16 conversion kernels of the example models, one thread per element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "cuda_convert.h"

namespace zeroshard::examples {
namespace {

template <class From, class To>
__global__ void convert_kernel(const From* in, To* out, std::int64_t count) {
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k >= count) return;
  if constexpr (std::is_same_v<To, __half>) {
    out[k] = __float2half_rn(in[k]);
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    out[k] = __float2bfloat16_rn(in[k]);
  } else {
    out[k] = static_cast<float>(in[k]);
  }
}

}  // namespace

void convert_on_stream(const void* in, DType from, void* out, DType to, std::int64_t count,
                       cudaStream_t stream, const CudaCheck& check) {
  const unsigned blocks = blocks_for(count);
  if (from == DType::kFloat32 && to == DType::kFloat16) {
    convert_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(in),
                                                    static_cast<__half*>(out), count);
  } else if (from == DType::kFloat32 && to == DType::kBFloat16) {
    convert_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(in),
                                                    static_cast<__nv_bfloat16*>(out), count);
  } else if (from == DType::kFloat16 && to == DType::kFloat32) {
    convert_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(in),
                                                    static_cast<float*>(out), count);
  } else if (from == DType::kBFloat16 && to == DType::kFloat32) {
    convert_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in),
                                                    static_cast<float*>(out), count);
  } else {
    throw UsageError(std::string(check.owner()) + ": no conversion from " + to_string(from) +
                     " to " + to_string(to));
  }
  check(cudaGetLastError(), "convert");
}

}  // namespace zeroshard::examples
