// The GPT's layer operations on the CPU for any floating-point T: OpenBLAS for the matrix
// products, plain loops in a fixed order for the rest, so that every rank's results are
// bit-identical from run to run. Float serves training (gpt_math_cpu.cpp); double serves the
// finite-difference gradient check (gpt_gradcheck_test.cpp). Members as GptMath's (gpt_math.h).
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace zeroshard::examples {

namespace cpu_blas {
inline void gemm(CBLAS_TRANSPOSE a_op, CBLAS_TRANSPOSE b_op, int m, int n, int k, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, a_op, b_op, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(CBLAS_TRANSPOSE a_op, CBLAS_TRANSPOSE b_op, int m, int n, int k, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, a_op, b_op, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}
}  // namespace cpu_blas

/// GPT-2's constants: layer norm epsilon and the tanh approximation of GELU.
inline constexpr double kLayerNormEpsilon = 1e-5;
inline constexpr double kGeluCubic = 0.044715;

template <class T>
class CpuGptKernels {
 public:
  void embedding_forward(const int* tokens, const T* wte, const T* wpe, T* out, int batch, int seq,
                         int channels) const {
    for (int b = 0; b < batch; ++b) {
      for (int t = 0; t < seq; ++t) {
        const std::size_t row = static_cast<std::size_t>(b) * seq + t;
        const T* token = wte + static_cast<std::size_t>(tokens[row]) * channels;
        const T* position = wpe + static_cast<std::size_t>(t) * channels;
        T* o = out + row * channels;
        for (int c = 0; c < channels; ++c) o[c] = token[c] + position[c];
      }
    }
  }

  void embedding_backward(const T* dout, const int* tokens, T* dwte, T* dwpe, int batch, int seq,
                          int channels, int /*vocab*/) const {
    for (int b = 0; b < batch; ++b) {
      for (int t = 0; t < seq; ++t) {
        const std::size_t row = static_cast<std::size_t>(b) * seq + t;
        const T* d = dout + row * channels;
        T* token = dwte + static_cast<std::size_t>(tokens[row]) * channels;
        T* position = dwpe + static_cast<std::size_t>(t) * channels;
        for (int c = 0; c < channels; ++c) {
          token[c] += d[c];
          position[c] += d[c];
        }
      }
    }
  }

  void layernorm_forward(const T* in, const T* weight, const T* bias, T* out, T* stats, int rows,
                         int channels) const {
    for (int r = 0; r < rows; ++r) {
      const T* x = in + static_cast<std::size_t>(r) * channels;
      T* o = out + static_cast<std::size_t>(r) * channels;
      T mean = 0;
      for (int c = 0; c < channels; ++c) mean += x[c];
      mean /= static_cast<T>(channels);
      T variance = 0;
      for (int c = 0; c < channels; ++c) variance += (x[c] - mean) * (x[c] - mean);
      variance /= static_cast<T>(channels);
      const T rstd = T(1) / std::sqrt(variance + static_cast<T>(kLayerNormEpsilon));
      for (int c = 0; c < channels; ++c) o[c] = (x[c] - mean) * rstd * weight[c] + bias[c];
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }

  void layernorm_backward(const T* dout, const T* in, const T* weight, const T* stats, T* din,
                          T* dweight, T* dbias, int rows, int channels) const {
    for (int r = 0; r < rows; ++r) {
      const T* d = dout + static_cast<std::size_t>(r) * channels;
      const T* x = in + static_cast<std::size_t>(r) * channels;
      T* dx = din + static_cast<std::size_t>(r) * channels;
      const T mean = stats[2 * r];
      const T rstd = stats[2 * r + 1];
      // d(in) = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * weight.
      T dnorm_mean = 0;
      T dnorm_norm_mean = 0;
      for (int c = 0; c < channels; ++c) {
        const T norm = (x[c] - mean) * rstd;
        const T dnorm = d[c] * weight[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<T>(channels);
      dnorm_norm_mean /= static_cast<T>(channels);
      for (int c = 0; c < channels; ++c) {
        const T norm = (x[c] - mean) * rstd;
        const T dnorm = d[c] * weight[c];
        dbias[c] += d[c];
        dweight[c] += norm * d[c];
        dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
      }
    }
  }

  void matmul_forward(const T* in, const T* weight, const T* bias, T* out, int rows,
                      int in_features, int out_features) const {
    if (bias != nullptr) {
      for (int r = 0; r < rows; ++r) {
        std::copy(bias, bias + out_features, out + static_cast<std::size_t>(r) * out_features);
      }
    }
    cpu_blas::gemm(CblasNoTrans, CblasTrans, rows, out_features, in_features, in, in_features,
                   weight, in_features, bias != nullptr ? T(1) : T(0), out, out_features);
  }

  void matmul_backward(const T* dout, const T* in, const T* weight, T* din, T* dweight, T* dbias,
                       int rows, int in_features, int out_features) const {
    if (din != nullptr) {
      cpu_blas::gemm(CblasNoTrans, CblasNoTrans, rows, in_features, out_features, dout,
                     out_features, weight, in_features, T(0), din, in_features);
    }
    cpu_blas::gemm(CblasTrans, CblasNoTrans, out_features, in_features, rows, dout, out_features,
                   in, in_features, T(1), dweight, in_features);
    if (dbias != nullptr) {
      for (int r = 0; r < rows; ++r) {
        const T* row = dout + static_cast<std::size_t>(r) * out_features;
        for (int o = 0; o < out_features; ++o) dbias[o] += row[o];
      }
    }
  }

  void attention_forward(const T* qkv, T* att, T* out, int batch, int seq, int channels,
                         int heads) const {
    const int size = channels / heads;
    const T scale = T(1) / std::sqrt(static_cast<T>(size));
    for (int b = 0; b < batch; ++b) {
      for (int h = 0; h < heads; ++h) {
        for (int t = 0; t < seq; ++t) {
          const T* q = qkv + (static_cast<std::size_t>(b) * seq + t) * 3 * channels + h * size;
          T* a = att + ((static_cast<std::size_t>(b) * heads + h) * seq + t) * seq;
          // Subtracting the row maximum keeps exp() finite; it cancels out of the softmax.
          T max_score = -INFINITY;
          for (int u = 0; u <= t; ++u) {
            const T* k = key(qkv, b, u, h, seq, channels, size);
            T score = 0;
            for (int i = 0; i < size; ++i) score += q[i] * k[i];
            a[u] = score * scale;
            max_score = std::max(max_score, a[u]);
          }
          T sum = 0;
          for (int u = 0; u <= t; ++u) {
            a[u] = std::exp(a[u] - max_score);
            sum += a[u];
          }
          for (int u = 0; u <= t; ++u) a[u] /= sum;
          for (int u = t + 1; u < seq; ++u) a[u] = 0;
          T* o = out + (static_cast<std::size_t>(b) * seq + t) * channels + h * size;
          for (int i = 0; i < size; ++i) o[i] = 0;
          for (int u = 0; u <= t; ++u) {
            const T* v = key(qkv, b, u, h, seq, channels, size) + channels;
            for (int i = 0; i < size; ++i) o[i] += a[u] * v[i];
          }
        }
      }
    }
  }

  void attention_backward(const T* dout, const T* qkv, const T* att, T* dqkv, T* datt, int batch,
                          int seq, int channels, int heads) const {
    const int size = channels / heads;
    const T scale = T(1) / std::sqrt(static_cast<T>(size));
    std::fill(dqkv, dqkv + static_cast<std::size_t>(batch) * seq * 3 * channels, T(0));
    for (int b = 0; b < batch; ++b) {
      for (int h = 0; h < heads; ++h) {
        for (int t = 0; t < seq; ++t) {
          const std::size_t row = static_cast<std::size_t>(b) * seq + t;
          const T* q = qkv + row * 3 * channels + h * size;
          T* dq = dqkv + row * 3 * channels + h * size;
          const T* d = dout + row * channels + h * size;
          const T* a = att + ((static_cast<std::size_t>(b) * heads + h) * seq + t) * seq;
          T* da = datt + ((static_cast<std::size_t>(b) * heads + h) * seq + t) * seq;
          // Through the weighted sum of values, then through the softmax.
          T weighted = 0;
          for (int u = 0; u <= t; ++u) {
            const T* v = key(qkv, b, u, h, seq, channels, size) + channels;
            T* dv = key(dqkv, b, u, h, seq, channels, size) + channels;
            T dot = 0;
            for (int i = 0; i < size; ++i) {
              dot += v[i] * d[i];
              dv[i] += a[u] * d[i];
            }
            da[u] = dot;
            weighted += a[u] * dot;
          }
          for (int u = 0; u <= t; ++u) {
            const T dscore = a[u] * (da[u] - weighted) * scale;
            const T* k = key(qkv, b, u, h, seq, channels, size);
            T* dk = key(dqkv, b, u, h, seq, channels, size);
            for (int i = 0; i < size; ++i) {
              dq[i] += dscore * k[i];
              dk[i] += dscore * q[i];
            }
          }
        }
      }
    }
  }

  void gelu_forward(const T* in, T* out, std::int64_t count) const {
    for (std::int64_t k = 0; k < count; ++k) {
      const T x = in[k];
      const T inner = gelu_scale() * (x + static_cast<T>(kGeluCubic) * x * x * x);
      out[k] = T(0.5) * x * (T(1) + std::tanh(inner));
    }
  }

  void gelu_backward(const T* in, const T* dout, T* din, std::int64_t count) const {
    for (std::int64_t k = 0; k < count; ++k) {
      const T x = in[k];
      const T inner = gelu_scale() * (x + static_cast<T>(kGeluCubic) * x * x * x);
      const T th = std::tanh(inner);
      const T dinner = gelu_scale() * (T(1) + T(3) * static_cast<T>(kGeluCubic) * x * x);
      din[k] = (T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * dinner) * dout[k];
    }
  }

  void add_in_place(T* data, const T* other, std::int64_t count) const {
    for (std::int64_t k = 0; k < count; ++k) data[k] += other[k];
  }

  double cross_entropy(T* logits, const int* targets, double* row_losses, int rows, int vocab,
                       T grad_scale) const {
    double loss = 0.0;
    for (int r = 0; r < rows; ++r) {
      T* row = logits + static_cast<std::size_t>(r) * vocab;
      const T max_logit = *std::max_element(row, row + vocab);
      const double log_sum = row_log_sum(row, vocab, max_logit);
      row_losses[r] = log_sum - static_cast<double>(row[targets[r]] - max_logit);
      loss += row_losses[r];
      // d(mean loss)/d(logit) = (softmax - one_hot) / rows; grad_scale carries the 1 / rows.
      for (int c = 0; c < vocab; ++c) {
        const double p = std::exp(static_cast<double>(row[c] - max_logit) - log_sum);
        row[c] = static_cast<T>(p - (c == targets[r] ? 1.0 : 0.0)) * grad_scale;
      }
    }
    return loss / rows;
  }

  double cross_entropy_loss(const T* logits, const int* targets, double* row_losses, int rows,
                            int vocab) const {
    double loss = 0.0;
    for (int r = 0; r < rows; ++r) {
      const T* row = logits + static_cast<std::size_t>(r) * vocab;
      const T max_logit = *std::max_element(row, row + vocab);
      row_losses[r] =
          row_log_sum(row, vocab, max_logit) - static_cast<double>(row[targets[r]] - max_logit);
      loss += row_losses[r];
    }
    return loss / rows;
  }

  void zero(void* data, std::size_t bytes) const {
    if (bytes > 0) std::memset(data, 0, bytes);
  }

 private:
  // sqrt(2 / pi).
  static constexpr T gelu_scale() { return static_cast<T>(0.7978845608028654); }

  // The key of position u in head h (its value follows `channels` later).
  template <class P>
  static P* key(P* qkv, int b, int u, int h, int seq, int channels, int size) {
    return qkv + (static_cast<std::size_t>(b) * seq + u) * 3 * channels + channels + h * size;
  }

  // log(sum(exp(row - max_logit))), in double; subtracting the maximum keeps exp() finite.
  static double row_log_sum(const T* row, int vocab, T max_logit) {
    double sum = 0.0;
    for (int c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(row[c] - max_logit));
    return std::log(sum);
  }
};

}  // namespace zeroshard::examples
