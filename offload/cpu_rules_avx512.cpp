// The AVX-512 path: the rules' loops sixteen lanes wide. CMakeLists.txt compiles this file alone
// with -mavx512f -mavx512bw; the dispatcher calls it only on a CPU that has both.
#include "cpu_optimizer.h"

#define ZEROSHARD_ISA_LOOP _Pragma("omp simd")
#define ZEROSHARD_ISA_TABLE kAvx512Kernels

namespace zeroshard::detail::cpu_optimizer {
#include "cpu_rule_kernels.inc"
}  // namespace zeroshard::detail::cpu_optimizer
