// The AVX2 path: the rules' loops eight lanes wide. CMakeLists.txt compiles this file alone with
// -mavx2; the dispatcher calls it only on a CPU that has AVX2.
#include "cpu_optimizer.h"

#define ZEROSHARD_ISA_LOOP _Pragma("omp simd")
#define ZEROSHARD_ISA_TABLE kAvx2Kernels

namespace zeroshard::detail::cpu_optimizer {
#include "cpu_rule_kernels.inc"
}  // namespace zeroshard::detail::cpu_optimizer
