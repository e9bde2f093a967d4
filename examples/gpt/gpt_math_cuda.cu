// The GPT's arithmetic on a GPU: cuBLAS sgemm for the matrix products (row-major operands passed
// as their column-major transposes) and simple kernels for the rest that add in the CPU loops'
// order (a thread per row, channel or query), all on one stream that the engine orders its own
// work and its collectives after. Written to mirror gpt_kernels_cpu.h, not for speed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_convert.h"
#include "cuda_support.h"
#include "gpt_math.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {
namespace {

constexpr CudaCheck check_cuda{"GPT example"};
constexpr float kEpsilon = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ std::int64_t thread_index() {
  return std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}

__global__ void embedding_forward_kernel(const int* tokens, const float* wte, const float* wpe,
                                         float* out, int rows, int seq, int channels) {
  const std::int64_t k = thread_index();
  if (k >= std::int64_t{rows} * channels) return;
  const std::int64_t row = k / channels;
  const int c = static_cast<int>(k % channels);
  out[k] = wte[std::int64_t{tokens[row]} * channels + c] + wpe[(row % seq) * channels + c];
}

// One thread per (vocabulary or position entry, channel), adding the rows in order.
__global__ void embedding_backward_kernel(const float* dout, const int* tokens, float* dwte,
                                          float* dwpe, int rows, int seq, int channels,
                                          int entries) {
  const std::int64_t k = thread_index();
  if (k >= std::int64_t{entries} * channels) return;
  const int entry = static_cast<int>(k / channels);
  const int c = static_cast<int>(k % channels);
  const int vocab = entries - seq;
  if (entry < vocab) {
    float sum = dwte[std::int64_t{entry} * channels + c];
    for (int row = 0; row < rows; ++row) {
      if (tokens[row] == entry) sum += dout[std::int64_t{row} * channels + c];
    }
    dwte[std::int64_t{entry} * channels + c] = sum;
  } else {
    const int t = entry - vocab;
    float sum = dwpe[std::int64_t{t} * channels + c];
    for (int row = t; row < rows; row += seq) sum += dout[std::int64_t{row} * channels + c];
    dwpe[std::int64_t{t} * channels + c] = sum;
  }
}

__global__ void layernorm_forward_kernel(const float* in, const float* weight, const float* bias,
                                         float* out, float* stats, int rows, int channels) {
  const std::int64_t r = thread_index();
  if (r >= rows) return;
  const float* x = in + r * channels;
  float* o = out + r * channels;
  float mean = 0.0f;
  for (int c = 0; c < channels; ++c) mean += x[c];
  mean /= static_cast<float>(channels);
  float variance = 0.0f;
  for (int c = 0; c < channels; ++c) variance += (x[c] - mean) * (x[c] - mean);
  variance /= static_cast<float>(channels);
  const float rstd = 1.0f / sqrtf(variance + kEpsilon);
  for (int c = 0; c < channels; ++c) o[c] = (x[c] - mean) * rstd * weight[c] + bias[c];
  stats[2 * r] = mean;
  stats[2 * r + 1] = rstd;
}

__global__ void layernorm_backward_input(const float* dout, const float* in, const float* weight,
                                         const float* stats, float* din, int rows, int channels) {
  const std::int64_t r = thread_index();
  if (r >= rows) return;
  const float* d = dout + r * channels;
  const float* x = in + r * channels;
  float* dx = din + r * channels;
  const float mean = stats[2 * r];
  const float rstd = stats[2 * r + 1];
  float dnorm_mean = 0.0f;
  float dnorm_norm_mean = 0.0f;
  for (int c = 0; c < channels; ++c) {
    const float norm = (x[c] - mean) * rstd;
    const float dnorm = d[c] * weight[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean /= static_cast<float>(channels);
  dnorm_norm_mean /= static_cast<float>(channels);
  for (int c = 0; c < channels; ++c) {
    const float norm = (x[c] - mean) * rstd;
    dx[c] += (d[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * rstd;
  }
}

__global__ void layernorm_backward_params(const float* dout, const float* in, const float* stats,
                                          float* dweight, float* dbias, int rows, int channels) {
  const std::int64_t c = thread_index();
  if (c >= channels) return;
  float dw = dweight[c];
  float db = dbias[c];
  for (int r = 0; r < rows; ++r) {
    const float d = dout[std::int64_t{r} * channels + c];
    db += d;
    dw += (in[std::int64_t{r} * channels + c] - stats[2 * r]) * stats[2 * r + 1] * d;
  }
  dweight[c] = dw;
  dbias[c] = db;
}

__global__ void fill_bias_rows(const float* bias, float* output, int rows, int out) {
  const std::int64_t k = thread_index();
  if (k < std::int64_t{rows} * out) output[k] = bias[k % out];
}

// One thread per output feature, summing over the rows in order, as the CPU loop does.
__global__ void add_bias_grad(const float* dout, float* dbias, int rows, int out) {
  const std::int64_t o = thread_index();
  if (o >= out) return;
  float sum = dbias[o];
  for (int r = 0; r < rows; ++r) sum += dout[std::int64_t{r} * out + o];
  dbias[o] = sum;
}

// One thread per (batch, head, query position).
__global__ void attention_forward_kernel(const float* qkv, float* att, float* out, int batch,
                                         int seq, int channels, int heads) {
  const std::int64_t k = thread_index();
  if (k >= std::int64_t{batch} * heads * seq) return;
  const int t = static_cast<int>(k % seq);
  const int h = static_cast<int>((k / seq) % heads);
  const std::int64_t b = k / (std::int64_t{seq} * heads);
  const int size = channels / heads;
  const float scale = 1.0f / sqrtf(static_cast<float>(size));
  const float* q = qkv + (b * seq + t) * 3 * channels + h * size;
  float* a = att + k * seq;
  float max_score = -INFINITY;
  for (int u = 0; u <= t; ++u) {
    const float* key = qkv + (b * seq + u) * 3 * channels + channels + h * size;
    float score = 0.0f;
    for (int i = 0; i < size; ++i) score += q[i] * key[i];
    a[u] = score * scale;
    max_score = fmaxf(max_score, a[u]);
  }
  float sum = 0.0f;
  for (int u = 0; u <= t; ++u) {
    a[u] = expf(a[u] - max_score);
    sum += a[u];
  }
  for (int u = 0; u <= t; ++u) a[u] /= sum;
  for (int u = t + 1; u < seq; ++u) a[u] = 0.0f;
  float* o = out + (b * seq + t) * channels + h * size;
  for (int i = 0; i < size; ++i) {
    float acc = 0.0f;
    for (int u = 0; u <= t; ++u) {
      acc += a[u] * qkv[(b * seq + u) * 3 * channels + 2 * channels + h * size + i];
    }
    o[i] = acc;
  }
}

// Per query: d(score) into datt, and dq. One thread per (batch, head, query position).
__global__ void attention_backward_query(const float* dout, const float* qkv, const float* att,
                                         float* dqkv, float* datt, int batch, int seq, int channels,
                                         int heads) {
  const std::int64_t k = thread_index();
  if (k >= std::int64_t{batch} * heads * seq) return;
  const int t = static_cast<int>(k % seq);
  const int h = static_cast<int>((k / seq) % heads);
  const std::int64_t b = k / (std::int64_t{seq} * heads);
  const int size = channels / heads;
  const float scale = 1.0f / sqrtf(static_cast<float>(size));
  const float* d = dout + (b * seq + t) * channels + h * size;
  const float* a = att + k * seq;
  float* ds = datt + k * seq;
  float weighted = 0.0f;
  for (int u = 0; u <= t; ++u) {
    const float* v = qkv + (b * seq + u) * 3 * channels + 2 * channels + h * size;
    float dot = 0.0f;
    for (int i = 0; i < size; ++i) dot += v[i] * d[i];
    ds[u] = dot;
    weighted += a[u] * dot;
  }
  for (int u = 0; u <= t; ++u) ds[u] = a[u] * (ds[u] - weighted) * scale;
  float* dq = dqkv + (b * seq + t) * 3 * channels + h * size;
  for (int i = 0; i < size; ++i) {
    float acc = 0.0f;
    for (int u = 0; u <= t; ++u) {
      acc += ds[u] * qkv[(b * seq + u) * 3 * channels + channels + h * size + i];
    }
    dq[i] = acc;
  }
}

// Per key position u: dk and dv summed over the queries t >= u in order. One thread per (batch,
// head, key position).
__global__ void attention_backward_key(const float* dout, const float* qkv, const float* att,
                                       float* dqkv, const float* datt, int batch, int seq,
                                       int channels, int heads) {
  const std::int64_t k = thread_index();
  if (k >= std::int64_t{batch} * heads * seq) return;
  const int u = static_cast<int>(k % seq);
  const int h = static_cast<int>((k / seq) % heads);
  const std::int64_t b = k / (std::int64_t{seq} * heads);
  const int size = channels / heads;
  const std::int64_t rows_of_head = k - u;  // (b, h, 0) in att's [batch, heads, seq] rows
  float* dk = dqkv + (b * seq + u) * 3 * channels + channels + h * size;
  float* dv = dk + channels;
  for (int i = 0; i < size; ++i) {
    float key = 0.0f;
    float value = 0.0f;
    for (int t = u; t < seq; ++t) {
      const std::int64_t at = (rows_of_head + t) * seq + u;
      key += datt[at] * qkv[(b * seq + t) * 3 * channels + h * size + i];
      value += att[at] * dout[(b * seq + t) * channels + h * size + i];
    }
    dk[i] = key;
    dv[i] = value;
  }
}

__global__ void gelu_forward_kernel(const float* in, float* out, std::int64_t count) {
  const std::int64_t k = thread_index();
  if (k >= count) return;
  const float x = in[k];
  out[k] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
}

__global__ void gelu_backward_kernel(const float* in, const float* dout, float* din,
                                     std::int64_t count) {
  const std::int64_t k = thread_index();
  if (k >= count) return;
  const float x = in[k];
  const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  const float dinner = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  din[k] = (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dinner) * dout[k];
}

__global__ void add_kernel(float* data, const float* other, std::int64_t count) {
  const std::int64_t k = thread_index();
  if (k < count) data[k] += other[k];
}

// One thread per row: the CPU's formula, in double where the CPU uses double. Without
// `gradient` the logits are only read.
__global__ void cross_entropy_kernel(float* logits, const int* targets, double* row_losses,
                                     int rows, int vocab, float grad_scale, bool gradient) {
  const std::int64_t r = thread_index();
  if (r >= rows) return;
  float* row = logits + r * vocab;
  float max_logit = row[0];
  for (int c = 1; c < vocab; ++c) max_logit = fmaxf(max_logit, row[c]);
  double sum = 0.0;
  for (int c = 0; c < vocab; ++c) sum += exp(static_cast<double>(row[c] - max_logit));
  const double log_sum = log(sum);
  row_losses[r] = log_sum - static_cast<double>(row[targets[r]] - max_logit);
  if (!gradient) return;
  for (int c = 0; c < vocab; ++c) {
    const double p = exp(static_cast<double>(row[c] - max_logit) - log_sum);
    row[c] = static_cast<float>(p - (c == targets[r] ? 1.0 : 0.0)) * grad_scale;
  }
}

class CudaGptMath final : public GptMath {
 public:
  explicit CudaGptMath(int device) : device_(device, check_cuda) {}

  void* stream() const noexcept override { return device_.stream(); }

  void embedding_forward(const int* tokens, const float* wte, const float* wpe, float* out,
                         int batch, int seq, int channels) override {
    const int rows = batch * seq;
    embedding_forward_kernel<<<blocks_for(std::int64_t{rows} * channels), kThreads, 0, s()>>>(
        tokens, wte, wpe, out, rows, seq, channels);
    check_cuda(cudaGetLastError(), "embedding_forward");
  }

  void embedding_backward(const float* dout, const int* tokens, float* dwte, float* dwpe, int batch,
                          int seq, int channels, int vocab) override {
    const int entries = vocab + seq;
    embedding_backward_kernel<<<blocks_for(std::int64_t{entries} * channels), kThreads, 0, s()>>>(
        dout, tokens, dwte, dwpe, batch * seq, seq, channels, entries);
    check_cuda(cudaGetLastError(), "embedding_backward");
  }

  void layernorm_forward(const float* in, const float* weight, const float* bias, float* out,
                         float* stats, int rows, int channels) override {
    layernorm_forward_kernel<<<blocks_for(rows), kThreads, 0, s()>>>(in, weight, bias, out, stats,
                                                                     rows, channels);
    check_cuda(cudaGetLastError(), "layernorm_forward");
  }

  void layernorm_backward(const float* dout, const float* in, const float* weight,
                          const float* stats, float* din, float* dweight, float* dbias, int rows,
                          int channels) override {
    layernorm_backward_input<<<blocks_for(rows), kThreads, 0, s()>>>(dout, in, weight, stats, din,
                                                                     rows, channels);
    check_cuda(cudaGetLastError(), "layernorm_backward (input)");
    layernorm_backward_params<<<blocks_for(channels), kThreads, 0, s()>>>(dout, in, stats, dweight,
                                                                          dbias, rows, channels);
    check_cuda(cudaGetLastError(), "layernorm_backward (parameters)");
  }

  void matmul_forward(const float* in, const float* weight, const float* bias, float* out, int rows,
                      int in_features, int out_features) override {
    if (bias != nullptr) {
      fill_bias_rows<<<blocks_for(std::int64_t{rows} * out_features), kThreads, 0, s()>>>(
          bias, out, rows, out_features);
      check_cuda(cudaGetLastError(), "fill_bias_rows");
    }
    // out^T [out x rows] (+)= weight [out x in] * in^T [in x rows]
    const float one = 1.0f;
    const float beta = bias != nullptr ? 1.0f : 0.0f;
    check_cuda(
        cublasSgemm(device_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out_features, rows, in_features,
                    &one, weight, in_features, in, in_features, &beta, out, out_features),
        "cublasSgemm (forward)");
  }

  void matmul_backward(const float* dout, const float* in, const float* weight, float* din,
                       float* dweight, float* dbias, int rows, int in_features,
                       int out_features) override {
    const float one = 1.0f;
    const float zero = 0.0f;
    if (din != nullptr) {
      // din^T [in x rows] = weight^T [in x out] * dout^T [out x rows]
      check_cuda(
          cublasSgemm(device_.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, in_features, rows, out_features,
                      &one, weight, in_features, dout, out_features, &zero, din, in_features),
          "cublasSgemm (input gradient)");
    }
    // dweight^T [in x out] += in^T [in x rows] * dout [rows x out]
    check_cuda(
        cublasSgemm(device_.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, in_features, out_features, rows,
                    &one, in, in_features, dout, out_features, &one, dweight, in_features),
        "cublasSgemm (weight gradient)");
    if (dbias != nullptr) {
      add_bias_grad<<<blocks_for(out_features), kThreads, 0, s()>>>(dout, dbias, rows,
                                                                    out_features);
      check_cuda(cudaGetLastError(), "add_bias_grad");
    }
  }

  void attention_forward(const float* qkv, float* att, float* out, int batch, int seq, int channels,
                         int heads) override {
    attention_forward_kernel<<<blocks_for(std::int64_t{batch} * heads * seq), kThreads, 0, s()>>>(
        qkv, att, out, batch, seq, channels, heads);
    check_cuda(cudaGetLastError(), "attention_forward");
  }

  void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv,
                          float* datt, int batch, int seq, int channels, int heads) override {
    const unsigned blocks = blocks_for(std::int64_t{batch} * heads * seq);
    attention_backward_query<<<blocks, kThreads, 0, s()>>>(dout, qkv, att, dqkv, datt, batch, seq,
                                                           channels, heads);
    check_cuda(cudaGetLastError(), "attention_backward (queries)");
    attention_backward_key<<<blocks, kThreads, 0, s()>>>(dout, qkv, att, dqkv, datt, batch, seq,
                                                         channels, heads);
    check_cuda(cudaGetLastError(), "attention_backward (keys)");
  }

  void gelu_forward(const float* in, float* out, std::int64_t count) override {
    gelu_forward_kernel<<<blocks_for(count), kThreads, 0, s()>>>(in, out, count);
    check_cuda(cudaGetLastError(), "gelu_forward");
  }

  void gelu_backward(const float* in, const float* dout, float* din, std::int64_t count) override {
    gelu_backward_kernel<<<blocks_for(count), kThreads, 0, s()>>>(in, dout, din, count);
    check_cuda(cudaGetLastError(), "gelu_backward");
  }

  void add_in_place(float* data, const float* other, std::int64_t count) override {
    add_kernel<<<blocks_for(count), kThreads, 0, s()>>>(data, other, count);
    check_cuda(cudaGetLastError(), "add_in_place");
  }

  double cross_entropy(float* logits, const int* targets, double* row_losses, int rows, int vocab,
                       float grad_scale) override {
    return run_cross_entropy(logits, targets, row_losses, rows, vocab, grad_scale, true);
  }

  double cross_entropy_loss(const float* logits, const int* targets, double* row_losses, int rows,
                            int vocab) override {
    // Without the gradient the kernel only reads the logits.
    return run_cross_entropy(const_cast<float*>(logits), targets, row_losses, rows, vocab, 0.0f,
                             false);
  }

  void zero(void* data, std::size_t bytes) override {
    check_cuda(cudaMemsetAsync(data, 0, bytes, s()), "cudaMemsetAsync");
  }

  void convert(const void* in, DType from, void* out, DType to, std::int64_t count) override {
    if (from == to) {
      copy(out, in, static_cast<std::size_t>(count) * size_of(from));
      return;
    }
    convert_on_stream(in, from, out, to, count, device_.stream(), check_cuda);
  }

  void copy(void* destination, const void* source, std::size_t bytes) override {
    check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, s()),
               "cudaMemcpyAsync (copy)");
  }

  void upload(void* destination, const void* host, std::size_t bytes) override {
    check_cuda(cudaMemcpyAsync(destination, host, bytes, cudaMemcpyHostToDevice, s()),
               "cudaMemcpyAsync (upload)");
    // The host batch is refilled as soon as this returns.
    check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize (upload)");
  }

 private:
  cudaStream_t s() const noexcept { return device_.stream(); }

  double run_cross_entropy(float* logits, const int* targets, double* row_losses, int rows,
                           int vocab, float grad_scale, bool gradient) {
    cross_entropy_kernel<<<blocks_for(rows), kThreads, 0, s()>>>(logits, targets, row_losses, rows,
                                                                 vocab, grad_scale, gradient);
    check_cuda(cudaGetLastError(), "cross_entropy");
    host_losses_.resize(static_cast<std::size_t>(rows));
    check_cuda(cudaMemcpyAsync(host_losses_.data(), row_losses,
                               host_losses_.size() * sizeof(double), cudaMemcpyDeviceToHost, s()),
               "cudaMemcpyAsync (losses)");
    check_cuda(cudaStreamSynchronize(s()), "cudaStreamSynchronize (losses)");
    double loss = 0.0;
    for (double row : host_losses_) loss += row;
    return loss / rows;
  }

  CudaDeviceStream device_;
  std::vector<double> host_losses_;
};

}  // namespace

std::unique_ptr<GptMath> make_cuda_gpt_math(int device) {
  return std::make_unique<CudaGptMath>(device);
}

}  // namespace zeroshard::examples
