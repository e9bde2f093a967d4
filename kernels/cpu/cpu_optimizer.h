// The CPU update rules' inner loops, compiled once per instruction set (scalar, AVX2, AVX-512)
// and chosen at run time from the CPU's flags, with OpenMP threads over tiles of large shards; one
// pass reads the gradient as stored (fp32, fp16 or bf16) and writes the model's copy of the
// weights. The scan of the gradient for its norm, which the update waits for, runs on the same
// paths.
#pragma once

#include <cstdint>
#include <span>

#include "zeroshard/dtype.h"

namespace zeroshard::detail::cpu_optimizer {

/// Instruction sets with a compiled path; kScalar is the element-by-element reference.
enum class Isa { kScalar, kAvx2, kAvx512 };

/// "scalar", "avx2" or "avx512".
const char* to_string(Isa isa) noexcept;
/// Whether this CPU can run `isa` (and the library was built with its path).
bool supported(Isa isa) noexcept;
/// The path the rules use: ZEROSHARD_CPU_ISA (avx512, avx2 or scalar) when set, otherwise the
/// widest path this CPU supports. Throws UsageError for an unknown or unsupported override.
Isa active_isa();

// Per-call scalars, computed once on the host so that no loop divides more than once per element.
struct AdamScalars {
  float weight_factor;  ///< p *= weight_factor first (AdamW's decoupled decay; 1 for Adam)
  float l2;             ///< g += l2 * p (Adam's L2 decay; 0 for AdamW)
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float step_size;                  ///< lr / (1 - beta1^t)
  float inv_bias_correction2_sqrt;  ///< 1 / sqrt(1 - beta2^t)
  float eps;
};
struct SgdScalars {
  float neg_lr;
  float weight_decay;
  float keep;  ///< buf = keep * buf + take * g (keep 0, take 1 on the first step)
  float take;
  float momentum;  ///< Nesterov's look-ahead factor
};
struct LionScalars {
  float weight_factor;
  float lr;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
};
struct AdagradScalars {
  float neg_clr;  ///< -lr / (1 + (step - 1) * lr_decay)
  float weight_decay;
  float sum_start;  ///< added to the zeroed sum on step 1 only
  float eps;
};

/// The arrays of one shard slice: the fp32 master weights and the rule's fp32 state arrays,
/// updated in place, and the gradient as stored. The rule sees float(grad[i]) * grad_factor,
/// rounded to fp32 once (a factor of exactly 1 changes nothing). When param_copy is set it
/// receives each updated master weight rounded to nearest even in param_copy_dtype, as
/// convert_from_float writes it. The result equals, bit for bit, widening the gradient, scaling
/// it, the update, and converting the weights, as separate passes; but memory is streamed once.
/// grad and param_copy may not overlap the master or the states; 16-bit arrays are 2-byte aligned.
struct RuleArrays {
  float* param;
  const void* grad;
  float* const* states;
  DType grad_dtype = DType::kFloat32;
  float grad_factor = 1.0f;
  void* param_copy = nullptr;
  DType param_copy_dtype = DType::kFloat32;
  /// When set, `grad` itself, writable: each chunk of the gradient is zeroed once the rule has
  /// read it, while it is still in cache, instead of in a pass of its own after the update.
  void* grad_to_clear = nullptr;
};

/// The gradient norm's sums of squares are kept in this many double lanes: one chain of
/// dependent additions would bound the scan by the adder's latency instead of memory.
inline constexpr int kSquareLanes = 16;

/// Adds the square of each of values[0, n) (widened to double) into lanes[i mod kSquareLanes],
/// each lane in element order; n is a multiple of kSquareLanes but in a scan's last call. The
/// lanes are bit-identical on every path, so a norm summed lane by lane afterwards does not
/// depend on the path, the stage or how the shard was split into calls at multiples of 16.
void add_square_sums(Isa isa, const float* values, std::int64_t n, double* lanes);

/// The elements of one tile of a gradient norm's sum of squares (SquareSums).
inline constexpr std::int64_t kSquareTile = std::int64_t{1} << 16;
/// Bytes of the square sums kept for `elements` values' whole tiles, as their gradients land: a
/// double and a flag each.
inline constexpr std::int64_t tile_sums_bytes(std::int64_t elements) {
  return elements / kSquareTile * static_cast<std::int64_t>(sizeof(double) + sizeof(std::uint8_t));
}

/// A gradient norm's sum of squares over ranges added one after another as if they were one:
/// each tile of kSquareTile elements, counted from the first range's start, summed in its own lanes
/// (added in lane order), the tiles' sums added in tile order. So a shard whose parts lie in
/// different memories sums, bit for bit, as one range would, when every range but the last is a
/// multiple of 16 elements long.
struct SquareSums {
  double tiles = 0.0;               ///< the finished tiles' sums
  double lanes[kSquareLanes] = {};  ///< the tile in progress
  std::int64_t in_tile = 0;         ///< elements the tile in progress holds
  double total() const;
  /// Adds the sums of whole tiles (tile_square_sums()) that follow the finished ones, as
  /// add_sum_of_squares() would add them; no tile may be in progress.
  void add_tiles(std::span<const double> tile_sums);
};

/// Adds the squares of values[0, n), stored as `dtype` and widened to double, to `sums`. Large
/// ranges spread their whole tiles over the OpenMP team as the rules do; the bits depend only on
/// the values and the ranges' lengths, never on the path or the thread count. The total is
/// non-finite exactly when some value is: no sum of finite squares reaches inf in double.
void add_sum_of_squares(Isa isa, const void* values, DType dtype, std::int64_t n, SquareSums& sums);
/// add_sum_of_squares() of one range into empty sums: their total.
double sum_of_squares(Isa isa, const void* values, DType dtype, std::int64_t n);
/// The sum of each of `tiles` whole tiles of values (tiles x kSquareTile elements) into
/// sums[0, tiles), bit for bit as add_sum_of_squares() finds it for a tile; over the team.
void tile_square_sums(Isa isa, const void* values, DType dtype, std::int64_t tiles, double* sums);

enum class SgdKind { kPlain, kMomentum, kNesterov };

/// Each updates elements [0, n) of `arrays` on the given path; results are bit-identical on every
/// path (no contraction into FMA, IEEE division and square root everywhere).
void adam(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdamScalars& s, bool amsgrad);
void sgd(Isa isa, const RuleArrays& arrays, std::int64_t n, const SgdScalars& s, SgdKind kind);
void lion(Isa isa, const RuleArrays& arrays, std::int64_t n, const LionScalars& s);
void adagrad(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdagradScalars& s);

/// One chunk of a slice as an instruction set's loops see it: every pointer at the chunk's first
/// element, the gradient already fp32 (widened into a buffer when stored in 16 bits).
struct ChunkArrays {
  float* param;
  const float* grad;
  float* states[3];
  float grad_factor;
};

/// Adam's arrays for a loop that widens a 16-bit gradient, writes the 16-bit copy of the weights
/// and clears the gradient as it goes, element by element, rather than chunk by chunk beside the
/// rule: the phases of the chunked form leave most of the streams idle at a time.
struct StreamedChunk {
  float* param;
  const void* grad;  ///< in grad_dtype
  float* states[3];
  float grad_factor;
  std::uint16_t* copy;  ///< nullptr: no copy
  /// fp32 or bf16, and fp16 where KernelTable::adam_streams_fp16.
  DType grad_dtype;
  /// bf16, or fp16 where KernelTable::adam_streams_fp16; a 16-bit gradient's copy is of its type.
  DType copy_dtype;
  bool clear_grad;  ///< grad is writable and zeroed once read
};

/// One instruction set's loops over the `n` elements of a chunk; internal to the dispatcher.
struct KernelTable {
  void (*adam)(const ChunkArrays&, std::int64_t, const AdamScalars&);
  void (*adam_amsgrad)(const ChunkArrays&, std::int64_t, const AdamScalars&);
  void (*adam_streamed)(const StreamedChunk&, std::int64_t, const AdamScalars&, bool amsgrad);
  /// adam_streamed takes fp16 gradients and copies (with F16C's conversions).
  bool adam_streams_fp16;
  void (*sgd_plain)(const ChunkArrays&, std::int64_t, const SgdScalars&);
  void (*sgd_momentum)(const ChunkArrays&, std::int64_t, const SgdScalars&);
  void (*sgd_nesterov)(const ChunkArrays&, std::int64_t, const SgdScalars&);
  void (*lion)(const ChunkArrays&, std::int64_t, const LionScalars&);
  void (*adagrad)(const ChunkArrays&, std::int64_t, const AdagradScalars&);
  void (*square_sums)(const float*, std::int64_t, double*);
  /// The same of bf16 or fp16 values, widened in the loop; nullptr: widened in chunks first.
  void (*square_sums_bf16)(const void*, std::int64_t, double*);
  void (*square_sums_fp16)(const void*, std::int64_t, double*);
};
extern const KernelTable kScalarKernels;
#if defined(ZEROSHARD_CPU_X86)
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;
#endif

}  // namespace zeroshard::detail::cpu_optimizer
