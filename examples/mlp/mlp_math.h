// The arithmetic of the example MLP, on the processor the engine's buffers live on: OpenBLAS and
// plain loops on the CPU (mlp_math_cpu.cpp), cuBLAS and small kernels on a GPU
// (mlp_math_cuda.cu). Every pointer is memory of that processor; row-major throughout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "zeroshard/device.h"
#include "zeroshard/dtype.h"

namespace zeroshard::examples {

class MlpMath {
 public:
  virtual ~MlpMath() = default;

  /// The stream the math runs on (a cudaStream_t), for Engine::set_compute_stream; null on the
  /// CPU.
  virtual void* stream() const noexcept = 0;

  /// output[batch, out] = bias + input[batch, in] * weight[out, in]^T, then max(., 0) when relu.
  virtual void linear_forward(const float* input, const float* weight, const float* bias,
                              float* output, int batch, int in, int out, bool relu) = 0;
  /// grad[k] = 0 wherever activation[k] <= 0: ReLU's backward through its stored output.
  virtual void relu_backward(const float* activation, float* grad, std::int64_t count) = 0;
  /// weight_grad[out, in] += output_grad[batch, out]^T * input[batch, in], and
  /// bias_grad[out] += the sum of output_grad over the batch.
  virtual void add_linear_grads(const float* output_grad, const float* input, float* weight_grad,
                                float* bias_grad, int batch, int in, int out) = 0;
  /// input_grad[batch, in] = output_grad[batch, out] * weight[out, in].
  virtual void input_grad(const float* output_grad, const float* weight, float* input_grad,
                          int batch, int in, int out) = 0;
  /// Softmax cross-entropy of logits[batch, classes] against labels: overwrites the logits with
  /// d(mean loss)/d(logits) * grad_scale and returns the mean loss (waits for the GPU).
  /// `sample_losses` holds `batch` doubles of working memory.
  virtual float softmax_cross_entropy(float* logits, const int* labels, double* sample_losses,
                                      int batch, int classes, float grad_scale) = 0;
  /// Converts between fp32 working copies and 16-bit parameters and gradients.
  virtual void convert(const void* in, DType from, void* out, DType to, std::int64_t count) = 0;
  /// Copies `bytes` of host memory (a batch of samples) into this processor's memory.
  virtual void upload(void* destination, const void* host, std::size_t bytes) = 0;
};

/// The math for `device`. Throws UsageError for a CUDA device when the example was built
/// without CUDA.
std::unique_ptr<MlpMath> make_mlp_math(const Device& device);

std::unique_ptr<MlpMath> make_cpu_mlp_math();
#if ZEROSHARD_EXAMPLE_WITH_CUDA
/// cuBLAS and kernels on a stream of its own on GPU `device`.
std::unique_ptr<MlpMath> make_cuda_mlp_math(int device);
#endif

}  // namespace zeroshard::examples
