// Block quantization of ZeRO++ on the CPU, one block at a time through an fp32 copy of it.
#include "comm/block_quantizer.h"

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
  for (std::int64_t first = 0; first < count; first += kQuantBlockElements) {
    const std::int64_t length = std::min(kQuantBlockElements, count - first);
    convert_to_float(source + first * element_bytes, dtype, values.data(), length);
    std::uint32_t max_magnitude = 0;
    for (std::int64_t i = 0; i < length; ++i) {
      max_magnitude = std::max(max_magnitude, quant::magnitude_bits(values[i]));
    }
    if (max_magnitude >= quant::kExponentBits) ++nonfinite_blocks;
    const float scale = quant::block_scale(max_magnitude, bits);
    std::memcpy(scales + (first / kQuantBlockElements) * sizeof(float), &scale, sizeof(float));
    if (bits == QuantBits::kInt8) {
      for (std::int64_t i = 0; i < length; ++i) {
        codes[first + i] = static_cast<std::byte>(quant::quantize_value(values[i], scale, bits));
      }
    } else {
      for (std::int64_t i = 0; i < length; i += 2) {
        const int low = quant::quantize_value(values[i], scale, bits);
        const int high = i + 1 < length ? quant::quantize_value(values[i + 1], scale, bits) : 0;
        codes[(first + i) / 2] = static_cast<std::byte>(quant::pack_int4(low, high));
      }
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
  for (std::int64_t first = 0; first < count; first += kQuantBlockElements) {
    const std::int64_t length = std::min(kQuantBlockElements, count - first);
    float scale = 0.0f;
    std::memcpy(&scale, scales + (first / kQuantBlockElements) * sizeof(float), sizeof(float));
    for (std::int64_t i = 0; i < length; ++i) {
      const std::int64_t element = first + i;
      const int code = bits == QuantBits::kInt8
                           ? static_cast<std::int8_t>(codes[element])
                           : quant::unpack_int4(codes[element / 2] >> (4 * (element % 2)));
      values[i] = quant::dequantize_value(code, scale);
    }
    convert_from_float(values.data(), destination + first * element_bytes, dtype, length);
  }
}

}  // namespace zeroshard::detail
