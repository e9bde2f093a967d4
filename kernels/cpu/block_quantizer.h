// Block quantization of ZeRO++ on the CPU: fp32, fp16 or bf16 tensors to and from the format of
// comm/quantized_block_format.h. It is also the reference the CUDA kernels are tested against.
#pragma once

#include <cstdint>

#include "layout/quantized_block_format.h"
#include "zeroshard/dtype.h"

namespace zeroshard::detail {

/// Encodes `count` elements of `dtype` at `in` (2-byte aligned for fp16 and bf16) into
/// quantized_bytes(count, bits) bytes at `out` (any alignment). Returns the number of blocks that
/// hold inf or NaN: those are encoded as zeros (scale 0, codes 0), so the caller must treat a
/// non-zero result as an overflow and skip the step.
std::int64_t quantize_blocks(const void* in, DType dtype, std::int64_t count, QuantBits bits,
                             void* out);

/// Decodes `count` elements from `in` (as written by quantize_blocks; any alignment) into `out` of
/// `dtype` (2-byte aligned for fp16 and bf16): each element is code * scale in fp32, rounded to
/// nearest even once for fp16 and bf16.
void dequantize_blocks(const void* in, QuantBits bits, std::int64_t count, void* out, DType dtype);

}  // namespace zeroshard::detail
