// fp32 <-> fp16 / bf16 conversions: exact scalar code, and bulk loops that pick F16C, AVX512-BF16
// or AVX2 at run time, so that the library still runs, with the same results, on CPUs without them.
#include "precision/half_conversion.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define ZEROSHARD_X86_SIMD 1
#endif

namespace zeroshard::detail {
namespace {

constexpr std::uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kFloatExponentMask = 0x7F800000u;  // also +inf
constexpr std::uint32_t kFloatQuietBit = 0x00400000u;
constexpr std::uint16_t kHalfInf = 0x7C00u;
// 65520 lies halfway between 65504, the largest half, and 65536; its tie goes to the even
// neighbour 65536, which does not fit, so everything from 65520 up becomes inf.
constexpr std::uint32_t kHalfOverflowThreshold = 0x477FF000u;  // 65520.0f
constexpr std::uint32_t kHalfMinNormal = 0x38800000u;          // 2^-14
constexpr std::uint32_t kHalfTieToZero = 0x33000000u;          // 2^-25

// The scalar conversions live here, inside the library, so that the loops below inline them
// instead of calling the exported functions through the PLT.
std::uint16_t to_half(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & kFloatAbsMask;
  if (abs > kFloatExponentMask) {
    // A quiet NaN with the top ten payload bits, as VCVTPS2PH makes it.
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= kHalfOverflowThreshold) return static_cast<std::uint16_t>(sign | kHalfInf);
  if (abs >= kHalfMinNormal) {
    // Rebias the exponent from 127 to 15 and round the 13 dropped bits to nearest even; a carry
    // out of the mantissa moves the result up a binade, as it should.
    std::uint32_t rebiased = abs - ((127u - 15u) << 23);
    rebiased += 0xFFFu + ((rebiased >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (rebiased >> 13));
  }
  // At most half the smallest subnormal (2^-24): the tie at 2^-25 goes to the even value, zero.
  if (abs <= kHalfTieToZero) return sign;
  // A subnormal half counts units of 2^-24; the float is mantissa * 2^(exponent - 150).
  const std::uint32_t exponent = abs >> 23;  // 102..112 here
  const std::uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - exponent;  // 14..24
  std::uint32_t result = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (result & 1u) != 0)) ++result;
  return static_cast<std::uint16_t>(sign | result);
}

float from_half(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  std::uint32_t result = sign;
  if (exponent == 0x1Fu) {
    result |= kFloatExponentMask | (mantissa << 13) | (mantissa != 0 ? kFloatQuietBit : 0u);
  } else if (exponent != 0) {
    result |= ((exponent + 127u - 15u) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {
    // Every subnormal half is a normal float: move the leading 1 up to the implicit bit 10.
    const auto shift = static_cast<std::uint32_t>(std::countl_zero(mantissa) - 21);
    result |= ((127u - 15u + 1u - shift) << 23) | (((mantissa << shift) & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(result);
}

std::uint16_t to_bfloat16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & kFloatAbsMask) > kFloatExponentMask) {
    // Truncate and set the quiet bit, as VCVTNEPS2BF16 does, so a NaN never becomes inf.
    return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  }
  // Adding 0x7FFF plus the lowest kept bit rounds the dropped 16 bits to nearest even; a carry
  // into the exponent rounds up a binade, or to inf above the largest bf16.
  return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

float from_bfloat16(std::uint16_t bits) {
  std::uint32_t result = static_cast<std::uint32_t>(bits) << 16;
  if ((result & kFloatAbsMask) > kFloatExponentMask) result |= kFloatQuietBit;
  return std::bit_cast<float>(result);
}

using NarrowFn = void (*)(const float*, std::uint16_t*, std::int64_t);
using WidenFn = void (*)(const std::uint16_t*, float*, std::int64_t);

void float_to_half_loop(const float* in, std::uint16_t* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) out[i] = to_half(in[i]);
}
void half_to_float_loop(const std::uint16_t* in, float* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) out[i] = from_half(in[i]);
}
void float_to_bfloat16_loop(const float* in, std::uint16_t* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) out[i] = to_bfloat16(in[i]);
}
void bfloat16_to_float_loop(const std::uint16_t* in, float* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) out[i] = from_bfloat16(in[i]);
}

