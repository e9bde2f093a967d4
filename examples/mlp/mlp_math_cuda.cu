// The MLP's arithmetic on a GPU: cuBLAS sgemm for the matrix products (row-major operands passed
// as their column-major transposes) and one small kernel for each element-wise step, all on one
// stream that the engine orders its own work and its collectives after.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_convert.h"
#include "cuda_support.h"
#include "mlp_math.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

constexpr CudaCheck check_cuda{"MLP example"};

__global__ void fill_bias_rows(const float* bias, float* output, int batch, int out) {
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k < std::int64_t{batch} * out) output[k] = bias[k % out];
}

__global__ void relu_in_place(float* data, std::int64_t count) {
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k < count) data[k] = fmaxf(data[k], 0.0f);
}

__global__ void relu_backward_kernel(const float* activation, float* grad, std::int64_t count,
                                     float scale) {
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k < count) grad[k] = activation[k] <= 0.0f ? 0.0f : grad[k] * scale;
}

__global__ void dropout_kernel(float* data, std::int64_t count, float p, float scale,
                               std::uint64_t seed, std::uint64_t offset) {
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const bool keep = dropout_keeps(seed, offset + static_cast<std::uint64_t>(k), p);
  data[k] = keep ? data[k] * scale : 0.0f;
}

// One thread per output feature, summing over the batch in order, as the CPU loop does.
__global__ void bias_grad_kernel(const float* output_grad, float* bias_grad, int batch, int out,
                                 bool add) {
  const int o = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (o >= out) return;
  float sum = add ? bias_grad[o] : 0.0f;
  for (int b = 0; b < batch; ++b) sum += output_grad[static_cast<std::int64_t>(b) * out + o];
  bias_grad[o] = sum;
}

// One thread per sample: the CPU's formula, in double where the CPU uses double.
__global__ void softmax_cross_entropy_kernel(float* logits, const int* labels,
                                             double* sample_losses, int batch, int classes,
                                             float grad_scale) {
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= batch) return;
  float* row = logits + static_cast<std::int64_t>(b) * classes;
  float max_logit = row[0];
  for (int c = 1; c < classes; ++c) max_logit = fmaxf(max_logit, row[c]);
  double sum = 0.0;
  for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(row[c] - max_logit));
  const double log_sum = log(sum);
  sample_losses[b] = log_sum - static_cast<double>(row[labels[b]] - max_logit);
  for (int c = 0; c < classes; ++c) {
    const double p = exp(static_cast<double>(row[c] - max_logit) - log_sum);
    row[c] = static_cast<float>(p - (c == labels[b] ? 1.0 : 0.0)) * grad_scale;
  }
}

class CudaMlpMath final : public MlpMath {
 public:
  explicit CudaMlpMath(int device) : device_(device, check_cuda) {}

  void* stream() const noexcept override { return device_.stream(); }

  void linear_forward(const float* input, const float* weight, const float* bias, float* output,
                      int batch, int in, int out, bool relu) override {
    const std::int64_t n = std::int64_t{batch} * out;
    fill_bias_rows<<<blocks_for(n), kThreads, 0, device_.stream()>>>(bias, output, batch, out);
    check_cuda(cudaGetLastError(), "fill_bias_rows");
    // output^T [out x batch] += weight [out x in] * input^T [in x batch]
    const float one = 1.0f;
    check_cuda(cublasSgemm(device_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, batch, in, &one, weight,
                           in, input, in, &one, output, out),
               "cublasSgemm (forward)");
    if (relu) {
      relu_in_place<<<blocks_for(n), kThreads, 0, device_.stream()>>>(output, n);
      check_cuda(cudaGetLastError(), "relu");
    }
  }

  void relu_backward(const float* activation, float* grad, std::int64_t count,
                     float scale) override {
    relu_backward_kernel<<<blocks_for(count), kThreads, 0, device_.stream()>>>(activation, grad,
                                                                               count, scale);
    check_cuda(cudaGetLastError(), "relu_backward");
  }

  void dropout(float* data, std::int64_t count, float p, std::uint64_t seed,
               std::uint64_t offset) override {
    dropout_kernel<<<blocks_for(count), kThreads, 0, device_.stream()>>>(
        data, count, p, 1.0f / (1.0f - p), seed, offset);
    check_cuda(cudaGetLastError(), "dropout");
  }

