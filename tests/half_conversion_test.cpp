// Tests of the fp32 <-> fp16 / bf16 conversions: every 16-bit pattern, every rounding tie, the
// overflow and subnormal edges, and the SIMD bulk paths against the scalar code.
#include "precision/half_conversion.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zeroshard/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace zeroshard::detail {
namespace {

std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }
float float_from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

bool is_half_nan(std::uint16_t bits) { return (bits & 0x7C00u) == 0x7C00u && (bits & 0x3FFu); }
bool is_bfloat16_nan(std::uint16_t bits) {
  return (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0;
}
bool is_quiet_nan(float value) { return std::isnan(value) && (bits_of(value) & 0x00400000u); }

// The value of a non-NaN half, computed from its fields independently of half_to_float.
double half_value(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  if (exponent == 0x1F) return sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Checks round-to-nearest-even between two neighbouring finite values `lo` < `hi` of a 16-bit
// type: the exact midpoint goes to the one with the even pattern, the floats on either side of it
// to the nearer one.
template <typename ToBits>
void expect_ties_to_even(std::uint16_t lo_bits, std::uint16_t hi_bits, float lo, float hi,
                         ToBits to_bits) {
  // Both neighbours have at most 11 significant bits, so their midpoint is an exact float.
  const auto midpoint = static_cast<float>((static_cast<double>(lo) + hi) / 2);
  const std::uint16_t even = (lo_bits & 1u) == 0 ? lo_bits : hi_bits;
  EXPECT_EQ(to_bits(midpoint), even) << "midpoint " << midpoint << " of " << lo << " and " << hi;
  EXPECT_EQ(to_bits(std::nextafter(midpoint, lo)), lo_bits) << "just below " << midpoint;
  EXPECT_EQ(to_bits(std::nextafter(midpoint, hi)), hi_bits) << "just above " << midpoint;
}

TEST(HalfConversion, EveryHalfHasTheValueOfItsFields) {
  for (std::uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = half_to_float(half);
    if (is_half_nan(half)) {
      EXPECT_TRUE(is_quiet_nan(value)) << std::hex << bits;
      EXPECT_EQ(std::signbit(value), (bits & 0x8000u) != 0) << std::hex << bits;
    } else {
      EXPECT_EQ(static_cast<double>(value), half_value(half)) << std::hex << bits;
      EXPECT_EQ(std::signbit(value), (bits & 0x8000u) != 0) << std::hex << bits;
    }
  }
}

TEST(HalfConversion, EveryHalfRoundTripsThroughFloat) {
  for (std::uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const std::uint16_t back = float_to_half(half_to_float(half));
    if (is_half_nan(half)) {
      // A signalling NaN comes back quiet; sign and payload stay.
      EXPECT_EQ(back, half | 0x0200u) << std::hex << bits;
    } else {
      EXPECT_EQ(back, half) << std::hex << bits;
    }
  }
}

TEST(HalfConversion, TiesRoundToEvenBetweenEveryPairOfNeighbours) {
  // Neighbours among the non-negative finite halves, 0 .. 65504, and the same mirrored.
  for (std::uint16_t lo = 0; lo < 0x7BFFu; ++lo) {
    for (const std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000u}}) {
      const auto lo_bits = static_cast<std::uint16_t>(lo | sign);
      const auto hi_bits = static_cast<std::uint16_t>((lo + 1) | sign);
      expect_ties_to_even(lo_bits, hi_bits, half_to_float(lo_bits), half_to_float(hi_bits),
                          float_to_half);
    }
  }
}

TEST(HalfConversion, OverflowsToInfinityFromTheHalfwayPointAbove65504) {
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFFu);
  EXPECT_EQ(float_to_half(std::nextafter(65520.0f, 0.0f)), 0x7BFFu);
  // 65520 is a tie between 65504 (odd mantissa) and 65536 (even, but too large): inf.
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00u);
  EXPECT_EQ(float_to_half(-65520.0f), 0xFC00u);
  EXPECT_EQ(float_to_half(1e10f), 0x7C00u);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::max()), 0x7C00u);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00u);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xFC00u);
}

TEST(HalfConversion, KeepsSubnormalsAndFlushesOnlyBelowHalfTheSmallest) {
  const float smallest = std::ldexp(1.0f, -24);
  EXPECT_EQ(float_to_half(smallest), 0x0001u);
  EXPECT_EQ(half_to_float(0x0001u), smallest);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400u);     // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03FFu);  // largest subnormal
  // Half of the smallest subnormal ties to the even neighbour, zero; just above it rounds up.
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(float_to_half(-std::ldexp(1.0f, -25)), 0x8000u);
  // 1.5 units ties up to 2, 2.5 units ties down to 2.
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002u);
  EXPECT_EQ(float_to_half(std::ldexp(5.0f, -25)), 0x0002u);
  // Float subnormals are far below the half range: signed zero.
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::denorm_min()), 0x8000u);
}

