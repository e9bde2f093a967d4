// The AVX2 path: the rules' loops eight lanes wide. CMakeLists.txt compiles this file alone with
// -mavx2 -mfma -mf16c; the dispatcher calls it only on a CPU that has all three.
#include <immintrin.h>

#include "kernels/cpu/cpu_optimizer.h"

#define ZEROSHARD_ISA_LOOP _Pragma("omp simd")
#define ZEROSHARD_ISA_TABLE kAvx2Kernels
#define ZEROSHARD_ISA_HALF_LANES 8

namespace zeroshard::detail::cpu_optimizer {
namespace {

using FloatLanes = float __attribute__((vector_size(32)));

inline FloatLanes square_root(FloatLanes value) {
  return reinterpret_cast<FloatLanes>(_mm256_sqrt_ps(reinterpret_cast<__m256>(value)));
}
inline FloatLanes load_half_lanes(const unsigned short* half) {
  return reinterpret_cast<FloatLanes>(
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half))));
}
// Rounding to nearest even whatever the MXCSR says, as half_conversion.cpp's F16C loop does.
inline void store_half_lanes(unsigned short* half, FloatLanes value) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(half),
                   _mm256_cvtps_ph(reinterpret_cast<__m256>(value), _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace

#include "kernels/cpu/cpu_rule_kernels.inc"
}  // namespace zeroshard::detail::cpu_optimizer
