// Casts between the fp32 master copy and 16-bit tensors (round to nearest even), and the fused
// upcast + unscale of gradients (optionally with the inf/NaN check) in one pass.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernels.h"
#include "util/check.h"

namespace zeroshard::kernels {
namespace {

using detail::load;
using detail::Storage;
using detail::store;
using detail::Vec;

template <DType kTo>
struct FromFloat {
  const float* in;
  Storage<kTo>* out;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    const Vec<K, float> x = load<K>(in + i);
    Vec<K, Storage<kTo>> y;
#pragma unroll
    for (int k = 0; k < K; ++k) y.v[k] = detail::from_float<kTo>(x.v[k]);
    store<K>(out + i, y);
  }
};

template <DType kFrom>
struct ToFloatScaled {
  const Storage<kFrom>* in;
  float* out;
  float multiplier;

  template <int K>
  __device__ bool apply(std::int64_t i) const {
    const Vec<K, Storage<kFrom>> x = load<K>(in + i);
    Vec<K, float> y;
    bool nonfinite = false;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      y.v[k] = detail::to_float<kFrom>(x.v[k]) * multiplier;
      nonfinite |= !isfinite(y.v[k]);
    }
    store<K>(out + i, y);
    return nonfinite;
  }
};

template <DType kTo>
void launch_from_float(const float* in, void* out, std::int64_t count, cudaStream_t stream) {
  auto* typed_out = static_cast<Storage<kTo>*>(out);
  const detail::VectorSplit split =
      detail::split_for_vectors({{in, 4}, {typed_out, size_of(kTo)}}, count);
  detail::launch_elementwise(FromFloat<kTo>{in, typed_out}, split, stream, "cast_from_float");
}

template <DType kFrom>
void launch_to_float_scaled(const void* in, float* out, std::int64_t count, float multiplier,
                            int* nonfinite_flag, cudaStream_t stream) {
  const auto* typed_in = static_cast<const Storage<kFrom>*>(in);
  const detail::VectorSplit split =
      detail::split_for_vectors({{typed_in, size_of(kFrom)}, {out, 4}}, count);
  detail::launch_elementwise(ToFloatScaled<kFrom>{typed_in, out, multiplier}, split, stream,
                             "cast_to_float_scaled", nonfinite_flag);
}

}  // namespace

void cast_from_float(const float* in, void* out, DType to, std::int64_t count,
                     cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "cast_from_float: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || (in && out), "cast_from_float: null input or output");
  switch (to) {
    case DType::kFloat32:
      if (count > 0 && in != out) {
        ZEROSHARD_CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<std::size_t>(count) * 4,
                                             cudaMemcpyDeviceToDevice, stream));
      }
      return;
    case DType::kFloat16:
      return launch_from_float<DType::kFloat16>(in, out, count, stream);
    case DType::kBFloat16:
      return launch_from_float<DType::kBFloat16>(in, out, count, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("cast_from_float", to);
}

void cast_to_float_scaled(const void* in, DType from, float* out, std::int64_t count,
                          float multiplier, int* nonfinite_flag, cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "cast_to_float_scaled: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || (in && out), "cast_to_float_scaled: null input or output");
  switch (from) {
    case DType::kFloat32:
      return launch_to_float_scaled<DType::kFloat32>(in, out, count, multiplier, nonfinite_flag,
                                                     stream);
    case DType::kFloat16:
      return launch_to_float_scaled<DType::kFloat16>(in, out, count, multiplier, nonfinite_flag,
                                                     stream);
    case DType::kBFloat16:
      return launch_to_float_scaled<DType::kBFloat16>(in, out, count, multiplier, nonfinite_flag,
                                                      stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("cast_to_float_scaled", from);
}

}  // namespace zeroshard::kernels