TEST(HalfConversion, KeepsTheSignOfZero) {
  EXPECT_EQ(float_to_half(0.0f), 0x0000u);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000u)));
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(bfloat16_to_float(0x8000u)));
}

TEST(HalfConversion, TurnsEveryNanIntoAQuietNanWithItsSign) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  const float signalling = std::numeric_limits<float>::signaling_NaN();
  // A payload only in the low 13 bits would be lost in a plain truncation and read as inf.
  const float low_payload = float_from_bits(0x7F800001u);
  for (const float nan : {quiet, signalling, low_payload, -quiet, -low_payload}) {
    const std::uint16_t half = float_to_half(nan);
    EXPECT_TRUE(is_half_nan(half)) << std::hex << bits_of(nan);
    EXPECT_NE(half & 0x0200u, 0u) << "quiet bit, " << std::hex << bits_of(nan);
    EXPECT_EQ((half & 0x8000u) != 0, std::signbit(nan));
    const std::uint16_t bfloat = float_to_bfloat16(nan);
    EXPECT_TRUE(is_bfloat16_nan(bfloat)) << std::hex << bits_of(nan);
    EXPECT_NE(bfloat & 0x0040u, 0u) << "quiet bit, " << std::hex << bits_of(nan);
    EXPECT_EQ((bfloat & 0x8000u) != 0, std::signbit(nan));
  }
  EXPECT_TRUE(is_quiet_nan(half_to_float(0x7C01u)));
  EXPECT_TRUE(is_quiet_nan(bfloat16_to_float(0x7F81u)));
}

#ifdef __FLT16_MAX__
// The compiler's own _Float16 (libgcc's soft-float code when F16C is not enabled) is an
// independent reference for the scalar code across the whole float range.
TEST(HalfConversion, MatchesTheCompilersFloat16OnSampledFloats) {
  // A prime stride visits every exponent and many mantissa patterns, ties included.
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 251) {
    const float value = float_from_bits(static_cast<std::uint32_t>(bits));
    if (std::isnan(value)) continue;
    const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
    ASSERT_EQ(float_to_half(value), expected) << std::hex << bits;
  }
}
#endif

TEST(BFloat16Conversion, EveryBFloat16RoundTripsThroughFloat) {
  for (std::uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const auto bfloat = static_cast<std::uint16_t>(bits);
    const float value = bfloat16_to_float(bfloat);
    if (is_bfloat16_nan(bfloat)) {
      EXPECT_TRUE(is_quiet_nan(value)) << std::hex << bits;
      EXPECT_EQ(float_to_bfloat16(value), bfloat | 0x0040u) << std::hex << bits;
    } else {
      // Widening is exact: the bf16 is the top half of the float.
      EXPECT_EQ(bits_of(value), bits << 16) << std::hex << bits;
      EXPECT_EQ(float_to_bfloat16(value), bfloat) << std::hex << bits;
    }
  }
}

TEST(BFloat16Conversion, TiesRoundToEvenBetweenEveryPairOfNeighbours) {
  // Neighbours among the non-negative finite bf16 values, subnormals included, and mirrored.
  for (std::uint16_t lo = 0; lo < 0x7F7Fu; ++lo) {
    for (const std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000u}}) {
      const auto lo_bits = static_cast<std::uint16_t>(lo | sign);
      const auto hi_bits = static_cast<std::uint16_t>((lo + 1) | sign);
      expect_ties_to_even(lo_bits, hi_bits, bfloat16_to_float(lo_bits), bfloat16_to_float(hi_bits),
                          float_to_bfloat16);
    }
  }
}

TEST(BFloat16Conversion, OverflowsToInfinityFromTheHalfwayPointAboveTheLargest) {
  const float largest = bfloat16_to_float(0x7F7Fu);
  EXPECT_EQ(float_to_bfloat16(largest), 0x7F7Fu);
  // Halfway to 2^128 ties to the even pattern 0x7F80, which is inf.
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x7F7F8000u)), 0x7F80u);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::max()), 0xFF80u);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::infinity()), 0xFF80u);
}

TEST(BFloat16Conversion, RoundsFloatSubnormalsInsteadOfFlushingThem) {
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x00010000u)), 0x0001u);
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x00008000u)), 0x0000u);  // tie to even zero
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x00008001u)), 0x0001u);
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x00018000u)), 0x0002u);  // tie to even 2
  EXPECT_EQ(float_to_bfloat16(float_from_bits(0x807FFFFFu)), 0x8080u);  // up to the smallest normal
  EXPECT_EQ(bits_of(bfloat16_to_float(0x0001u)), 0x00010000u);
}

