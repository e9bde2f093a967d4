// The example GPT's backward: every parameter's gradient of a tiny model (two blocks, the tied
// head, the cross-entropy) against central finite differences of the loss, in double; the fp32
// CPU math against the double one; and the GPU math against the CPU math (skipped, saying why,
// without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpt_kernels_cpu.h"
#include "gpt_layers.h"
#include "gpt_math.h"

#if ZEROSHARD_EXAMPLE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zeroshard::examples {
namespace {

constexpr GptShape kShape{.vocab = 7, .layers = 2, .channels = 8, .heads = 2, .seq = 5};
constexpr int kBatch = 2;
constexpr int kRows = kBatch * kShape.seq;

// Where each tensor sits in one flat parameter vector, in the engine's registration order.
struct Tensor {
  std::string name;
  std::size_t offset;
  std::size_t numel;
};

std::vector<Tensor> layout() {
  std::vector<Tensor> tensors;
  std::size_t at = 0;
  auto add = [&](std::string name, std::size_t numel) {
    tensors.push_back({std::move(name), at, numel});
    at += numel;
  };
  add("wte.weight", kShape.vocab * kShape.channels);
  add("wpe.weight", kShape.seq * kShape.channels);
  for (int l = 0; l < kShape.layers; ++l) {
    for (int t = 0; t < kBlockTensors; ++t) {
      std::size_t numel = 1;
      for (std::int64_t d : block_tensor_shape(t, kShape.channels)) numel *= d;
      add("h" + std::to_string(l) + "." + block_tensor_name(t), numel);
    }
  }
  add("ln_f.weight", kShape.channels);
  add("ln_f.bias", kShape.channels);
  return tensors;
}

std::size_t total(const std::vector<Tensor>& tensors) {
  return tensors.back().offset + tensors.back().numel;
}

// Random weights with layer norm weights near 1, so every path carries a gradient.
std::vector<double> random_parameters(const std::vector<Tensor>& tensors) {
  std::mt19937 generator(11);
  std::normal_distribution<double> normal(0.0, 0.5);
  std::vector<double> values(total(tensors));
  for (const Tensor& t : tensors) {
    const bool norm_weight =
        t.name.find("ln_") != std::string::npos && t.name.find(".weight") != std::string::npos;
    for (std::size_t i = 0; i < t.numel; ++i) {
      values[t.offset + i] = (norm_weight ? 1.0 : 0.0) + normal(generator);
    }
  }
  return values;
}

std::vector<int> random_tokens(unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int> token(0, kShape.vocab - 1);
  std::vector<int> ids(kRows);
  for (int& id : ids) id = token(generator);
  return ids;
}

// Buffers in host memory.
template <class T>
class HostMemory {
 public:
  T* alloc(std::size_t count) {
    buffers_.emplace_back(count, T(0));
    return buffers_.back().data();
  }
  template <class V>
  V* upload(const std::vector<V>& values) {
    auto* data =
        reinterpret_cast<V*>(alloc((values.size() * sizeof(V) + sizeof(T) - 1) / sizeof(T)));
    std::copy(values.begin(), values.end(), data);
    return data;
  }
  std::vector<T> download(const T* data, std::size_t count) {
    return std::vector<T>(data, data + count);
  }

