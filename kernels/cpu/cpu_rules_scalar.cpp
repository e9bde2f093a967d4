// The scalar path: the rules' loops one element at a time, the reference every other path equals.
// CMakeLists.txt compiles this file without vectorisation.
#include "kernels/cpu/cpu_optimizer.h"

#define ZEROSHARD_ISA_LOOP
#define ZEROSHARD_ISA_TABLE kScalarKernels

namespace zeroshard::detail::cpu_optimizer {
#include "kernels/cpu/cpu_rule_kernels.inc"
}  // namespace zeroshard::detail::cpu_optimizer
