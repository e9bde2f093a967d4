// The block-quantized wire format of ZeRO++ (qwZ, qgZ): its byte layout and the per-block
// arithmetic, written once for the CPU encoder and the CUDA kernels so that both give the same
// bits.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ZEROSHARD_HOST_DEVICE __host__ __device__
#else
#define ZEROSHARD_HOST_DEVICE
#endif

namespace zeroshard::detail {

/// Bits per quantized element: int8 for parameter all-gathers, int4 for gradient reductions.
enum class QuantBits { kInt4 = 4, kInt8 = 8 };

/// Elements per block. 256 keeps the scale's share small enough for the byte targets of issue #29
/// (int8: 260/1024 = 0.254x fp32 and 0.508x bf16, under 0.27x and 0.53x; int4: 132/1024 = 0.129x
/// fp32, under 0.15x; 128 would still fit at 0.258x, 0.516x and 0.133x, 64 misses 0.53x) while an
/// outlier coarsens only 255 neighbours. It is also 32 lanes x 8 elements: one warp per block.
inline constexpr std::int64_t kQuantBlockElements = 256;

/// Largest code magnitude: codes are symmetric, so -128 (int8) and -8 (int4) are never used.
ZEROSHARD_HOST_DEVICE constexpr int quant_max(QuantBits bits) {
  return bits == QuantBits::kInt8 ? 127 : 7;
}

/// Blocks of a tensor of `count` elements; the last one is short when B does not divide count.
ZEROSHARD_HOST_DEVICE constexpr std::int64_t quant_block_count(std::int64_t count) {
  return (count + kQuantBlockElements - 1) / kQuantBlockElements;
}

/// Bytes of the code area: one byte per element (int8) or two elements per byte (int4, element
/// 2j in the low nibble); B is even, so every block's codes start on a byte.
ZEROSHARD_HOST_DEVICE constexpr std::int64_t quant_code_bytes(std::int64_t count, QuantBits bits) {
  return bits == QuantBits::kInt8 ? count : (count + 1) / 2;
}

/// Byte offset of the code area: the fp32 scales of all blocks come first, so that both areas
/// are 4-byte aligned in a 4-byte aligned buffer.
ZEROSHARD_HOST_DEVICE constexpr std::int64_t quant_codes_offset(std::int64_t count) {
  return quant_block_count(count) * static_cast<std::int64_t>(sizeof(float));
}

/// Bytes of an encoded tensor of `count` elements, scales included.
ZEROSHARD_HOST_DEVICE constexpr std::int64_t quantized_bytes(std::int64_t count, QuantBits bits) {
  return quant_codes_offset(count) + quant_code_bytes(count, bits);
}

/// quantized_bytes in whole 4-byte units, the padding after the codes included: what an encoding
/// takes where encodings lie side by side, each with its scales 4-byte aligned, and what it takes
/// on the wire, where the communicators, which have no byte type, move it as fp32 elements.
ZEROSHARD_HOST_DEVICE constexpr std::int64_t quantized_units(std::int64_t count, QuantBits bits) {
  return (quantized_bytes(count, bits) + 3) / 4;
}

namespace quant {

ZEROSHARD_HOST_DEVICE inline std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}

ZEROSHARD_HOST_DEVICE inline float bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

inline constexpr std::uint32_t kExponentBits = 0x7f800000u;

/// |x| as bits. For finite x their unsigned order is the order of |x|, and inf and NaN sort above
/// every finite value, so one max over a block gives both max|x| and whether it is finite; a
/// float max would drop a NaN.
ZEROSHARD_HOST_DEVICE inline std::uint32_t magnitude_bits(float x) {
  return float_bits(x) & 0x7fffffffu;
}

/// The block's scale from the max of its magnitude_bits: max|x| / qmax, nudged by one ulp where
/// that rounding would break the error bound. 0 for an all-zero block and for a block holding inf
/// or NaN (the caller counts those), so a scale is always finite and decodes to finite values.
ZEROSHARD_HOST_DEVICE inline float block_scale(std::uint32_t max_magnitude_bits, QuantBits bits) {
  if (max_magnitude_bits == 0 || max_magnitude_bits >= kExponentBits) return 0.0f;
  const float max_magnitude = bits_float(max_magnitude_bits);
  const auto q = static_cast<float>(quant_max(bits));
  float scale = max_magnitude / q;
  // Rounded down (or to zero, for max|x| below qmax * 2^-150), x / scale could reach far past
  // qmax among subnormals, where a scale ulp is a large relative step; one ulp up restores
  // qmax * scale >= max|x|, exactly so among subnormals (products of multiples of 2^-149).
  if (scale * q < max_magnitude) scale = bits_float(float_bits(scale) + 1);
  // Rounded up near FLT_MAX, qmax * scale would decode to inf; one ulp down keeps it finite, and
  // the clamp in quantize_value absorbs the ulp.
  if (float_bits(scale * q) >= kExponentBits) scale = bits_float(float_bits(scale) - 1);
  return scale;
}

/// The code of `x` in a block of scale `scale`: round-to-nearest-even of x / scale, clamped to
/// [-qmax, qmax]. A division rather than a product with qmax / max|x|, whose reciprocal overflows
/// for max|x| < qmax / FLT_MAX and adds a second rounding.
ZEROSHARD_HOST_DEVICE inline int quantize_value(float x, float scale, QuantBits bits) {
  if (scale == 0.0f) return 0;
#if defined(__CUDA_ARCH__)
  const float rounded = rintf(__fdiv_rn(x, scale));
#else
  const float rounded = std::nearbyint(x / scale);
#endif
  const auto q = static_cast<float>(quant_max(bits));
  return static_cast<int>(rounded > q ? q : rounded < -q ? -q : rounded);
}

/// The value a code stands for: one fp32 product, exact among subnormals, never inf.
ZEROSHARD_HOST_DEVICE inline float dequantize_value(int code, float scale) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(static_cast<float>(code), scale);
#else
  return static_cast<float>(code) * scale;
#endif
}

/// Two int4 codes in one byte, `low` in bits 0-3, two's complement.
ZEROSHARD_HOST_DEVICE inline std::uint8_t pack_int4(int low, int high) {
  return static_cast<std::uint8_t>((low & 0xf) | ((high & 0xf) << 4));
}

/// The int4 code in bits 0-3 of `nibble`, sign-extended.
ZEROSHARD_HOST_DEVICE inline int unpack_int4(unsigned nibble) {
  return static_cast<int>((nibble & 0xfu) ^ 0x8u) - 8;
}

}  // namespace quant
}  // namespace zeroshard::detail
