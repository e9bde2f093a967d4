// The example MLP's arithmetic: the CPU math against naive loops and, through a finite-difference
// check, the loss gradient against the loss; the GPU math against the CPU math (skipped, saying
// why, without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "mlp_math.h"

#if ZEROSHARD_EXAMPLE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zeroshard::examples {
namespace {

constexpr int kBatch = 7;
constexpr int kIn = 13;
constexpr int kOut = 11;

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * std::max(1.0f, std::fabs(want[i])))
        << what << "[" << i << "]";
  }
}

// The inputs of one layer's forward and backward.
struct LayerCase {
  std::vector<float> input = random_floats(kBatch * kIn, 1);
  std::vector<float> weight = random_floats(kOut * kIn, 2);
  std::vector<float> bias = random_floats(kOut, 3);
  std::vector<float> output_grad = random_floats(kBatch * kOut, 4);
  std::vector<float> weight_grad = random_floats(kOut * kIn, 5);  // accumulated into
  std::vector<float> bias_grad = random_floats(kOut, 6);
};

TEST(CpuMlpMath, LinearForwardBackwardAndReluMatchNaiveLoops) {
  const auto math = make_cpu_mlp_math();
  LayerCase c;
  std::vector<float> output(kBatch * kOut);
  math->linear_forward(c.input.data(), c.weight.data(), c.bias.data(), output.data(), kBatch, kIn,
                       kOut, true);
  std::vector<float> want(kBatch * kOut);
  for (int b = 0; b < kBatch; ++b) {
    for (int o = 0; o < kOut; ++o) {
      double sum = c.bias[o];
      for (int i = 0; i < kIn; ++i) sum += double{c.input[b * kIn + i]} * c.weight[o * kIn + i];
      want[b * kOut + o] = std::max(static_cast<float>(sum), 0.0f);
    }
  }
  expect_near_all(output, want, 1e-5f, "forward");

  std::vector<float> weight_grad = c.weight_grad;
  std::vector<float> bias_grad = c.bias_grad;
  math->linear_grads(c.output_grad.data(), c.input.data(), weight_grad.data(), bias_grad.data(),
                     kBatch, kIn, kOut, true, true);
  std::vector<float> input_grad(kBatch * kIn);
  math->input_grad(c.output_grad.data(), c.weight.data(), input_grad.data(), kBatch, kIn, kOut);
  std::vector<float> want_weight_grad = c.weight_grad;
  std::vector<float> want_bias_grad = c.bias_grad;
  std::vector<float> want_input_grad(kBatch * kIn, 0.0f);
  for (int b = 0; b < kBatch; ++b) {
    for (int o = 0; o < kOut; ++o) {
      const float g = c.output_grad[b * kOut + o];
      want_bias_grad[o] += g;
      for (int i = 0; i < kIn; ++i) {
        want_weight_grad[o * kIn + i] += g * c.input[b * kIn + i];
        want_input_grad[b * kIn + i] += g * c.weight[o * kIn + i];
      }
    }
  }
  expect_near_all(weight_grad, want_weight_grad, 1e-5f, "weight grad");
  expect_near_all(bias_grad, want_bias_grad, 1e-5f, "bias grad");
  expect_near_all(input_grad, want_input_grad, 1e-5f, "input grad");

  // Written instead of added: what the buffers held (NaN here) is not read, and the result is
  // the sum added to zeros, bit for bit.
  std::vector<float> zero_weight_grad(weight_grad.size(), 0.0f);
  std::vector<float> zero_bias_grad(bias_grad.size(), 0.0f);
  math->linear_grads(c.output_grad.data(), c.input.data(), zero_weight_grad.data(),
                     zero_bias_grad.data(), kBatch, kIn, kOut, true, true);
  std::vector<float> written_weight_grad(weight_grad.size(), std::nanf(""));
  std::vector<float> written_bias_grad(bias_grad.size(), std::nanf(""));
  for (const auto& [add_to_weight, add_to_bias] : {std::pair{false, false}, {false, true}}) {
    written_bias_grad.assign(bias_grad.size(), add_to_bias ? 0.0f : std::nanf(""));
    math->linear_grads(c.output_grad.data(), c.input.data(), written_weight_grad.data(),
                       written_bias_grad.data(), kBatch, kIn, kOut, add_to_weight, add_to_bias);
    EXPECT_EQ(written_weight_grad, zero_weight_grad) << "weight gradient written";
    EXPECT_EQ(written_bias_grad, zero_bias_grad) << "bias gradient, added " << add_to_bias;
  }

  std::vector<float> grad = c.output_grad;
  math->relu_backward(output.data(), grad.data(), kBatch * kOut, 1.0f);
  for (int k = 0; k < kBatch * kOut; ++k) {
    EXPECT_EQ(grad[k], output[k] > 0.0f ? c.output_grad[k] : 0.0f) << k;
  }
}