#ifdef ZEROSHARD_X86_SIMD

__attribute__((target("avx,f16c"))) void float_to_half_f16c(const float* in, std::uint16_t* out,
                                                            std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // An explicit rounding mode, so that a caller's MXCSR rounding setting cannot change results.
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
  }
  float_to_half_loop(in + i, out + i, count - i);
}

__attribute__((target("avx,f16c"))) void half_to_float_f16c(const std::uint16_t* in, float* out,
                                                            std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  half_to_float_loop(in + i, out + i, count - i);
}

// Eight floats to bf16 in the low halves of eight 32-bit lanes, the same integer steps as
// to_bfloat16.
__attribute__((target("avx2"))) __m256i round_to_bfloat16_avx2(__m256i bits) {
  const __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(kFloatAbsMask));
  // A signed compare is right here: both sides are non-negative as int32.
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(kFloatExponentMask));
  const __m256i kept_lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(kept_lsb, _mm256_set1_epi32(0x7FFF));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

__attribute__((target("avx2"))) void float_to_bfloat16_avx2(const float* in, std::uint16_t* out,
                                                            std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i lo =
        round_to_bfloat16_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m256i hi =
        round_to_bfloat16_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)));
    // packus packs within 128-bit halves (lo0-3 hi0-3 lo4-7 hi4-7); the permute restores order.
    // Its unsigned saturation never triggers: every lane is below 0x10000.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  float_to_bfloat16_loop(in + i, out + i, count - i);
}

__attribute__((target("avx2"))) void bfloat16_to_float_avx2(const std::uint16_t* in, float* out,
                                                            std::int64_t count) {
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i narrow = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(narrow), 16);
    const __m256i abs = _mm256_and_si256(wide, _mm256_set1_epi32(kFloatAbsMask));
    const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(kFloatExponentMask));
    const __m256i quiet_bit = _mm256_and_si256(is_nan, _mm256_set1_epi32(kFloatQuietBit));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_or_si256(wide, quiet_bit));
  }
  bfloat16_to_float_loop(in + i, out + i, count - i);
}

__attribute__((target("avx2,avx512f,avx512bf16"))) void float_to_bfloat16_avx512bf16(
    const float* in, std::uint16_t* out, std::int64_t count) {
  const __m512i abs_mask = _mm512_set1_epi32(kFloatAbsMask);
  const __m512i exponent_mask = _mm512_set1_epi32(kFloatExponentMask);
  std::int64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m512i lo = _mm512_loadu_si512(in + i);
    const __m512i hi = _mm512_loadu_si512(in + i + 16);
    // VCVTNE2PS2BF16 flushes subnormal inputs to zero, unlike the scalar and AVX2 code. The rare
    // block that holds one goes through the AVX2 code, so that every CPU gives the same bits.
    const __mmask16 subnormal_lo =
        _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(lo, abs_mask), lo, exponent_mask);
    const __mmask16 subnormal_hi =
        _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(hi, abs_mask), hi, exponent_mask);
    if ((subnormal_lo | subnormal_hi) != 0) {
      float_to_bfloat16_avx2(in + i, out + i, 32);
      continue;
    }
    // The second operand fills the low 16 elements of the result.
    const __m512bh packed = _mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi), _mm512_castsi512_ps(lo));
    // No intrinsic casts __m512bh to an integer vector in every GCC; memcpy is one store.
    std::memcpy(out + i, &packed, sizeof(packed));
  }
  float_to_bfloat16_avx2(in + i, out + i, count - i);
}

#endif  // ZEROSHARD_X86_SIMD

struct Kernels {
  NarrowFn float_to_half = float_to_half_loop;
  WidenFn half_to_float = half_to_float_loop;
  NarrowFn float_to_bfloat16 = float_to_bfloat16_loop;
  WidenFn bfloat16_to_float = bfloat16_to_float_loop;
  const char* half_isa = "portable";
  const char* bfloat16_isa = "portable";
};