  void linear_grads(const float* output_grad, const float* input, float* weight_grad,
                    float* bias_grad, int batch, int in, int out, bool add_to_weight_grad,
                    bool add_to_bias_grad) override {
    // weight_grad^T [in x out] (+)= input^T [in x batch] * output_grad [batch x out]; with beta 0
    // cuBLAS does not read C, so a buffer never zeroed does.
    const float one = 1.0f;
    const float beta = add_to_weight_grad ? 1.0f : 0.0f;
    check_cuda(cublasSgemm(device_.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, batch, &one, input,
                           in, output_grad, out, &beta, weight_grad, in),
               "cublasSgemm (weight gradient)");
    bias_grad_kernel<<<blocks_for(out), kThreads, 0, device_.stream()>>>(
        output_grad, bias_grad, batch, out, add_to_bias_grad);
    check_cuda(cudaGetLastError(), "bias_grad_kernel");
  }

  void input_grad(const float* output_grad, const float* weight, float* input_grad, int batch,
                  int in, int out) override {
    // input_grad^T [in x batch] = weight^T [in x out] * output_grad^T [out x batch]
    const float one = 1.0f;
    const float zero = 0.0f;
    check_cuda(cublasSgemm(device_.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, in, batch, out, &one, weight,
                           in, output_grad, out, &zero, input_grad, in),
               "cublasSgemm (input gradient)");
  }

  float softmax_cross_entropy(float* logits, const int* labels, double* sample_losses, int batch,
                              int classes, float grad_scale) override {
    softmax_cross_entropy_kernel<<<blocks_for(batch), kThreads, 0, device_.stream()>>>(
        logits, labels, sample_losses, batch, classes, grad_scale);
    check_cuda(cudaGetLastError(), "softmax_cross_entropy");
    host_losses_.resize(static_cast<std::size_t>(batch));
    check_cuda(
        cudaMemcpyAsync(host_losses_.data(), sample_losses, host_losses_.size() * sizeof(double),
                        cudaMemcpyDeviceToHost, device_.stream()),
        "cudaMemcpyAsync (losses)");
    check_cuda(cudaStreamSynchronize(device_.stream()), "cudaStreamSynchronize (losses)");
    double loss = 0.0;
    for (double sample : host_losses_) loss += sample;
    return static_cast<float>(loss / batch);
  }

  void convert(const void* in, DType from, void* out, DType to, std::int64_t count) override {
    if (from == to) {
      check_cuda(cudaMemcpyAsync(out, in, static_cast<std::size_t>(count) * size_of(from),
                                 cudaMemcpyDeviceToDevice, device_.stream()),
                 "cudaMemcpyAsync (convert)");
      return;
    }
    convert_on_stream(in, from, out, to, count, device_.stream(), check_cuda);
  }

  void copy(void* destination, const void* source, std::size_t bytes) override {
    check_cuda(
        cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, device_.stream()),
        "cudaMemcpyAsync (copy)");
  }

  void upload(void* destination, const void* host, std::size_t bytes) override {
    check_cuda(cudaMemcpyAsync(destination, host, bytes, cudaMemcpyHostToDevice, device_.stream()),
               "cudaMemcpyAsync (upload)");
    // The host batch is refilled as soon as this returns.
    check_cuda(cudaStreamSynchronize(device_.stream()), "cudaStreamSynchronize (upload)");
  }

  std::shared_ptr<void> allocate(std::size_t bytes) override {
    void* data = nullptr;
    // cudaMalloc returns at least 256-byte aligned memory.
    check_cuda(cudaMalloc(&data, std::max<std::size_t>(bytes, 1)), "cudaMalloc (model memory)");
    std::shared_ptr<void> owned(data, [](void* p) { cudaFree(p); });
    check_cuda(cudaMemset(data, 0, bytes), "cudaMemset (model memory)");
    return owned;
  }

 private:
  CudaDeviceStream device_;
  std::vector<double> host_losses_;
};

}  // namespace

std::unique_ptr<MlpMath> make_cuda_mlp_math(int device) {
  return std::make_unique<CudaMlpMath>(device);
}

}  // namespace zeroshard::examples
