// The arithmetic of the example GPT, on the processor the engine's buffers live on: OpenBLAS and
// plain loops on the CPU (gpt_kernels_cpu.h, gpt_math_cpu.cpp), cuBLAS and kernels of its own on a
// GPU (gpt_math_cuda.cu). Every pointer is memory of that processor; row-major throughout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "zeroshard/device.h"
#include "zeroshard/dtype.h"

namespace zeroshard::examples {

/// The layer operations in fp32. CpuGptKernels<T> (gpt_kernels_cpu.h) has the same members for
/// any T, so that the layers composed in gpt_layers.h can run in double for the gradient check.
/// "+=" marks an output that is added to; every other output is overwritten.
class GptMath {
 public:
  virtual ~GptMath() = default;

  /// The stream the math runs on (a cudaStream_t), for Engine::set_compute_stream; null on the
  /// CPU.
  virtual void* stream() const noexcept = 0;

  /// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
  virtual void embedding_forward(const int* tokens, const float* wte, const float* wpe, float* out,
                                 int batch, int seq, int channels) = 0;
  /// dwte[tokens[b, t], :] += dout[b, t, :] and dwpe[t, :] += dout[b, t, :], in (b, t) order;
  /// dwte has `vocab` rows.
  virtual void embedding_backward(const float* dout, const int* tokens, float* dwte, float* dwpe,
                                  int batch, int seq, int channels, int vocab) = 0;
  /// out = (in - mean) * rstd * weight + bias over each row of `channels`; stats[row] holds the
  /// row's mean and rstd (1 / sqrt(variance + 1e-5)).
  virtual void layernorm_forward(const float* in, const float* weight, const float* bias,
                                 float* out, float* stats, int rows, int channels) = 0;
  /// din += d(out)/d(in)^T dout, dweight += and dbias += theirs.
  virtual void layernorm_backward(const float* dout, const float* in, const float* weight,
                                  const float* stats, float* din, float* dweight, float* dbias,
                                  int rows, int channels) = 0;
  /// out[rows, out] = in[rows, in] * weight[out, in]^T (+ bias[out] when not null).
  virtual void matmul_forward(const float* in, const float* weight, const float* bias, float* out,
                              int rows, int in_features, int out_features) = 0;
  /// din = dout * weight (skipped when null), dweight += dout^T * in, dbias += the column sums of
  /// dout (skipped when null).
  virtual void matmul_backward(const float* dout, const float* in, const float* weight, float* din,
                               float* dweight, float* dbias, int rows, int in_features,
                               int out_features) = 0;
  /// Causal self-attention of qkv[batch, seq, 3 channels] (q, k, v side by side, `heads` heads of
  /// channels / heads each): att[batch, heads, seq, seq] the softmax weights (zero above the
  /// diagonal), out[batch, seq, channels] the heads' outputs side by side.
  virtual void attention_forward(const float* qkv, float* att, float* out, int batch, int seq,
                                 int channels, int heads) = 0;
  /// dqkv from dout; datt is working memory of att's size.
  virtual void attention_backward(const float* dout, const float* qkv, const float* att,
                                  float* dqkv, float* datt, int batch, int seq, int channels,
                                  int heads) = 0;
  /// GPT-2's GELU (tanh approximation), element-wise.
  virtual void gelu_forward(const float* in, float* out, std::int64_t count) = 0;
  /// din = gelu'(in) * dout; din may be dout.
  virtual void gelu_backward(const float* in, const float* dout, float* din,
                             std::int64_t count) = 0;
  /// data += other, element-wise (the residual connections).
  virtual void add_in_place(float* data, const float* other, std::int64_t count) = 0;
  /// Softmax cross-entropy of logits[rows, vocab] against targets: overwrites the logits with
  /// d(mean loss)/d(logits) * grad_scale and returns the mean loss (waits for the GPU).
  /// `row_losses` holds `rows` doubles of working memory.
  virtual double cross_entropy(float* logits, const int* targets, double* row_losses, int rows,
                               int vocab, float grad_scale) = 0;
  /// The mean loss only, logits left as they are (validation).
  virtual double cross_entropy_loss(const float* logits, const int* targets, double* row_losses,
                                    int rows, int vocab) = 0;

  /// Sets `bytes` of this processor's memory to zero.
  virtual void zero(void* data, std::size_t bytes) = 0;
  /// Converts between fp32 working copies and 16-bit parameters and gradients.
  virtual void convert(const void* in, DType from, void* out, DType to, std::int64_t count) = 0;
  /// Copies `bytes` within this processor's memory; the ranges do not overlap.
  virtual void copy(void* destination, const void* source, std::size_t bytes) = 0;
  /// Copies `bytes` of host memory (a batch of tokens) into this processor's memory.
  virtual void upload(void* destination, const void* host, std::size_t bytes) = 0;
};

/// The math for `device`. Throws UsageError for a CUDA device when the example was built
/// without CUDA.
std::unique_ptr<GptMath> make_gpt_math(const Device& device);

std::unique_ptr<GptMath> make_cpu_gpt_math();
#if ZEROSHARD_EXAMPLE_WITH_CUDA
/// cuBLAS and kernels on a stream of its own on GPU `device`.
std::unique_ptr<GptMath> make_cuda_gpt_math(int device);
#endif

}  // namespace zeroshard::examples
