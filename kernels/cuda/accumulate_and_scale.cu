// The two read-modify-write passes of gradient handling: adding a micro-batch's gradients into
// the accumulated ones, and scaling a buffer (the averaging of a reduction, the clip factor), both
// in fp32 and rounded once into the buffer's own type.
#include <cstdint>

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

template <DType kDestination, DType kSource>
struct Accumulate {
  Storage<kDestination>* destination;
  const Storage<kSource>* source;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    Vec<K, Storage<kDestination>> sum = load<K>(destination + i);
    const Vec<K, Storage<kSource>> addend = load<K>(source + i);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      sum.v[k] = detail::from_float<kDestination>(detail::to_float<kDestination>(sum.v[k]) +
                                                  detail::to_float<kSource>(addend.v[k]));
    }
    store<K>(destination + i, sum);
  }
};

template <DType kDType>
struct ScaleInPlace {
  Storage<kDType>* data;
  float factor;

  template <int K>
  __device__ void apply(std::int64_t i) const {
    Vec<K, Storage<kDType>> x = load<K>(data + i);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      x.v[k] = detail::from_float<kDType>(detail::to_float<kDType>(x.v[k]) * factor);
    }
    store<K>(data + i, x);
  }
};

template <DType kDestination, DType kSource>
void launch_accumulate(void* destination, const void* source, std::int64_t count,
                       cudaStream_t stream) {
  auto* typed_destination = static_cast<Storage<kDestination>*>(destination);
  const auto* typed_source = static_cast<const Storage<kSource>*>(source);
  const detail::VectorSplit split = detail::split_for_vectors(
      {{typed_destination, size_of(kDestination)}, {typed_source, size_of(kSource)}}, count);
  detail::launch_elementwise(Accumulate<kDestination, kSource>{typed_destination, typed_source},
                             split, stream, "accumulate");
}

template <DType kDestination>
void dispatch_source(void* destination, const void* source, DType source_dtype, std::int64_t count,
                     cudaStream_t stream) {
  switch (source_dtype) {
    case DType::kFloat32:
      return launch_accumulate<kDestination, DType::kFloat32>(destination, source, count, stream);
    case DType::kFloat16:
      return launch_accumulate<kDestination, DType::kFloat16>(destination, source, count, stream);
    case DType::kBFloat16:
      return launch_accumulate<kDestination, DType::kBFloat16>(destination, source, count, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("accumulate", source_dtype);
}

template <DType kDType>
void launch_scale(void* data, std::int64_t count, float factor, cudaStream_t stream) {
  auto* typed = static_cast<Storage<kDType>*>(data);
  const detail::VectorSplit split = detail::split_for_vectors({{typed, size_of(kDType)}}, count);
  detail::launch_elementwise(ScaleInPlace<kDType>{typed, factor}, split, stream, "scale_in_place");
}

}  // namespace

void accumulate(void* destination, DType destination_dtype, const void* source, DType source_dtype,
                std::int64_t count, cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "accumulate: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || (destination && source),
                        "accumulate: null destination or source");
  switch (destination_dtype) {
    case DType::kFloat32:
      return dispatch_source<DType::kFloat32>(destination, source, source_dtype, count, stream);
    case DType::kFloat16:
      return dispatch_source<DType::kFloat16>(destination, source, source_dtype, count, stream);
    case DType::kBFloat16:
      return dispatch_source<DType::kBFloat16>(destination, source, source_dtype, count, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("accumulate", destination_dtype);
}

void scale_in_place(void* data, DType dtype, std::int64_t count, float factor,
                    cudaStream_t stream) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "scale_in_place: negative element count " << count);
  ZEROSHARD_CHECK_USAGE(count == 0 || data != nullptr, "scale_in_place: null data");
  switch (dtype) {
    case DType::kFloat32:
      return launch_scale<DType::kFloat32>(data, count, factor, stream);
    case DType::kFloat16:
      return launch_scale<DType::kFloat16>(data, count, factor, stream);
    case DType::kBFloat16:
      return launch_scale<DType::kBFloat16>(data, count, factor, stream);
    case DType::kFloat64:
      break;
  }
  detail::throw_not_model_dtype("scale_in_place", dtype);
}

}  // namespace zeroshard::kernels