TEST(CpuMlpMath, DropoutKeepsAboutOneMinusPAndScalesWhatItKeeps) {
  const auto math = make_cpu_mlp_math();
  constexpr int kCount = 4096;
  std::vector<float> data(kCount, 2.0f);
  math->dropout(data.data(), kCount, 0.25f, 99, 1000);
  int kept = 0;
  for (int k = 0; k < kCount; ++k) {
    const bool keep = dropout_keeps(99, 1000 + static_cast<std::uint64_t>(k), 0.25f);
    EXPECT_EQ(data[k], keep ? 2.0f / 0.75f : 0.0f) << k;
    kept += keep ? 1 : 0;
  }
  EXPECT_NEAR(kept, 0.75 * kCount, 0.05 * kCount);

  // Backward through the kept elements: grad * 1/(1-p), zero where dropped.
  std::vector<float> grad(kCount, 1.0f);
  math->relu_backward(data.data(), grad.data(), kCount, 1.0f / 0.75f);
  for (int k = 0; k < kCount; ++k) EXPECT_EQ(grad[k], data[k] > 0.0f ? 1.0f / 0.75f : 0.0f) << k;
}

TEST(CpuMlpMath, SoftmaxCrossEntropyGradientIsTheLossDerivative) {
  const auto math = make_cpu_mlp_math();
  constexpr int kClasses = 5;
  const std::vector<float> logits = random_floats(kBatch * kClasses, 7);
  const std::vector<int> labels = {0, 4, 2, 1, 3, 3, 0};
  std::vector<double> sample_losses(kBatch);
  auto loss_of = [&](std::vector<float> values) {
    return static_cast<double>(math->softmax_cross_entropy(
        values.data(), labels.data(), sample_losses.data(), kBatch, kClasses, 1.0f / kBatch));
  };
  std::vector<float> grad = logits;
  math->softmax_cross_entropy(grad.data(), labels.data(), sample_losses.data(), kBatch, kClasses,
                              1.0f / kBatch);
  const float step = 1e-2f;
  for (int k = 0; k < kBatch * kClasses; ++k) {
    std::vector<float> up = logits;
    std::vector<float> down = logits;
    up[k] += step;
    down[k] -= step;
    const double numeric = (loss_of(up) - loss_of(down)) / (2.0 * step);
    EXPECT_NEAR(grad[k], numeric, 1e-4) << "logit " << k;
  }
}

#if ZEROSHARD_EXAMPLE_WITH_CUDA
// Device copies of host vectors, freed at scope exit.
template <class T>
class OnDevice {
 public:
  explicit OnDevice(const std::vector<T>& host) : count_(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), count_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  ~OnDevice() { cudaFree(data_); }
  T* get() const { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

TEST(CudaMlpMath, MatchesTheCpuMath) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no usable CUDA device: " << cudaGetErrorString(cudaGetLastError());
  }
  const auto cpu = make_cpu_mlp_math();
  const auto gpu = make_cuda_mlp_math(0);
  LayerCase c;
  std::vector<float> output(kBatch * kOut);
  cpu->linear_forward(c.input.data(), c.weight.data(), c.bias.data(), output.data(), kBatch, kIn,
                      kOut, true);
  OnDevice<float> input(c.input), weight(c.weight), bias(c.bias), d_output(output);
  gpu->linear_forward(input.get(), weight.get(), bias.get(), d_output.get(), kBatch, kIn, kOut,
                      true);
  expect_near_all(d_output.download(), output, 1e-5f, "forward");

