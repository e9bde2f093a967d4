// The element-wise reduction behind every host-side reduce (the MPI ops for fp16/bf16 and the
// ring reduce-scatter): one definition, so that both paths round and treat NaN alike.
#pragma once

#include <cstdint>

#include "zeroshard/communicator.h"  // ReduceOp
#include "zeroshard/dtype.h"

namespace zeroshard::detail {

/// inout[i] = in[i] (op) inout[i] for `count` elements of `dtype`. fp16 and bf16 are reduced in
/// fp32 and rounded back once per call; kMax lets a NaN on either side win, so an overflow check
/// built on a max reduction sees a NaN from any rank. `in` and `inout` must not overlap.
void reduce_into(const void* in, void* inout, std::int64_t count, DType dtype,
                 ReduceOp op) noexcept;

}  // namespace zeroshard::detail