 private:
  std::vector<std::vector<T>> buffers_;
};

// The loss of one micro-batch and, with `grads`, d(loss)/d(parameters): the model's sequence of
// layers (gpt_model.cpp) on plain buffers.
template <class T, class Math, class Memory>
double run_model(Math& math, Memory& memory, const std::vector<Tensor>& tensors,
                 const std::vector<T>& parameters, const std::vector<int>& tokens,
                 const std::vector<int>& targets, std::vector<T>* grads) {
  const GptShape& s = kShape;
  const std::size_t c = s.channels;
  T* p = memory.upload(parameters);
  T* g = memory.alloc(parameters.size());
  const int* d_tokens = memory.upload(tokens);
  const int* d_targets = memory.upload(targets);
  auto* losses = reinterpret_cast<double*>(memory.alloc(kRows * sizeof(double) / sizeof(T) + 1));
  std::vector<T*> inputs(s.layers + 1);
  std::vector<T*> scratch(s.layers);
  for (T*& x : inputs) x = memory.alloc(kRows * c);
  for (T*& x : scratch) x = memory.alloc(BlockScratch(s, kBatch).total);
  T* lnf = memory.alloc(kRows * c);
  T* lnf_stats = memory.alloc(kRows * 2);
  T* logits = memory.alloc(kRows * s.vocab);
  BackwardBuffers<T> buffers{memory.alloc(kRows * c), memory.alloc(kRows * c),
                             memory.alloc(kRows * 4 * c),
                             memory.alloc(kBatch * s.heads * s.seq * s.seq)};
  auto block = [&](auto* base, int l) {
    BlockTensors<decltype(base)> tensors_of_block;
    for (int t = 0; t < kBlockTensors; ++t) {
      tensors_of_block[t] = base + tensors[2 + l * kBlockTensors + t].offset;
    }
    return tensors_of_block;
  };
  const Tensor& wte = tensors[0];
  const Tensor& wpe = tensors[1];
  const Tensor& lnf_weight = tensors[tensors.size() - 2];
  const Tensor& lnf_bias = tensors[tensors.size() - 1];
  const T* cp = p;

  math.embedding_forward(d_tokens, cp + wte.offset, cp + wpe.offset, inputs[0], kBatch, s.seq,
                         s.channels);
  for (int l = 0; l < s.layers; ++l) {
    block_forward(math, s, kBatch, block(cp, l), inputs[l], scratch[l], inputs[l + 1]);
  }
  head_forward(math, s, kBatch, cp + lnf_weight.offset, cp + lnf_bias.offset, cp + wte.offset,
               inputs[s.layers], lnf, lnf_stats, logits);
  const double loss = math.cross_entropy(logits, d_targets, losses, kRows, s.vocab, T(1) / kRows);
  if (grads == nullptr) return loss;
  head_backward(math, s, kBatch, cp + lnf_weight.offset, cp + wte.offset, inputs[s.layers], lnf,
                lnf_stats, logits, g + wte.offset, g + lnf_weight.offset, g + lnf_bias.offset,
                buffers);
  for (int l = s.layers - 1; l >= 0; --l) {
    block_backward(math, s, kBatch, block(cp, l), block(g, l), inputs[l], scratch[l], buffers);
  }
  math.embedding_backward(buffers.residual, d_tokens, g + wte.offset, g + wpe.offset, kBatch, s.seq,
                          s.channels, s.vocab);
  *grads = memory.download(g, parameters.size());
  return loss;
}

TEST(GptGradient, EveryParameterMatchesCentralDifferencesInDouble) {
  const std::vector<Tensor> tensors = layout();
  std::vector<double> parameters = random_parameters(tensors);
  const std::vector<int> tokens = random_tokens(1);
  const std::vector<int> targets = random_tokens(2);
  CpuGptKernels<double> math;
  auto loss_at = [&](const std::vector<double>& values, std::vector<double>* grads) {
    HostMemory<double> memory;
    return run_model(math, memory, tensors, values, tokens, targets, grads);
  };
  std::vector<double> grads;
  loss_at(parameters, &grads);
  constexpr double kStep = 1e-5;
  for (const Tensor& t : tensors) {
    double worst = 0.0;
    double largest = 0.0;
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double saved = parameters[i];
      parameters[i] = saved + kStep;
      const double up = loss_at(parameters, nullptr);
      parameters[i] = saved - kStep;
      const double down = loss_at(parameters, nullptr);
      parameters[i] = saved;
      const double numeric = (up - down) / (2 * kStep);
      worst = std::max(worst, std::fabs(grads[i] - numeric));
      largest = std::max(largest, std::fabs(numeric));
    }
    // Central differences are exact to O(step^2) ~ 1e-10 here, far below a wrong term's size.
    EXPECT_LT(worst, 1e-7) << t.name << ": largest gradient " << largest;
    EXPECT_GT(largest, 1e-4) << t.name << " gets no gradient: the check would prove nothing";
  }
}

// The fp32 math the model trains with, against the double math, on the same tiny model.
TEST(GptGradient, Fp32CpuMathMatchesTheDoubleMath) {
  const std::vector<Tensor> tensors = layout();
  const std::vector<double> parameters = random_parameters(tensors);
  const std::vector<float> parameters32(parameters.begin(), parameters.end());
  const std::vector<int> tokens = random_tokens(3);
  const std::vector<int> targets = random_tokens(4);
  CpuGptKernels<double> reference;
  HostMemory<double> reference_memory;
  std::vector<double> want;
  const double want_loss =
      run_model(reference, reference_memory, tensors, parameters, tokens, targets, &want);
  const auto math = make_cpu_gpt_math();
  HostMemory<float> memory;
  std::vector<float> got;
  const double got_loss = run_model(*math, memory, tensors, parameters32, tokens, targets, &got);
  EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss);
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4 * std::max(1.0, std::fabs(want[i]))) << "parameter " << i;
  }
}

#if ZEROSHARD_EXAMPLE_WITH_CUDA
// Buffers in device memory, freed at scope exit.
template <class T>
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    for (void* p : buffers_) cudaFree(p);
  }
  T* alloc(std::size_t count) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, count * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, count * sizeof(T)), cudaSuccess);
    buffers_.push_back(p);
    return static_cast<T*>(p);
  }
  template <class V>
  V* upload(const std::vector<V>& values) {
    auto* data =
        reinterpret_cast<V*>(alloc((values.size() * sizeof(V) + sizeof(T) - 1) / sizeof(T)));
    EXPECT_EQ(cudaMemcpy(data, values.data(), values.size() * sizeof(V), cudaMemcpyHostToDevice),
              cudaSuccess);
    return data;
  }
  std::vector<T> download(const T* data, std::size_t count) {
    std::vector<T> host(count);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  std::vector<void*> buffers_;
};

TEST(CudaGptMath, MatchesTheCpuMathOnTheWholeModel) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no usable CUDA device: " << cudaGetErrorString(cudaGetLastError());
  }
  const std::vector<Tensor> tensors = layout();
  const std::vector<double> parameters = random_parameters(tensors);
  const std::vector<float> parameters32(parameters.begin(), parameters.end());
  const std::vector<int> tokens = random_tokens(5);
  const std::vector<int> targets = random_tokens(6);
  const auto cpu = make_cpu_gpt_math();
  HostMemory<float> host;
  std::vector<float> want;
  const double want_loss = run_model(*cpu, host, tensors, parameters32, tokens, targets, &want);
  const auto gpu = make_cuda_gpt_math(0);
  DeviceMemory<float> device;
  std::vector<float> got;
  const double got_loss = run_model(*gpu, device, tensors, parameters32, tokens, targets, &got);
  EXPECT_NEAR(got_loss, want_loss, 1e-5 * want_loss);
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4 * std::max(1.0f, std::fabs(want[i]))) << "parameter " << i;
  }
}
#endif

}  // namespace
}  // namespace zeroshard::examples
