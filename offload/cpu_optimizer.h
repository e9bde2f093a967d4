// The CPU update rules' inner loops, compiled once per instruction set (scalar, AVX2, AVX-512)
// and chosen at run time from the CPU's flags, with OpenMP threads over tiles of large shards.
#pragma once

#include <cstdint>

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

/// The arrays of one shard slice: fp32 master, reduced gradient, the rule's state arrays.
struct RuleArrays {
  float* param;
  const float* grad;
  float* const* states;
};

enum class SgdKind { kPlain, kMomentum, kNesterov };

/// Each updates elements [0, n) of `arrays` in place on the given path; results are bit-identical
/// on every path (no contraction into FMA, IEEE division and square root everywhere).
void adam(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdamScalars& s, bool amsgrad);
void sgd(Isa isa, const RuleArrays& arrays, std::int64_t n, const SgdScalars& s, SgdKind kind);
void lion(Isa isa, const RuleArrays& arrays, std::int64_t n, const LionScalars& s);
void adagrad(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdagradScalars& s);

/// One instruction set's loops over [begin, end); internal to the dispatcher.
struct KernelTable {
  void (*adam)(const RuleArrays&, std::int64_t, std::int64_t, const AdamScalars&);
  void (*adam_amsgrad)(const RuleArrays&, std::int64_t, std::int64_t, const AdamScalars&);
  void (*sgd_plain)(const RuleArrays&, std::int64_t, std::int64_t, const SgdScalars&);
  void (*sgd_momentum)(const RuleArrays&, std::int64_t, std::int64_t, const SgdScalars&);
  void (*sgd_nesterov)(const RuleArrays&, std::int64_t, std::int64_t, const SgdScalars&);
  void (*lion)(const RuleArrays&, std::int64_t, std::int64_t, const LionScalars&);
  void (*adagrad)(const RuleArrays&, std::int64_t, std::int64_t, const AdagradScalars&);
};
extern const KernelTable kScalarKernels;
#if defined(ZEROSHARD_CPU_X86)
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;
#endif

}  // namespace zeroshard::detail::cpu_optimizer
