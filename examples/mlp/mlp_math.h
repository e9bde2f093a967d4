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

#if defined(__CUDACC__)
#define ZEROSHARD_EXAMPLE_HOST_DEVICE __host__ __device__
#else
#define ZEROSHARD_EXAMPLE_HOST_DEVICE
#endif

/// Whether dropout with probability `p` keeps element `index` of the stream `seed`: a hash of the
/// counter (splitmix64), so the CPU and the GPU drop the same elements and a recompute that
/// starts from the same offset drops them again.
ZEROSHARD_EXAMPLE_HOST_DEVICE inline bool dropout_keeps(std::uint64_t seed, std::uint64_t index,
                                                        float p) {
  std::uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1.0p-24f >= p;
}

class MlpMath {
 public:
  virtual ~MlpMath() = default;

  /// The stream the math runs on (a cudaStream_t), for Engine::set_compute_stream; null on the
  /// CPU.
  virtual void* stream() const noexcept = 0;

  /// output[batch, out] = bias + input[batch, in] * weight[out, in]^T, then max(., 0) when relu.
  virtual void linear_forward(const float* input, const float* weight, const float* bias,
                              float* output, int batch, int in, int out, bool relu) = 0;
  /// grad[k] = 0 wherever activation[k] <= 0, else grad[k] * scale: the backward of ReLU and
  /// dropout (which keeps with scale 1 / (1 - p)) through their stored output.
  virtual void relu_backward(const float* activation, float* grad, std::int64_t count,
                             float scale) = 0;
  /// Inverted dropout in place: data[k] = dropout_keeps(seed, offset + k, p) ? data[k] / (1 - p)
  /// : 0.
  virtual void dropout(float* data, std::int64_t count, float p, std::uint64_t seed,
                       std::uint64_t offset) = 0;
  /// weight_grad[out, in] += output_grad[batch, out]^T * input[batch, in], and
  /// bias_grad[out] += the sum of output_grad over the batch; without `add_to_weight_grad` or
  /// `add_to_bias_grad` that gradient is written (=) instead, whatever its buffer held, as for an
  /// engine gradient that Parameter::grad_target() hands out to be written.
  virtual void linear_grads(const float* output_grad, const float* input, float* weight_grad,
                            float* bias_grad, int batch, int in, int out, bool add_to_weight_grad,
                            bool add_to_bias_grad) = 0;
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
  /// Copies `bytes` within this processor's memory; the ranges do not overlap.
  virtual void copy(void* destination, const void* source, std::size_t bytes) = 0;
  /// Copies `bytes` of host memory (a batch of samples) into this processor's memory.
  virtual void upload(void* destination, const void* host, std::size_t bytes) = 0;
  /// `bytes` zeroed bytes of this processor's memory, 64-byte aligned and owned by the caller:
  /// the model's own parameter and gradient blocks when it lends them to the engine.
  virtual std::shared_ptr<void> allocate(std::size_t bytes) = 0;
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
