// Marks the element-wise update loops for vectorisation. Without OpenMP the pragma would be an
// unknown-pragma warning, so it expands to nothing and the loops rely on auto-vectorisation.
#pragma once

#if defined(_OPENMP)
#define ZEROSHARD_SIMD_LOOP _Pragma("omp simd")
#else
#define ZEROSHARD_SIMD_LOOP
#endif
