// Block quantization of ZeRO++ on the CPU, one block at a time through an fp32 copy of it.
#include "kernels/cpu/block_quantizer.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "precision/half_conversion.h"
#include "util/check.h"

namespace zeroshard::detail {
namespace {

using Block = std::array<float, kQuantBlockElements>;

void check_arguments(const char* what, DType dtype, std::int64_t count, const void* in,
                     const void* out) {
  ZEROSHARD_CHECK_USAGE(count >= 0, what << ": negative element count " << count);
  ZEROSHARD_CHECK_USAGE(dtype != DType::kFloat64,
                        what << ": got fp64 data, expected fp32, fp16 or bf16");
  ZEROSHARD_CHECK_USAGE(count == 0 || (in != nullptr && out != nullptr),
                        what << ": null buffer for " << count << " elements");
}

// Round to nearest even of |v| <= 2^22 without a library call, so that the loops below
// vectorize: adding 1.5 * 2^23 leaves no fraction bits, and the addition rounds as nearbyint does
// in the default mode. A block's x / scale is at most qmax (block_scale), far inside the domain.
inline float round_small_to_even(float v) {
  constexpr float kNoFraction = 12582912.0f;  // 1.5 * 2^23
  return (v + kNoFraction) - kNoFraction;
}

// quant::quantize_value for a whole block, as a loop without branches or calls, for scale > 0 (a
// block of scale 0, all zeros or holding inf or NaN, has all-zero codes).
void encode_block(const float* values, std::int64_t length, float scale, QuantBits bits,
                  std::int8_t* codes) {
  const auto q = static_cast<float>(quant_max(bits));
#pragma omp simd
  for (std::int64_t i = 0; i < length; ++i) {
    float rounded = round_small_to_even(values[i] / scale);
    rounded = rounded > q ? q : rounded;
    rounded = rounded < -q ? -q : rounded;
    codes[i] = static_cast<std::int8_t>(static_cast<int>(rounded));
  }
}

std::uint32_t block_max_magnitude(const float* values, std::int64_t length) {
  std::uint32_t largest = 0;
#pragma omp simd reduction(max : largest)
  for (std::int64_t i = 0; i < length; ++i) {
    largest = std::max(largest, quant::magnitude_bits(values[i]));
  }
  return largest;
}

}  // namespace

std::int64_t quantize_blocks(const void* in, DType dtype, std::int64_t count, QuantBits bits,
                             void* out) {
  check_arguments("quantize_blocks", dtype, count, in, out);
  const auto* source = static_cast<const std::byte*>(in);
  auto* scales = static_cast<std::byte*>(out);
  auto* codes = scales + quant_codes_offset(count);
  const auto element_bytes = static_cast<std::int64_t>(size_of(dtype));
  std::int64_t nonfinite_blocks = 0;
  Block values;
  std::array<std::int8_t, kQuantBlockElements> block_codes;
  for (std::int64_t first = 0; first < count; first += kQuantBlockElements) {
    const std::int64_t length = std::min(kQuantBlockElements, count - first);
    convert_to_float(source + first * element_bytes, dtype, values.data(), length);
    const std::uint32_t max_magnitude = block_max_magnitude(values.data(), length);
    if (max_magnitude >= quant::kExponentBits) ++nonfinite_blocks;
    const float scale = quant::block_scale(max_magnitude, bits);
    std::memcpy(scales + (first / kQuantBlockElements) * sizeof(float), &scale, sizeof(float));
    if (scale == 0.0f) {
      block_codes.fill(0);
    } else {
      encode_block(values.data(), length, scale, bits, block_codes.data());
    }
    if (bits == QuantBits::kInt8) {
      std::memcpy(codes + first, block_codes.data(), static_cast<std::size_t>(length));
      continue;
    }
    // A short last block of odd length packs a zero into its last high nibble.
    if (length % 2 != 0) block_codes[length] = 0;
    std::byte* packed = codes + first / 2;
#pragma omp simd
    for (std::int64_t i = 0; i < (length + 1) / 2; ++i) {
      packed[i] =
          static_cast<std::byte>(quant::pack_int4(block_codes[2 * i], block_codes[2 * i + 1]));
    }
  }
  return nonfinite_blocks;
}

void dequantize_blocks(const void* in, QuantBits bits, std::int64_t count, void* out, DType dtype) {
  check_arguments("dequantize_blocks", dtype, count, in, out);
  const auto* scales = static_cast<const std::byte*>(in);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(scales + quant_codes_offset(count));
  auto* destination = static_cast<std::byte*>(out);
  const auto element_bytes = static_cast<std::int64_t>(size_of(dtype));
  Block values;
  std::array<std::int8_t, kQuantBlockElements> block_codes;
  for (std::int64_t first = 0; first < count; first += kQuantBlockElements) {
    const std::int64_t length = std::min(kQuantBlockElements, count - first);
    float scale = 0.0f;
    std::memcpy(&scale, scales + (first / kQuantBlockElements) * sizeof(float), sizeof(float));
    if (bits == QuantBits::kInt8) {
      std::memcpy(block_codes.data(), codes + first, static_cast<std::size_t>(length));
    } else {
      const std::uint8_t* packed = codes + first / 2;
#pragma omp simd
      for (std::int64_t i = 0; i < (length + 1) / 2; ++i) {
        block_codes[2 * i] = static_cast<std::int8_t>(quant::unpack_int4(packed[i]));
        block_codes[2 * i + 1] = static_cast<std::int8_t>(quant::unpack_int4(packed[i] >> 4u));
      }
    }
#pragma omp simd
    for (std::int64_t i = 0; i < length; ++i) {
      values[i] = quant::dequantize_value(block_codes[i], scale);
    }
    convert_from_float(values.data(), destination + first * element_bytes, dtype, length);
  }
}

}  // namespace zeroshard::detail
