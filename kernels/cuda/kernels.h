// Host-callable launchers of zeroshard's CUDA kernels: fused update rules over a flat fp32 shard,
// precision casts, the non-finite check, the sum of squares behind the gradient norm and the block
// quantization of ZeRO++. Every
// pointer is a device pointer; every launcher queues its work on `stream` and returns at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "layout/quantized_block_format.h"
#include "zeroshard/dtype.h"
#include "zeroshard/optimizer.h"

namespace zeroshard::kernels {

// --- update rules ----------------------------------------------------------------------------
// Each is one kernel launch over `count` elements, whatever the count and the alignment of the
// pointers. lr and weight_decay come from `context` (schedule and group overrides applied),
// everything else from the options, except that context.momentum, when set, replaces beta1 (Adam,
// AdamW, Lion) or the momentum (SGD). State arrays start zeroed and are updated in place. The
// math is PyTorch's, in fp32, with the step's scalars (bias corrections, step size) computed once
// on the host in double.

/// torch.optim.AdamW: p *= 1 - lr*wd, then Adam. `max_exp_avg_sq` is used (and required) only
/// with options.amsgrad.
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                float* max_exp_avg_sq, std::int64_t count, const AdamWOptions& options,
                const StepContext& context, cudaStream_t stream);

/// torch.optim.Adam: g += wd*p, then Adam. `max_exp_avg_sq` as for adamw_step.
void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
               float* max_exp_avg_sq, std::int64_t count, const AdamOptions& options,
               const StepContext& context, cudaStream_t stream);

/// torch.optim.SGD. `momentum_buffer` is required when the momentum is non-zero and ignored
/// otherwise; at context.step == 1 it is set to the gradient, as PyTorch does for a new buffer.
void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t count,
              const SgdOptions& options, const StepContext& context, cudaStream_t stream);

/// Lion: p *= 1 - lr*wd; p -= lr * sign(beta1*m + (1-beta1)*g); m = beta2*m + (1-beta2)*g.
void lion_step(float* param, const float* grad, float* exp_avg, std::int64_t count,
               const LionOptions& options, const StepContext& context, cudaStream_t stream);

/// torch.optim.Adagrad. The zeroed `state_sum` takes options.initial_accumulator_value at
/// context.step == 1, so it must not be written between steps.
void adagrad_step(float* param, const float* grad, float* state_sum, std::int64_t count,
                  const AdagradOptions& options, const StepContext& context, cudaStream_t stream);

// --- precision -------------------------------------------------------------------------------

/// out[i] = round-to-nearest-even of in[i] in `to` (fp16 overflows to inf; NaN stays NaN).
/// For kFloat32 a device-to-device copy. `in` and `out` must not overlap.
void cast_from_float(const float* in, void* out, DType to, std::int64_t count, cudaStream_t stream);

/// out[i] = float(in[i]) * multiplier: the upcast and the unscale of gradients in one pass
/// (multiplier = 1 / loss scale). `in` may equal `out` when `from` is kFloat32. When
/// `nonfinite_flag` is not null, also sets *nonfinite_flag = 1 if any output is inf or NaN (it
/// never clears the flag, so one flag can collect several buffers).
void cast_to_float_scaled(const void* in, DType from, float* out, std::int64_t count,
                          float multiplier, int* nonfinite_flag, cudaStream_t stream);

/// destination[i] += source[i], computed in fp32 and rounded once into destination's type (the
/// accumulation of a micro-batch's gradients). The arrays must not overlap.
void accumulate(void* destination, DType destination_dtype, const void* source, DType source_dtype,
                std::int64_t count, cudaStream_t stream);

/// data[i] *= factor, computed in fp32 and rounded once into `dtype`.
void scale_in_place(void* data, DType dtype, std::int64_t count, float factor, cudaStream_t stream);

// --- checks and reductions -------------------------------------------------------------------

/// Sets *flag = 1 if any of the `count` elements is inf or NaN; never clears it.
void check_nonfinite(const void* data, DType dtype, std::int64_t count, int* flag,
                     cudaStream_t stream);

/// Bytes of scratch memory sum_of_squares needs for `count` elements of `dtype`.
std::size_t sum_of_squares_workspace_bytes(DType dtype, std::int64_t count);

/// *result = sum of data[i]^2, accumulated in double (CUB DeviceReduce); the gradient norm is its
/// square root once the ranks' partial sums are added. `workspace` holds at least
/// sum_of_squares_workspace_bytes(dtype, count) bytes.
void sum_of_squares(const void* data, DType dtype, std::int64_t count, double* result,
                    void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

// --- block quantization (ZeRO++) ---------------------------------------------------------------
// The format of comm/quantized_block_format.h, bit for bit the CPU's detail::quantize_blocks and
// detail::dequantize_blocks; the encoded buffer must be 4-byte aligned.

/// Encodes `count` elements of `dtype` at `in` into detail::quantized_bytes(count, bits) bytes at
/// `out`, and adds to *nonfinite_blocks the number of blocks holding inf or NaN (encoded as zeros;
/// never cleared, so one counter can collect several buffers).
void quantize_blocks(const void* in, DType dtype, std::int64_t count,
                     zeroshard::detail::QuantBits bits, void* out, int* nonfinite_blocks,
                     cudaStream_t stream);

/// Decodes `count` elements encoded by quantize_blocks at `in` into `out` of `dtype`.
void dequantize_blocks(const void* in, zeroshard::detail::QuantBits bits, std::int64_t count,
                       void* out, DType dtype, cudaStream_t stream);

}  // namespace zeroshard::kernels