// Random floats for the bulk tests: half arbitrary bit patterns (NaN payloads, infinities,
// subnormals of both kinds), half values in the range where fp16 rounding matters.
std::vector<float> random_floats(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (i % 2 == 0) {
      values[i] = float_from_bits(static_cast<std::uint32_t>(rng()));
    } else {
      values[i] = std::ldexp(in_range(rng), exponent(rng) - 16);
    }
  }
  return values;
}

// Lengths around every vector width (8, 16, 32) and long enough for many full blocks.
constexpr std::int64_t kLengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1023, 4099};
constexpr std::uint16_t kGuard = 0xDEADu;

class BulkConversion : public testing::TestWithParam<DType> {};

TEST_P(BulkConversion, NarrowingMatchesTheScalarCodeOnEveryPath) {
  const DType dtype = GetParam();
  RecordProperty("isa", bulk_conversion_isa(dtype));
  const auto scalar = dtype == DType::kFloat16 ? float_to_half : float_to_bfloat16;
  std::uint32_t seed = 1;
  for (const std::int64_t length : kLengths) {
    const std::vector<float> in = random_floats(static_cast<std::size_t>(length), seed++);
    // One guard element past the end catches a vector store that runs over.
    std::vector<std::uint16_t> simd(in.size() + 1, kGuard);
    std::vector<std::uint16_t> portable(in.size() + 1, kGuard);
    convert_from_float(in.data(), simd.data(), dtype, length);
    convert_from_float_portable(in.data(), portable.data(), dtype, length);
    for (std::int64_t i = 0; i < length; ++i) {
      const std::uint16_t expected = scalar(in[i]);
      ASSERT_EQ(simd[i], expected)
          << bulk_conversion_isa(dtype) << ", length " << length << ", element " << i
          << ", input bits " << std::hex << bits_of(in[i]);
      ASSERT_EQ(portable[i], expected) << "length " << length << ", element " << i;
    }
    EXPECT_EQ(simd.back(), kGuard) << "length " << length;
    EXPECT_EQ(portable.back(), kGuard) << "length " << length;
  }
}

TEST_P(BulkConversion, NarrowingTakesTheFastPathWhenNoSubnormalIsInTheBlock) {
  // Random bit patterns put a float subnormal in most 32-element blocks; values of ordinary
  // magnitude put none, which is where the AVX512-BF16 instruction does the work.
  const DType dtype = GetParam();
  const auto scalar = dtype == DType::kFloat16 ? float_to_half : float_to_bfloat16;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> in(1000);
  for (float& value : in) value = normal(rng);
  // Exact ties between neighbouring bf16 values, and a subnormal in one block only.
  in[40] = float_from_bits(0x3F808000u);
  in[41] = float_from_bits(0x3F818000u);
  in[500] = float_from_bits(0x00018000u);
  std::vector<std::uint16_t> out(in.size());
  convert_from_float(in.data(), out.data(), dtype, static_cast<std::int64_t>(in.size()));
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], scalar(in[i])) << bulk_conversion_isa(dtype) << ", element " << i;
  }
}

TEST_P(BulkConversion, WideningMatchesTheScalarCodeForEveryPattern) {
  const DType dtype = GetParam();
  const auto scalar = dtype == DType::kFloat16 ? half_to_float : bfloat16_to_float;
  std::vector<std::uint16_t> every(0x10000);
  for (std::size_t i = 0; i < every.size(); ++i) every[i] = static_cast<std::uint16_t>(i);
  for (const std::int64_t length : {std::int64_t{0x10000}, std::int64_t{0xFFFF - 8}}) {
    std::vector<float> simd(static_cast<std::size_t>(length) + 1, -1.0f);
    std::vector<float> portable(static_cast<std::size_t>(length) + 1, -1.0f);
    convert_to_float(every.data(), dtype, simd.data(), length);
    convert_to_float_portable(every.data(), dtype, portable.data(), length);
    for (std::int64_t i = 0; i < length; ++i) {
      const std::uint32_t expected = bits_of(scalar(every[i]));
      ASSERT_EQ(bits_of(simd[i]), expected)
          << bulk_conversion_isa(dtype) << ", pattern " << std::hex << every[i];
      ASSERT_EQ(bits_of(portable[i]), expected) << "pattern " << std::hex << every[i];
    }
    EXPECT_EQ(simd.back(), -1.0f);
    EXPECT_EQ(portable.back(), -1.0f);
  }
}

TEST_P(BulkConversion, WideningHandlesEveryTailLength) {
  const DType dtype = GetParam();
  const auto scalar = dtype == DType::kFloat16 ? half_to_float : bfloat16_to_float;
  std::mt19937 rng(3);
  for (const std::int64_t length : kLengths) {
    std::vector<std::uint16_t> in(static_cast<std::size_t>(length));
    for (std::uint16_t& bits : in) bits = static_cast<std::uint16_t>(rng());
    std::vector<float> out(in.size() + 1, -1.0f);
    convert_to_float(in.data(), dtype, out.data(), length);
    for (std::int64_t i = 0; i < length; ++i) {
      ASSERT_EQ(bits_of(out[i]), bits_of(scalar(in[i]))) << "length " << length << ", " << i;
    }
    EXPECT_EQ(out.back(), -1.0f) << "length " << length;
  }
}

