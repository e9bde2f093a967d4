// The MLP's arithmetic on the CPU: OpenBLAS sgemm for the matrix products, plain loops for the
// rest, in the order that makes every rank's results bit-identical from run to run.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "device_math.h"
#include "mlp_math.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

class CpuMlpMath final : public CpuDataMoves<MlpMath> {
 public:
  void linear_forward(const float* input, const float* weight, const float* bias, float* output,
                      int batch, int in, int out, bool relu) override {
    for (int b = 0; b < batch; ++b) {
      std::copy(bias, bias + out, output + static_cast<std::size_t>(b) * out);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f, input, in, weight,
                in, 1.0f, output, out);
    if (relu) {
      const std::size_t n = static_cast<std::size_t>(batch) * out;
      for (std::size_t k = 0; k < n; ++k) output[k] = std::max(output[k], 0.0f);
    }
  }

  void relu_backward(const float* activation, float* grad, std::int64_t count,
                     float scale) override {
    for (std::int64_t k = 0; k < count; ++k) {
      grad[k] = activation[k] <= 0.0f ? 0.0f : grad[k] * scale;
    }
  }

  void dropout(float* data, std::int64_t count, float p, std::uint64_t seed,
               std::uint64_t offset) override {
    const float scale = 1.0f / (1.0f - p);
    for (std::int64_t k = 0; k < count; ++k) {
      const bool keep = dropout_keeps(seed, offset + static_cast<std::uint64_t>(k), p);
      data[k] = keep ? data[k] * scale : 0.0f;
    }
  }

  void linear_grads(const float* output_grad, const float* input, float* weight_grad,
                    float* bias_grad, int batch, int in, int out, bool add_to_weight_grad,
                    bool add_to_bias_grad) override {
    // beta 0: BLAS does not read C, so a buffer never zeroed does.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.0f, output_grad, out,
                input, in, add_to_weight_grad ? 1.0f : 0.0f, weight_grad, in);
    if (!add_to_bias_grad) std::fill(bias_grad, bias_grad + out, 0.0f);
    for (int b = 0; b < batch; ++b) {
      const float* row = output_grad + static_cast<std::size_t>(b) * out;
      for (int o = 0; o < out; ++o) bias_grad[o] += row[o];
    }
  }

  void input_grad(const float* output_grad, const float* weight, float* input_grad, int batch,
                  int in, int out) override {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out, 1.0f, output_grad, out,
                weight, in, 0.0f, input_grad, in);
  }

  float softmax_cross_entropy(float* logits, const int* labels, double* sample_losses, int batch,
                              int classes, float grad_scale) override {
    double loss = 0.0;
    for (int b = 0; b < batch; ++b) {
      float* row = logits + static_cast<std::size_t>(b) * classes;
      // Subtracting the row maximum keeps exp() finite; it cancels out of the softmax.
      const float max_logit = *std::max_element(row, row + classes);
      double sum = 0.0;
      for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - max_logit));
      const double log_sum = std::log(sum);
      sample_losses[b] = log_sum - static_cast<double>(row[labels[b]] - max_logit);
      loss += sample_losses[b];
      // d(mean loss)/d(logit) = (softmax - one_hot) / batch, written over the logits.
      for (int c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(row[c] - max_logit) - log_sum);
        row[c] = static_cast<float>(p - (c == labels[b] ? 1.0 : 0.0)) * grad_scale;
      }
    }
    return static_cast<float>(loss / batch);
  }

  std::shared_ptr<void> allocate(std::size_t bytes) override {
    constexpr std::size_t kAlignment = 64;
    const std::size_t rounded =
        std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data, 0, rounded);
    return std::shared_ptr<void>(data, std::free);
  }
};

}  // namespace

std::unique_ptr<MlpMath> make_cpu_mlp_math() { return std::make_unique<CpuMlpMath>(); }

std::unique_ptr<MlpMath> make_mlp_math(const Device& device) {
#if ZEROSHARD_EXAMPLE_WITH_CUDA
  return make_math_for<MlpMath>(device, "MLP", make_cpu_mlp_math, make_cuda_mlp_math);
#else
  return make_math_for<MlpMath>(device, "MLP", make_cpu_mlp_math, nullptr);
#endif
}

}  // namespace zeroshard::examples
