// The GPT's layers composed from the operations of a math object (GptMath in fp32 for training,
// CpuGptKernels<double> for the gradient check), with the parameters passed in as pointers so
// that the same code runs on the engine's buffers and on a test's plain vectors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zeroshard::examples {

/// A decoder-only transformer: token and position embeddings, `layers` pre-norm blocks of
/// `heads`-head causal self-attention and a 4x GELU MLP, a final layer norm, and an output head
/// tied to the token embedding.
struct GptShape {
  int vocab = 0;
  int layers = 4;
  int channels = 128;
  int heads = 4;
  int seq = 64;
};

/// One block's tensors, in the order they are registered (and laid out in its module).
enum BlockTensor {
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kFcProjWeight,
  kFcProjBias,
  kBlockTensors
};

template <class P>
using BlockTensors = std::array<P, kBlockTensors>;

/// The name (after "h{layer}.") and shape of a block tensor, as GPT-2 names them.
inline const char* block_tensor_name(int tensor) {
  static constexpr const char* kNames[kBlockTensors] = {
      "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
      "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
      "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  return kNames[tensor];
}

inline std::vector<std::int64_t> block_tensor_shape(int tensor, std::int64_t channels) {
  const std::int64_t c = channels;
  switch (tensor) {
    case kQkvWeight:
      return {3 * c, c};
    case kQkvBias:
      return {3 * c};
    case kAttnProjWeight:
      return {c, c};
    case kFcWeight:
      return {4 * c, c};
    case kFcBias:
      return {4 * c};
    case kFcProjWeight:
      return {c, 4 * c};
    default:
      return {c};
  }
}

inline std::int64_t block_numel(std::int64_t channels) {
  return 12 * channels * channels + 13 * channels;
}

/// Where a block's activations sit in its scratch buffer (offsets in elements) for micro-batches
/// of `batch` sequences; the block's output is a buffer of its own, rows x channels.
struct BlockScratch {
  std::size_t ln1 = 0, ln1_stats = 0, qkv = 0, att = 0, attn_out = 0, residual = 0, ln2 = 0,
              ln2_stats = 0, fc = 0, gelu = 0, total = 0;

  BlockScratch(const GptShape& s, int batch) {
    const std::size_t rows = static_cast<std::size_t>(batch) * s.seq;
    const std::size_t c = static_cast<std::size_t>(s.channels);
    std::size_t at = 0;
    auto take = [&at](std::size_t elements) {
      const std::size_t offset = at;
      at += elements;
      return offset;
    };
    ln1 = take(rows * c);
    ln1_stats = take(rows * 2);
    qkv = take(rows * 3 * c);
    att = take(static_cast<std::size_t>(batch) * s.heads * s.seq * s.seq);
    attn_out = take(rows * c);
    residual = take(rows * c);
    ln2 = take(rows * c);
    ln2_stats = take(rows * 2);
    fc = take(rows * 4 * c);
    gelu = take(rows * 4 * c);
    total = at;
  }
};

/// Backward's working memory: `residual` carries d(loss)/d(residual stream) from block to block
/// (rows x channels); `narrow` is rows x channels, `wide` rows x 4 channels, `att` batch x heads x
/// seq x seq.
template <class T>
struct BackwardBuffers {
  T* residual = nullptr;
  T* narrow = nullptr;
  T* wide = nullptr;
  T* att = nullptr;
};

/// out = x + attn(ln_1(x)), then out += mlp(ln_2(out)); the intermediate activations go to
/// `scratch` (laid out as BlockScratch).
template <class Math, class T>
void block_forward(Math& math, const GptShape& s, int batch, const BlockTensors<const T*>& w,
                   const T* x, T* scratch, T* out) {
  const BlockScratch at(s, batch);
  const int rows = batch * s.seq;
  const int c = s.channels;
  const std::int64_t n = static_cast<std::int64_t>(rows) * c;
  math.layernorm_forward(x, w[kLn1Weight], w[kLn1Bias], scratch + at.ln1, scratch + at.ln1_stats,
                         rows, c);
  math.matmul_forward(scratch + at.ln1, w[kQkvWeight], w[kQkvBias], scratch + at.qkv, rows, c,
                      3 * c);
  math.attention_forward(scratch + at.qkv, scratch + at.att, scratch + at.attn_out, batch, s.seq, c,
                         s.heads);
  math.matmul_forward(scratch + at.attn_out, w[kAttnProjWeight], w[kAttnProjBias],
                      scratch + at.residual, rows, c, c);
  math.add_in_place(scratch + at.residual, x, n);
  math.layernorm_forward(scratch + at.residual, w[kLn2Weight], w[kLn2Bias], scratch + at.ln2,
                         scratch + at.ln2_stats, rows, c);
  math.matmul_forward(scratch + at.ln2, w[kFcWeight], w[kFcBias], scratch + at.fc, rows, c, 4 * c);
  math.gelu_forward(scratch + at.fc, scratch + at.gelu, 4 * n);
  math.matmul_forward(scratch + at.gelu, w[kFcProjWeight], w[kFcProjBias], out, rows, 4 * c, c);
  math.add_in_place(out, scratch + at.residual, n);
}

/// On entry buffers.residual holds d(loss)/d(out); on return d(loss)/d(x). Adds the block's
/// parameter gradients into `g`.
template <class Math, class T>
void block_backward(Math& math, const GptShape& s, int batch, const BlockTensors<const T*>& w,
                    const BlockTensors<T*>& g, const T* x, const T* scratch,
                    const BackwardBuffers<T>& buffers) {
  const BlockScratch at(s, batch);
  const int rows = batch * s.seq;
  const int c = s.channels;
  T* d = buffers.residual;
  math.matmul_backward(d, scratch + at.gelu, w[kFcProjWeight], buffers.wide, g[kFcProjWeight],
                       g[kFcProjBias], rows, 4 * c, c);
  math.gelu_backward(scratch + at.fc, buffers.wide, buffers.wide,
                     static_cast<std::int64_t>(rows) * 4 * c);
  math.matmul_backward(buffers.wide, scratch + at.ln2, w[kFcWeight], buffers.narrow, g[kFcWeight],
                       g[kFcBias], rows, c, 4 * c);
  // The residual connection passes d through; layer norm adds its input's gradient to it.
  math.layernorm_backward(buffers.narrow, scratch + at.residual, w[kLn2Weight],
                          scratch + at.ln2_stats, d, g[kLn2Weight], g[kLn2Bias], rows, c);
  math.matmul_backward(d, scratch + at.attn_out, w[kAttnProjWeight], buffers.narrow,
                       g[kAttnProjWeight], g[kAttnProjBias], rows, c, c);
  math.attention_backward(buffers.narrow, scratch + at.qkv, scratch + at.att, buffers.wide,
                          buffers.att, batch, s.seq, c, s.heads);
  math.matmul_backward(buffers.wide, scratch + at.ln1, w[kQkvWeight], buffers.narrow, g[kQkvWeight],
                       g[kQkvBias], rows, c, 3 * c);
  math.layernorm_backward(buffers.narrow, x, w[kLn1Weight], scratch + at.ln1_stats, d,
                          g[kLn1Weight], g[kLn1Bias], rows, c);
}

/// logits[rows, vocab] = ln_f(x) * wte^T: the output head shares the token embedding.
template <class Math, class T>
void head_forward(Math& math, const GptShape& s, int batch, const T* lnf_weight, const T* lnf_bias,
                  const T* wte, const T* x, T* lnf, T* lnf_stats, T* logits) {
  const int rows = batch * s.seq;
  math.layernorm_forward(x, lnf_weight, lnf_bias, lnf, lnf_stats, rows, s.channels);
  math.matmul_forward(lnf, wte, static_cast<const T*>(nullptr), logits, rows, s.channels, s.vocab);
}

/// From d(loss)/d(logits) (in `logits`): adds the head's share of wte's gradient and ln_f's
/// gradients, and leaves d(loss)/d(x) in buffers.residual.
template <class Math, class T>
void head_backward(Math& math, const GptShape& s, int batch, const T* lnf_weight, const T* wte,
                   const T* x, const T* lnf, const T* lnf_stats, const T* logits, T* dwte,
                   T* dlnf_weight, T* dlnf_bias, const BackwardBuffers<T>& buffers) {
  const int rows = batch * s.seq;
  math.matmul_backward(logits, lnf, wte, buffers.narrow, dwte, static_cast<T*>(nullptr), rows,
                       s.channels, s.vocab);
  math.zero(buffers.residual, static_cast<std::size_t>(rows) * s.channels * sizeof(T));
  math.layernorm_backward(buffers.narrow, x, lnf_weight, lnf_stats, buffers.residual, dlnf_weight,
                          dlnf_bias, rows, s.channels);
}

}  // namespace zeroshard::examples
