// The GPT's arithmetic on the CPU: GptMath over CpuGptKernels<float>.
#include <cstring>

#include "device_math.h"
#include "gpt_kernels_cpu.h"
#include "gpt_math.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

class CpuGptMath final : public CpuDataMoves<GptMath> {
 public:
  void embedding_forward(const int* tokens, const float* wte, const float* wpe, float* out,
                         int batch, int seq, int channels) override {
    k_.embedding_forward(tokens, wte, wpe, out, batch, seq, channels);
  }
  void embedding_backward(const float* dout, const int* tokens, float* dwte, float* dwpe, int batch,
                          int seq, int channels, int vocab) override {
    k_.embedding_backward(dout, tokens, dwte, dwpe, batch, seq, channels, vocab);
  }
  void layernorm_forward(const float* in, const float* weight, const float* bias, float* out,
                         float* stats, int rows, int channels) override {
    k_.layernorm_forward(in, weight, bias, out, stats, rows, channels);
  }
  void layernorm_backward(const float* dout, const float* in, const float* weight,
                          const float* stats, float* din, float* dweight, float* dbias, int rows,
                          int channels) override {
    k_.layernorm_backward(dout, in, weight, stats, din, dweight, dbias, rows, channels);
  }
  void matmul_forward(const float* in, const float* weight, const float* bias, float* out, int rows,
                      int in_features, int out_features) override {
    k_.matmul_forward(in, weight, bias, out, rows, in_features, out_features);
  }
  void matmul_backward(const float* dout, const float* in, const float* weight, float* din,
                       float* dweight, float* dbias, int rows, int in_features,
                       int out_features) override {
    k_.matmul_backward(dout, in, weight, din, dweight, dbias, rows, in_features, out_features);
  }
  void attention_forward(const float* qkv, float* att, float* out, int batch, int seq, int channels,
                         int heads) override {
    k_.attention_forward(qkv, att, out, batch, seq, channels, heads);
  }
  void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv,
                          float* datt, int batch, int seq, int channels, int heads) override {
    k_.attention_backward(dout, qkv, att, dqkv, datt, batch, seq, channels, heads);
  }
  void gelu_forward(const float* in, float* out, std::int64_t count) override {
    k_.gelu_forward(in, out, count);
  }
  void gelu_backward(const float* in, const float* dout, float* din, std::int64_t count) override {
    k_.gelu_backward(in, dout, din, count);
  }
  void add_in_place(float* data, const float* other, std::int64_t count) override {
    k_.add_in_place(data, other, count);
  }
  double cross_entropy(float* logits, const int* targets, double* row_losses, int rows, int vocab,
                       float grad_scale) override {
    return k_.cross_entropy(logits, targets, row_losses, rows, vocab, grad_scale);
  }
  double cross_entropy_loss(const float* logits, const int* targets, double* row_losses, int rows,
                            int vocab) override {
    return k_.cross_entropy_loss(logits, targets, row_losses, rows, vocab);
  }

  void zero(void* data, std::size_t bytes) override { k_.zero(data, bytes); }

 private:
  CpuGptKernels<float> k_;
};

}  // namespace

std::unique_ptr<GptMath> make_cpu_gpt_math() { return std::make_unique<CpuGptMath>(); }

std::unique_ptr<GptMath> make_gpt_math(const Device& device) {
#if ZEROSHARD_EXAMPLE_WITH_CUDA
  return make_math_for<GptMath>(device, "GPT", make_cpu_gpt_math, make_cuda_gpt_math);
#else
  return make_math_for<GptMath>(device, "GPT", make_cpu_gpt_math, nullptr);
#endif
}

}  // namespace zeroshard::examples