  std::vector<float> weight_grad = c.weight_grad;
  std::vector<float> bias_grad = c.bias_grad;
  std::vector<float> input_grad(kBatch * kIn);
  cpu->linear_grads(c.output_grad.data(), c.input.data(), weight_grad.data(), bias_grad.data(),
                    kBatch, kIn, kOut, true, true);
  cpu->input_grad(c.output_grad.data(), c.weight.data(), input_grad.data(), kBatch, kIn, kOut);
  OnDevice<float> output_grad(c.output_grad), d_weight_grad(c.weight_grad),
      d_bias_grad(c.bias_grad), d_input_grad(input_grad);
  gpu->linear_grads(output_grad.get(), input.get(), d_weight_grad.get(), d_bias_grad.get(), kBatch,
                    kIn, kOut, true, true);
  gpu->input_grad(output_grad.get(), weight.get(), d_input_grad.get(), kBatch, kIn, kOut);
  expect_near_all(d_weight_grad.download(), weight_grad, 1e-5f, "weight grad");
  expect_near_all(d_bias_grad.download(), bias_grad, 1e-5f, "bias grad");
  expect_near_all(d_input_grad.download(), input_grad, 1e-5f, "input grad");

  // Written instead of added: the NaN the buffers held is not read.
  std::vector<float> written_weight_grad(c.weight_grad.size(), std::nanf(""));
  std::vector<float> written_bias_grad(c.bias_grad.size(), std::nanf(""));
  OnDevice<float> d_written_weight_grad(written_weight_grad),
      d_written_bias_grad(written_bias_grad);
  cpu->linear_grads(c.output_grad.data(), c.input.data(), written_weight_grad.data(),
                    written_bias_grad.data(), kBatch, kIn, kOut, false, false);
  gpu->linear_grads(output_grad.get(), input.get(), d_written_weight_grad.get(),
                    d_written_bias_grad.get(), kBatch, kIn, kOut, false, false);
  expect_near_all(d_written_weight_grad.download(), written_weight_grad, 1e-5f,
                  "weight grad written");
  expect_near_all(d_written_bias_grad.download(), written_bias_grad, 1e-5f, "bias grad written");

  constexpr int kClasses = 5;
  std::vector<float> logits = random_floats(kBatch * kClasses, 8);
  const std::vector<int> labels = {0, 4, 2, 1, 3, 3, 0};
  OnDevice<float> d_logits(logits);
  OnDevice<int> d_labels(labels);
  OnDevice<double> d_losses{std::vector<double>(kBatch)};
  std::vector<double> losses(kBatch);
  const float want_loss = cpu->softmax_cross_entropy(logits.data(), labels.data(), losses.data(),
                                                     kBatch, kClasses, 0.5f);
  const float got_loss = gpu->softmax_cross_entropy(d_logits.get(), d_labels.get(), d_losses.get(),
                                                    kBatch, kClasses, 0.5f);
  EXPECT_NEAR(got_loss, want_loss, 1e-6f * want_loss);
  expect_near_all(d_logits.download(), logits, 1e-6f, "loss gradient");

  std::vector<float> dropped = c.output_grad;
  OnDevice<float> d_dropped(dropped);
  cpu->dropout(dropped.data(), static_cast<std::int64_t>(dropped.size()), 0.3f, 5, 77);
  gpu->dropout(d_dropped.get(), static_cast<std::int64_t>(dropped.size()), 0.3f, 5, 77);
  EXPECT_EQ(d_dropped.download(), dropped) << "dropout";

  std::vector<std::uint16_t> half(c.input.size());
  OnDevice<std::uint16_t> d_half(half);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    cpu->convert(c.input.data(), DType::kFloat32, half.data(), dtype,
                 static_cast<std::int64_t>(half.size()));
    gpu->convert(input.get(), DType::kFloat32, d_half.get(), dtype,
                 static_cast<std::int64_t>(half.size()));
    EXPECT_EQ(d_half.download(), half) << to_string(dtype);
  }
}
#endif

}  // namespace
}  // namespace zeroshard::examples
