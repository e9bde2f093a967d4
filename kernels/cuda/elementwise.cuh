// The shape all element-wise kernels here share: one launch over a flat range, a grid-stride loop
// over 4-element vectors for the aligned body (128-bit loads and stores of fp32) and scalar code
// for the unaligned head and the tail.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/cuda_check.h"

namespace zeroshard::kernels::detail {

inline constexpr int kVectorWidth = 4;
inline constexpr int kBlockThreads = 256;

/// K consecutive elements, aligned to their total size so that one load moves all of them
/// (16 bytes for four floats, 8 for four 16-bit values).
template <int K, class T>
struct alignas(sizeof(T) * K) Vec {
  T v[K];
};

template <int K, class T>
__device__ __forceinline__ Vec<K, T> load(const T* p) {
  return *reinterpret_cast<const Vec<K, T>*>(p);
}

template <int K, class T>
__device__ __forceinline__ void store(T* p, const Vec<K, T>& value) {
  *reinterpret_cast<Vec<K, T>*>(p) = value;
}

/// Elements [0, head) and [head + kVectorWidth * vectors, count) are processed one at a time,
/// the others kVectorWidth at a time.
struct VectorSplit {
  std::int64_t head = 0;
  std::int64_t vectors = 0;
  std::int64_t count = 0;

  __host__ __device__ std::int64_t tail_start() const { return head + kVectorWidth * vectors; }
  __host__ __device__ std::int64_t scalars() const { return head + (count - tail_start()); }
};

/// One array an element-wise kernel reads or writes, for the alignment decision.
struct ArrayAddress {
  const void* data;
  std::size_t element_bytes;
};

/// Picks the smallest head (< kVectorWidth) after which every array's address is a multiple of
/// its vector size. Arrays at the same offset of separate allocations always admit one; arrays
/// whose misalignments disagree do not, and are then processed one element at a time.
inline VectorSplit split_for_vectors(std::initializer_list<ArrayAddress> arrays,
                                     std::int64_t count) {
  for (std::int64_t head = 0; head < kVectorWidth && head <= count; ++head) {
    const bool aligned = std::all_of(arrays.begin(), arrays.end(), [&](const ArrayAddress& a) {
      const auto address = reinterpret_cast<std::uintptr_t>(a.data) + head * a.element_bytes;
      return address % (kVectorWidth * a.element_bytes) == 0;
    });
    if (aligned) return {head, (count - head) / kVectorWidth, count};
  }
  return {count, 0, count};
}

/// An element-wise operation: apply<K>(i) processes elements [i, i + K). Operations that check
/// for inf/NaN return true when they found one.
template <class Op>
concept ReportsNonfinite = requires(const Op& op) {
  { op.template apply<1>(std::int64_t{0}) } -> std::same_as<bool>;
};

template <class Op>
__global__ void __launch_bounds__(kBlockThreads)
    elementwise_kernel(Op op, VectorSplit split, int* nonfinite_flag) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  bool nonfinite = false;
  for (std::int64_t v = first; v < split.vectors; v += stride) {
    const std::int64_t i = split.head + kVectorWidth * v;
    if constexpr (ReportsNonfinite<Op>) {
      nonfinite |= op.template apply<kVectorWidth>(i);
    } else {
      op.template apply<kVectorWidth>(i);
    }
  }
  // At most 2 * (kVectorWidth - 1) elements unless the arrays could not be aligned.
  const std::int64_t tail_start = split.tail_start();
  for (std::int64_t s = first; s < split.scalars(); s += stride) {
    const std::int64_t i = s < split.head ? s : tail_start + (s - split.head);
    if constexpr (ReportsNonfinite<Op>) {
      nonfinite |= op.template apply<1>(i);
    } else {
      op.template apply<1>(i);
    }
  }
  if constexpr (ReportsNonfinite<Op>) {
    // One store per block instead of one per bad element. The flag pointer is the same for every
    // thread, so either all threads of the block reach the barrier or none does.
    if (nonfinite_flag != nullptr && __syncthreads_or(nonfinite) && threadIdx.x == 0) {
      *nonfinite_flag = 1;
    }
  }
}

/// Blocks that fit on the current device at once: a grid-stride loop gains nothing from more.
inline std::int64_t resident_block_limit() {
  int device = 0;
  int multiprocessors = 0;
  int threads_per_multiprocessor = 0;
  ZEROSHARD_CUDA_CHECK(cudaGetDevice(&device));
  ZEROSHARD_CUDA_CHECK(
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  ZEROSHARD_CUDA_CHECK(cudaDeviceGetAttribute(&threads_per_multiprocessor,
                                              cudaDevAttrMaxThreadsPerMultiProcessor, device));
  return std::int64_t{multiprocessors} * (threads_per_multiprocessor / kBlockThreads);
}

/// Launches `op` over `split` as one kernel on `stream`; `what` names it in a launch error.
template <class Op>
void launch_elementwise(const Op& op, const VectorSplit& split, cudaStream_t stream,
                        const char* what, int* nonfinite_flag = nullptr) {
  if (split.count == 0) return;
  const std::int64_t work = std::max(split.vectors, split.scalars());
  const std::int64_t blocks =
      std::min((work + kBlockThreads - 1) / kBlockThreads, resident_block_limit());
  elementwise_kernel<<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(op, split,
                                                                                  nonfinite_flag);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    cuda::throw_cuda_error(error, what, __FILE__, __LINE__);
  }
}

}  // namespace zeroshard::kernels::detail
