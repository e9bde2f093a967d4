// Block quantization of ZeRO++ on the GPU: one warp per block of kQuantBlockElements, with the
// per-block arithmetic of comm/quantized_block_format.h, so the bytes equal the CPU encoder's.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernels.h"
#include "layout/quantized_block_format.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

using zeroshard::detail::kQuantBlockElements;
using zeroshard::detail::QuantBits;
namespace quant = zeroshard::detail::quant;

constexpr int kWarpLanes = 32;
constexpr int kWarpsPerBlock = detail::kBlockThreads / kWarpLanes;
// In pass p a lane takes the element pair 64p + 2 * lane (+ 1) of its warp's block: each pass of a
// warp reads and writes consecutive memory, and an int4 pair is one lane's byte.
constexpr int kPasses = kQuantBlockElements / (2 * kWarpLanes);
static_assert(kPasses * 2 * kWarpLanes == kQuantBlockElements);

__device__ __forceinline__ std::int64_t first_warp_block() {
  return std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarpLanes;
}

__device__ __forceinline__ std::int64_t warp_block_stride() {
  return std::int64_t{gridDim.x} * kWarpsPerBlock;
}

template <DType kDType>
__global__ void __launch_bounds__(detail::kBlockThreads)
    quantize_kernel(const detail::Storage<kDType>* in, std::int64_t count, QuantBits bits,
                    float* scales, std::uint8_t* codes, int* nonfinite_blocks) {
  const int lane = static_cast<int>(threadIdx.x % kWarpLanes);
  const std::int64_t blocks = zeroshard::detail::quant_block_count(count);
  // The loop bound is the same for the whole warp, so every lane reaches the shuffles.
  for (std::int64_t block = first_warp_block(); block < blocks; block += warp_block_stride()) {
    const std::int64_t first = block * kQuantBlockElements;
    float values[2 * kPasses];
    std::uint32_t max_magnitude = 0;
#pragma unroll
    for (int v = 0; v < 2 * kPasses; ++v) {
      const std::int64_t i = first + 2 * ((v / 2) * kWarpLanes + lane) + v % 2;
      // Padding past the end is 0, which leaves the max as it is.
      values[v] = i < count ? detail::to_float<kDType>(in[i]) : 0.0f;
      const std::uint32_t magnitude = quant::magnitude_bits(values[v]);
      max_magnitude = magnitude > max_magnitude ? magnitude : max_magnitude;
    }
#pragma unroll
    for (int offset = kWarpLanes / 2; offset > 0; offset /= 2) {
      const std::uint32_t other = __shfl_xor_sync(0xffffffffu, max_magnitude, offset);
      max_magnitude = other > max_magnitude ? other : max_magnitude;
    }
    const float scale = quant::block_scale(max_magnitude, bits);
    if (lane == 0) {
      scales[block] = scale;
      if (max_magnitude >= quant::kExponentBits) atomicAdd(nonfinite_blocks, 1);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const std::int64_t i = first + 2 * (p * kWarpLanes + lane);
      if (i >= count) continue;
      const int low = quant::quantize_value(values[2 * p], scale, bits);
      const int high = i + 1 < count ? quant::quantize_value(values[2 * p + 1], scale, bits) : 0;
      if (bits == QuantBits::kInt8) {
        codes[i] = static_cast<std::uint8_t>(low);
        if (i + 1 < count) codes[i + 1] = static_cast<std::uint8_t>(high);
      } else {
        codes[i / 2] = quant::pack_int4(low, high);
      }
    }
  }
}