#if defined(__x86_64__) || defined(__i386__)
TEST_P(BulkConversion, IgnoresTheCallersFlushToZeroAndRoundingMode) {
  // A trainer built with -ffast-math runs with FTZ and DAZ set; some code changes the rounding
  // mode. The conversions must give the same bits anyway.
  const DType dtype = GetParam();
  const auto narrow = dtype == DType::kFloat16 ? float_to_half : float_to_bfloat16;
  const auto widen = dtype == DType::kFloat16 ? half_to_float : bfloat16_to_float;
  const std::vector<float> in = random_floats(4099, 5);
  std::vector<std::uint16_t> every(0x10000);
  for (std::size_t i = 0; i < every.size(); ++i) every[i] = static_cast<std::uint16_t>(i);
  std::vector<std::uint16_t> narrowed(in.size());
  std::vector<float> widened(every.size());
  constexpr unsigned kFlushToZero = 0x8000u;
  constexpr unsigned kDenormalsAreZero = 0x0040u;
  constexpr unsigned kRoundTowardZero = 0x6000u;
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | kFlushToZero | kDenormalsAreZero | kRoundTowardZero);
  convert_from_float(in.data(), narrowed.data(), dtype, static_cast<std::int64_t>(in.size()));
  convert_to_float(every.data(), dtype, widened.data(), static_cast<std::int64_t>(every.size()));
  _mm_setcsr(saved);
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(narrowed[i], narrow(in[i])) << "input bits " << std::hex << bits_of(in[i]);
  }
  for (std::size_t i = 0; i < every.size(); ++i) {
    ASSERT_EQ(bits_of(widened[i]), bits_of(widen(every[i]))) << "pattern " << std::hex << i;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(HalfAndBFloat16, BulkConversion,
                         testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return info.param == DType::kFloat16 ? "Fp16" : "Bf16";
                         });

TEST(BulkConversion, CopiesFloat32Unchanged) {
  const std::vector<float> in = random_floats(33, 11);
  std::vector<float> out(in.size());
  convert_from_float(in.data(), out.data(), DType::kFloat32, static_cast<std::int64_t>(in.size()));
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(bits_of(out[i]), bits_of(in[i]));
  std::vector<float> back(in.size());
  convert_to_float(out.data(), DType::kFloat32, back.data(), static_cast<std::int64_t>(in.size()));
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(bits_of(back[i]), bits_of(in[i]));
}

TEST(BulkConversion, WidensToFp64ExactlyAndNarrowsToTheNearestFloat) {
  const std::vector<float> in = random_floats(33, 12);
  std::vector<double> wide(in.size());
  convert_from_float(in.data(), wide.data(), DType::kFloat64, std::ssize(in));
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(wide[i], static_cast<double>(in[i]));
  // Halfway between two floats rounds to the even one; just above rounds up.
  const double one_ulp = std::ldexp(1.0, -23);
  const std::vector<double> narrow = {1.0 + one_ulp / 2, 1.0 + one_ulp / 2 + std::ldexp(1.0, -40),
                                      1.0 + 1.5 * one_ulp, 1e300};
  std::vector<float> out(narrow.size());
  convert_to_float(narrow.data(), DType::kFloat64, out.data(), std::ssize(narrow));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + std::ldexp(1.0f, -23));
  EXPECT_EQ(out[2], 1.0f + std::ldexp(1.0f, -22));
  EXPECT_EQ(out[3], std::numeric_limits<float>::infinity());
  // Between fp64 and a 16-bit type, through fp32.
  std::vector<std::uint16_t> bf16(narrow.size());
  convert(narrow.data(), DType::kFloat64, bf16.data(), DType::kBFloat16, std::ssize(narrow));
  EXPECT_EQ(bf16[0], float_to_bfloat16(1.0f));
  EXPECT_EQ(bf16[3], float_to_bfloat16(std::numeric_limits<float>::infinity()));
  EXPECT_EQ(size_of(DType::kFloat64), 8u);
  EXPECT_STREQ(to_string(DType::kFloat64), "fp64");
}

TEST(BulkConversion, WritesNothingForANonPositiveCount) {
  const float in[1] = {1.0f};
  std::uint16_t out[1] = {kGuard};
  convert_from_float(in, out, DType::kFloat16, 0);
  convert_from_float(in, out, DType::kBFloat16, -5);
  EXPECT_EQ(out[0], kGuard);
}

}  // namespace
}  // namespace zeroshard::detail
