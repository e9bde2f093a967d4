// Element-wise conversion between fp32 and the 16-bit types on a stream, for the example models'
// mixed precision on a GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_support.h"
#include "zeroshard/dtype.h"

namespace zeroshard::examples {

/// Converts `count` elements of `from` at `in` into `to` at `out` on `stream`, rounding to
/// nearest even; fp32 to fp16 or bf16 and back. Other pairs (same types included) throw
/// UsageError naming `check.owner()`.
void convert_on_stream(const void* in, DType from, void* out, DType to, std::int64_t count,
                       cudaStream_t stream, const CudaCheck& check);

}  // namespace zeroshard::examples