template <DType kDType>
__global__ void __launch_bounds__(detail::kBlockThreads)
    dequantize_kernel(const float* scales, const std::uint8_t* codes, QuantBits bits,
                      std::int64_t count, detail::Storage<kDType>* out) {
  const int lane = static_cast<int>(threadIdx.x % kWarpLanes);
  const std::int64_t blocks = zeroshard::detail::quant_block_count(count);
  for (std::int64_t block = first_warp_block(); block < blocks; block += warp_block_stride()) {
    const std::int64_t first = block * kQuantBlockElements;
    const float scale = scales[block];
#pragma unroll
    for (int v = 0; v < 2 * kPasses; ++v) {
      const std::int64_t i = first + 2 * ((v / 2) * kWarpLanes + lane) + v % 2;
      if (i >= count) continue;
      const int code =
          bits == QuantBits::kInt8
              ? static_cast<std::int8_t>(codes[i])
              : quant::unpack_int4(static_cast<unsigned>(codes[i / 2]) >> (4 * (v % 2)));
      out[i] = detail::from_float<kDType>(quant::dequantize_value(code, scale));
    }
  }
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t warps_needed = zeroshard::detail::quant_block_count(count);
  const std::int64_t blocks = (warps_needed + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::min(blocks, detail::resident_block_limit()));
}

void check_launch(const char* what) {
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    cuda::throw_cuda_error(error, what, __FILE__, __LINE__);
  }
}

void check_arguments(const char* what, std::int64_t count, const void* in, const void* out,
                     const void* encoded) {
  ZEROSHARD_CHECK_USAGE(count >= 0, what << ": negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || (in != nullptr && out != nullptr),
                        what << ": null buffer for " << count << " elements");
  ZEROSHARD_CHECK_USAGE(reinterpret_cast<std::uintptr_t>(encoded) % alignof(float) == 0,
                        what << ": encoded buffer at " << encoded
                             << " is not 4-byte aligned (it starts with fp32 scales)");
}

template <DType kDType>
void launch_quantize(const void* in, std::int64_t count, QuantBits bits, void* out,
                     int* nonfinite_blocks, cudaStream_t stream) {
  auto* scales = static_cast<float*>(out);
  auto* codes = static_cast<std::uint8_t*>(out) + zeroshard::detail::quant_codes_offset(count);
  quantize_kernel<kDType><<<grid_for(count), detail::kBlockThreads, 0, stream>>>(
      static_cast<const detail::Storage<kDType>*>(in), count, bits, scales, codes,
      nonfinite_blocks);
  check_launch("quantize_blocks");
}

template <DType kDType>
void launch_dequantize(const void* in, QuantBits bits, std::int64_t count, void* out,
                       cudaStream_t stream) {
  const auto* scales = static_cast<const float*>(in);
  const auto* codes =
      static_cast<const std::uint8_t*>(in) + zeroshard::detail::quant_codes_offset(count);
  dequantize_kernel<kDType><<<grid_for(count), detail::kBlockThreads, 0, stream>>>(
      scales, codes, bits, count, static_cast<detail::Storage<kDType>*>(out));
  check_launch("dequantize_blocks");
}

}  // namespace

void quantize_blocks(const void* in, DType dtype, std::int64_t count, QuantBits bits, void* out,
                     int* nonfinite_blocks, cudaStream_t stream) {
  check_arguments("quantize_blocks", count, in, out, out);
  ZEROSHARD_CHECK_USAGE(nonfinite_blocks != nullptr, "quantize_blocks: null non-finite counter");
  if (count == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      return launch_quantize<DType::kFloat32>(in, count, bits, out, nonfinite_blocks, stream);
    case DType::kFloat16:
      return launch_quantize<DType::kFloat16>(in, count, bits, out, nonfinite_blocks, stream);
    case DType::kBFloat16:
      return launch_quantize<DType::kBFloat16>(in, count, bits, out, nonfinite_blocks, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("quantize_blocks", dtype);
}

void dequantize_blocks(const void* in, QuantBits bits, std::int64_t count, void* out, DType dtype,
                       cudaStream_t stream) {
  check_arguments("dequantize_blocks", count, in, out, in);
  if (count == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      return launch_dequantize<DType::kFloat32>(in, bits, count, out, stream);
    case DType::kFloat16:
      return launch_dequantize<DType::kFloat16>(in, bits, count, out, stream);
    case DType::kBFloat16:
      return launch_dequantize<DType::kBFloat16>(in, bits, count, out, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("dequantize_blocks", dtype);
}

}  // namespace zeroshard::kernels
