// The AVX-512 path: the rules' loops sixteen lanes wide. CMakeLists.txt compiles this file alone
// with -mavx512f -mavx512bw -mf16c; the dispatcher calls it only on a CPU that has all three.
#include <immintrin.h>

#include "kernels/cpu/cpu_optimizer.h"

#define ZEROSHARD_ISA_LOOP _Pragma("omp simd")
#define ZEROSHARD_ISA_TABLE kAvx512Kernels
#define ZEROSHARD_ISA_HALF_LANES 16

namespace zeroshard::detail::cpu_optimizer {
namespace {

using FloatLanes = float __attribute__((vector_size(64)));

// The masked forms with every lane set: the plain ones pass GCC 12 an undefined register, which
// -Wmaybe-uninitialized reports.
constexpr __mmask16 kAllLanes = 0xFFFF;

inline FloatLanes square_root(FloatLanes value) {
  const auto lanes = reinterpret_cast<__m512>(value);
  return reinterpret_cast<FloatLanes>(_mm512_mask_sqrt_ps(lanes, kAllLanes, lanes));
}
inline FloatLanes load_half_lanes(const unsigned short* half) {
  return reinterpret_cast<FloatLanes>(_mm512_mask_cvtph_ps(
      _mm512_setzero_ps(), kAllLanes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half))));
}
// Rounding to nearest even whatever the MXCSR says, as half_conversion.cpp's F16C loop does.
inline void store_half_lanes(unsigned short* half, FloatLanes value) {
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(half),
      _mm512_mask_cvtps_ph(_mm256_setzero_si256(), kAllLanes, reinterpret_cast<__m512>(value),
                           _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace

#include "kernels/cpu/cpu_rule_kernels.inc"
}  // namespace zeroshard::detail::cpu_optimizer