Kernels pick_kernels() noexcept {
  Kernels kernels;
#ifdef ZEROSHARD_X86_SIMD
  // __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 registers.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx") && cpu_has_f16c()) {
    kernels.float_to_half = float_to_half_f16c;
    kernels.half_to_float = half_to_float_f16c;
    kernels.half_isa = "f16c";
  }
  if (__builtin_cpu_supports("avx2")) {
    kernels.float_to_bfloat16 = float_to_bfloat16_avx2;
    kernels.bfloat16_to_float = bfloat16_to_float_avx2;
    kernels.bfloat16_isa = "avx2";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) {
      kernels.float_to_bfloat16 = float_to_bfloat16_avx512bf16;
      kernels.bfloat16_isa = "avx512bf16";
    }
  }
#endif
  return kernels;
}

const Kernels& kernels() noexcept {
  static const Kernels chosen = pick_kernels();
  return chosen;
}

void convert_from_float_with(const Kernels& with, const float* in, void* out, DType to_dtype,
                             std::int64_t count) noexcept {
  if (count <= 0) return;
  auto* out16 = static_cast<std::uint16_t*>(out);
  switch (to_dtype) {
    case DType::kFloat32:
      std::memmove(out, in, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16:
      with.float_to_half(in, out16, count);
      return;
    case DType::kBFloat16:
      with.float_to_bfloat16(in, out16, count);
      return;
    case DType::kFloat64: {
      auto* out64 = static_cast<double*>(out);
      for (std::int64_t i = 0; i < count; ++i) out64[i] = in[i];
      return;
    }
  }
}

void convert_to_float_with(const Kernels& with, const void* in, DType from_dtype, float* out,
                           std::int64_t count) noexcept {
  if (count <= 0) return;
  const auto* in16 = static_cast<const std::uint16_t*>(in);
  switch (from_dtype) {
    case DType::kFloat32:
      std::memmove(out, in, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case DType::kFloat16:
      with.half_to_float(in16, out, count);
      return;
    case DType::kBFloat16:
      with.bfloat16_to_float(in16, out, count);
      return;
    case DType::kFloat64: {
      // A plain conversion: rounds to nearest even unless the program changed the rounding mode
      // (the 16-bit paths ignore that mode; fp64 is not a model precision, so none depends on it).
      const auto* in64 = static_cast<const double*>(in);
      for (std::int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(in64[i]);
      return;
    }
  }
}

}  // namespace

bool cpu_has_f16c() noexcept {
#ifdef ZEROSHARD_X86_SIMD
  // Clang before 16 does not know "f16c" in __builtin_cpu_supports; CPUID leaf 1 says it for
  // every compiler. Callers check "avx" as well, which includes the OS saving the YMM registers.
  unsigned eax = 0;
  unsigned ebx = 0;
  unsigned ecx = 0;
  unsigned edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

std::uint16_t float_to_half(float value) noexcept { return to_half(value); }
float half_to_float(std::uint16_t bits) noexcept { return from_half(bits); }
std::uint16_t float_to_bfloat16(float value) noexcept { return to_bfloat16(value); }
float bfloat16_to_float(std::uint16_t bits) noexcept { return from_bfloat16(bits); }

void convert_from_float(const float* in, void* out, DType to_dtype, std::int64_t count) noexcept {
  convert_from_float_with(kernels(), in, out, to_dtype, count);
}

void convert_to_float(const void* in, DType from_dtype, float* out, std::int64_t count) noexcept {
  convert_to_float_with(kernels(), in, from_dtype, out, count);
}

void convert_from_float_portable(const float* in, void* out, DType to_dtype,
                                 std::int64_t count) noexcept {
  convert_from_float_with(Kernels{}, in, out, to_dtype, count);
}

void convert_to_float_portable(const void* in, DType from_dtype, float* out,
                               std::int64_t count) noexcept {
  convert_to_float_with(Kernels{}, in, from_dtype, out, count);
}

const char* bulk_conversion_isa(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16:
      return kernels().half_isa;
    case DType::kBFloat16:
      return kernels().bfloat16_isa;
    case DType::kFloat32:
    case DType::kFloat64:
      break;
  }
  return "portable";
}

}  // namespace zeroshard::detail
