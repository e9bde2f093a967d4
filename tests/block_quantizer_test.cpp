// Tests of the CPU block quantizer of ZeRO++: the byte size and its targets, the error bound on
// random, constant, zero, huge, subnormal and exponent-sweep blocks from fp32, fp16 and bf16, and
// the report of blocks holding inf or NaN.
#include "kernels/cpu/block_quantizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "block_quantizer_inputs.h"
#include "precision/half_conversion.h"
#include "zeroshard/dtype.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

using quantizer_inputs::QuantizerInput;

// The bound the format promises for a finite block: half a scale step from rounding to the
// nearest code, plus the fp32 roundings of x / scale, of code * scale and of the scale itself
// (one ulp nudge included), each within a few units of 2^-24 of qmax * scale; 2^-21 covers their
// sum (about 5 * 2^-24) with room. Subnormal scales add nothing: every product is then exact.
float error_bound(float scale, QuantBits bits) {
  return scale * (0.5f + static_cast<float>(quant_max(bits)) * 0x1p-21f);
}

std::vector<std::uint8_t> bytes_of(const void* data, std::size_t count) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  return {bytes, bytes + count};
}

// The tensor in `dtype` and the fp32 values the encoder sees after rounding to it.
struct Source {
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
};

Source make_source(const std::vector<float>& values, DType dtype) {
  const auto count = static_cast<std::int64_t>(values.size());
  std::vector<std::uint16_t> storage(values.size() * size_of(dtype) / 2 + 1);
  convert_from_float(values.data(), storage.data(), dtype, count);
  Source source{bytes_of(storage.data(), values.size() * size_of(dtype)),
                std::vector<float>(values.size())};
  convert_to_float(storage.data(), dtype, source.values.data(), count);
  return source;
}

struct Encoded {
  std::vector<std::uint8_t> bytes;
  std::int64_t nonfinite_blocks = 0;
};

Encoded encode(const Source& source, DType dtype, QuantBits bits) {
  const auto count = static_cast<std::int64_t>(source.values.size());
  // 16-bit sources must be 2-byte aligned, which a vector of bytes does not promise.
  std::vector<std::uint16_t> aligned(source.bytes.size() / 2 + 1);
  std::memcpy(aligned.data(), source.bytes.data(), source.bytes.size());
  Encoded encoded{
      std::vector<std::uint8_t>(static_cast<std::size_t>(quantized_bytes(count, bits)))};
  encoded.nonfinite_blocks =
      quantize_blocks(aligned.data(), dtype, count, bits, encoded.bytes.data());
  return encoded;
}

std::vector<float> decode(const Encoded& encoded, QuantBits bits, std::size_t count) {
  std::vector<float> values(count);
  dequantize_blocks(encoded.bytes.data(), bits, static_cast<std::int64_t>(count), values.data(),
                    DType::kFloat32);
  return values;
}

float scale_of(const Encoded& encoded, std::int64_t block) {
  float scale = 0.0f;
  std::memcpy(&scale, encoded.bytes.data() + block * sizeof(float), sizeof(float));
  return scale;
}

int code_of(const Encoded& encoded, QuantBits bits, std::int64_t count, std::int64_t i) {
  const std::uint8_t* codes = encoded.bytes.data() + quant_codes_offset(count);
  return bits == QuantBits::kInt8 ? static_cast<std::int8_t>(codes[i])
                                  : quant::unpack_int4(codes[i / 2] >> (4 * (i % 2)));
}

// Checks the round trip of one input block by block and returns the largest |error| / scale.
double expect_round_trip(const std::vector<float>& x, const Encoded& encoded, QuantBits bits,
                         const std::string& what) {
  const auto count = static_cast<std::int64_t>(x.size());
  const std::vector<float> y = decode(encoded, bits, x.size());
  std::int64_t nonfinite_blocks = 0;
  double worst = 0.0;
  int failures = 0;
  for (std::int64_t block = 0; block < quant_block_count(count); ++block) {
    const std::int64_t first = block * kQuantBlockElements;
    const std::int64_t last = std::min(count, first + kQuantBlockElements);
    const bool finite =
        std::all_of(x.begin() + first, x.begin() + last, [](float v) { return std::isfinite(v); });
    float max_magnitude = 0.0f;
    for (std::int64_t i = first; i < last && finite; ++i) {
      max_magnitude = std::max(max_magnitude, std::abs(x[i]));
    }
    const float scale = scale_of(encoded, block);
    const auto qmax = static_cast<float>(quant_max(bits));
    if (!finite || max_magnitude == 0.0f) {
      nonfinite_blocks += finite ? 0 : 1;
      EXPECT_EQ(scale, 0.0f) << what << ", block " << block;
    } else {
      EXPECT_TRUE(std::isfinite(scale) && scale > 0.0f) << what << ", block " << block;
      // The largest element gets code +-qmax (or one less, at a nudged scale near FLT_MAX).
      EXPECT_GE(static_cast<double>(scale) * qmax, max_magnitude * (1.0 - 0x1p-21))
          << what << ", block " << block;
    }
    for (std::int64_t i = first; i < last; ++i) {
      const int code = code_of(encoded, bits, count, i);
      EXPECT_LE(std::abs(code), quant_max(bits)) << what << "[" << i << "]";
      if (!finite || max_magnitude == 0.0f) {
        EXPECT_EQ(code, 0) << what << "[" << i << "]";
        EXPECT_EQ(y[i], 0.0f) << what << "[" << i << "]";
        continue;
      }
      const double error = std::abs(static_cast<double>(y[i]) - x[i]);
      worst = std::max(worst, error / scale);
      if (!std::isfinite(y[i]) || error > error_bound(scale, bits)) {
        if (++failures <= 5) {
          ADD_FAILURE() << what << "[" << i << "]: x " << x[i] << ", decoded " << y[i] << ", error "
                        << error << " > bound " << error_bound(scale, bits) << " (scale " << scale
                        << ")";
        }
      }
    }
  }
  EXPECT_EQ(encoded.nonfinite_blocks, nonfinite_blocks) << what;
  if (count % 2 == 1 && bits == QuantBits::kInt4) {
    EXPECT_EQ(encoded.bytes.back() >> 4, 0) << what << ": the unused last nibble is not zero";
  }
  return worst;
}

using Case = quantizer_inputs::QuantizerCase;

class BlockQuantizer : public ::testing::TestWithParam<Case> {
 protected:
  QuantBits bits() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }

  // Encodes every input, checks each round trip and reports the worst |error| / scale seen.
  void expect_round_trips(const std::vector<QuantizerInput>& inputs) const {
    double worst = 0.0;
    for (const QuantizerInput& input : inputs) {
      const Source source = make_source(input.values, dtype());
      const Encoded encoded = encode(source, dtype(), bits());
      worst = std::max(worst, expect_round_trip(source.values, encoded, bits(), input.name));
    }
    const double allowed = 0.5 + quant_max(bits()) * 0x1p-21;
    RecordProperty("worst_error_over_scale", std::to_string(worst));
    std::printf("int%d from %s: max |error| / scale = %.9f (bound %.9f)\n",
                static_cast<int>(bits()), to_string(dtype()), worst, allowed);
    EXPECT_LE(worst, allowed);
  }
};

TEST_P(BlockQuantizer, RandomBlocksMeetTheErrorBound) {
  expect_round_trips(quantizer_inputs::random_inputs());
}

TEST_P(BlockQuantizer, ConstantBlocksMeetTheErrorBound) {
  expect_round_trips(quantizer_inputs::constant_inputs());
}

TEST_P(BlockQuantizer, AllZeroBlocksHaveScaleZeroAndDecodeToExactZeros) {
  expect_round_trips(quantizer_inputs::zero_inputs());
}

TEST_P(BlockQuantizer, HugeBlocksDecodeToFiniteValuesWithinTheBound) {
  expect_round_trips(quantizer_inputs::huge_inputs());
}

TEST_P(BlockQuantizer, LargestFiniteSourceValueDecodesToAFiniteValue) {
  const float largest = dtype() == DType::kFloat32   ? FLT_MAX
                        : dtype() == DType::kFloat16 ? 65504.0f
                                                     : 0x1.fep127f;
  const Source source = make_source({largest, -largest, largest / 3}, dtype());
  const Encoded encoded = encode(source, dtype(), bits());
  EXPECT_EQ(encoded.nonfinite_blocks, 0);
  for (const float value : decode(encoded, bits(), 3)) EXPECT_TRUE(std::isfinite(value)) << value;
  expect_round_trip(source.values, encoded, bits(), "largest finite");
}

TEST_P(BlockQuantizer, SubnormalBlocksMeetTheErrorBound) {
  expect_round_trips(quantizer_inputs::subnormal_inputs());
}

TEST_P(BlockQuantizer, EveryExponentMeetsTheErrorBound) {
  expect_round_trips(quantizer_inputs::exponent_sweep_inputs());
}

TEST_P(BlockQuantizer, CountsNonFiniteBlocksAndEncodesThemAsZeros) {
  expect_round_trips(quantizer_inputs::nonfinite_inputs());
}

TEST_P(BlockQuantizer, NonFiniteBlocksLeaveTheOtherBlocksAsTheyAre) {
  const std::vector<float> values = quantizer_inputs::nonfinite_inputs().front().values;
  std::vector<float> cleaned = values;
  std::replace_if(
      cleaned.begin(), cleaned.end(), [](float v) { return !std::isfinite(v); }, 0.0f);
  const Encoded with = encode(make_source(values, dtype()), dtype(), bits());
  const Encoded without = encode(make_source(cleaned, dtype()), dtype(), bits());
  EXPECT_EQ(with.nonfinite_blocks, 4);
  EXPECT_EQ(without.nonfinite_blocks, 0);
  const auto count = static_cast<std::int64_t>(values.size());
  for (const std::int64_t block : {1, 4, 5}) {
    EXPECT_EQ(scale_of(with, block), scale_of(without, block)) << "block " << block;
    for (std::int64_t i = block * kQuantBlockElements; i < (block + 1) * kQuantBlockElements; ++i) {
      ASSERT_EQ(code_of(with, bits(), count, i), code_of(without, bits(), count, i)) << i;
    }
  }
}

// The encoder's vectorized loops give, code for code, the format's scalar definitions
// (quant::block_scale, quant::quantize_value), which the CUDA kernels share: the CPU and the GPU
// encode alike. Every input of every kind, ties between two codes included.
TEST_P(BlockQuantizer, CodesAreTheScalarDefinitionsOfTheFormat) {
  std::vector<QuantizerInput> inputs = quantizer_inputs::random_inputs();
  for (auto more : {quantizer_inputs::constant_inputs(), quantizer_inputs::huge_inputs(),
                    quantizer_inputs::subnormal_inputs(), quantizer_inputs::exponent_sweep_inputs(),
                    quantizer_inputs::nonfinite_inputs()}) {
    inputs.insert(inputs.end(), more.begin(), more.end());
  }
  // Halfway values: x / scale = k + 1/2 must round to the even k.
  std::vector<float> ties(kQuantBlockElements);
  for (std::size_t i = 0; i < ties.size(); ++i) {
    ties[i] = (static_cast<float>(i % 127) - 63.0f) + 0.5f;
  }
  ties[0] = 127.0f;  // the block's largest magnitude: scale 1 for int8
  inputs.push_back({"ties", ties});
  for (const QuantizerInput& input : inputs) {
    const Source source = make_source(input.values, dtype());
    const Encoded encoded = encode(source, dtype(), bits());
    const auto count = static_cast<std::int64_t>(source.values.size());
    for (std::int64_t block = 0; block < quant_block_count(count); ++block) {
      const std::int64_t first = block * kQuantBlockElements;
      const std::int64_t last = std::min(count, first + kQuantBlockElements);
      std::uint32_t largest = 0;
      for (std::int64_t i = first; i < last; ++i) {
        largest = std::max(largest, quant::magnitude_bits(source.values[i]));
      }
      const float scale = quant::block_scale(largest, bits());
      ASSERT_EQ(scale_of(encoded, block), scale) << input.name << ", block " << block;
      for (std::int64_t i = first; i < last; ++i) {
        ASSERT_EQ(code_of(encoded, bits(), count, i),
                  quant::quantize_value(source.values[i], scale, bits()))
            << input.name << "[" << i << "] = " << source.values[i];
      }
    }
  }
}

TEST_P(BlockQuantizer, SixteenBitDecodeIsTheFp32DecodeRoundedOnce) {
  const std::vector<float> values = quantizer_inputs::random_inputs().back().values;
  const Source source = make_source(values, dtype());
  const Encoded encoded = encode(source, dtype(), bits());
  const std::vector<float> fp32 = decode(encoded, bits(), values.size());
  const auto count = static_cast<std::int64_t>(values.size());
  for (const DType out : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<std::uint16_t> decoded(values.size()), expected(values.size());
    dequantize_blocks(encoded.bytes.data(), bits(), count, decoded.data(), out);
    convert_from_float(fp32.data(), expected.data(), out, count);
    EXPECT_EQ(decoded, expected) << to_string(out);
  }
}

INSTANTIATE_TEST_SUITE_P(BitsAndSources, BlockQuantizer, quantizer_inputs::quantizer_cases(),
                         quantizer_inputs::quantizer_case_name);

TEST(BlockQuantizerFormat, ByteSizeIsScalesPlusCodes) {
  for (const std::int64_t count : {0, 1, 2, 255, 256, 257, 511, 1000, 4099}) {
    const std::int64_t blocks = (count + 255) / 256;
    EXPECT_EQ(quant_block_count(count), blocks) << count;
    EXPECT_EQ(quantized_bytes(count, QuantBits::kInt8), 4 * blocks + count) << count;
    EXPECT_EQ(quantized_bytes(count, QuantBits::kInt4), 4 * blocks + (count + 1) / 2) << count;
  }
}

TEST(BlockQuantizerFormat, LargeTensorsMeetTheByteTargetsOfZeroPlusPlus) {
  for (const std::int64_t count :
       {std::int64_t{1} << 20, std::int64_t{1} << 30, std::int64_t{1000000007}}) {
    const auto n = static_cast<double>(count);
    const auto int8 = static_cast<double>(quantized_bytes(count, QuantBits::kInt8));
    const auto int4 = static_cast<double>(quantized_bytes(count, QuantBits::kInt4));
    EXPECT_LE(int8 / (4 * n), 0.27) << "int8 gather bytes vs fp32, n " << count;
    EXPECT_LE(int8 / (2 * n), 0.53) << "int8 gather bytes vs bf16, n " << count;
    EXPECT_LE(int4 / (4 * n), 0.15) << "int4 gradient bytes vs fp32, n " << count;
  }
}

TEST(BlockQuantizerFormat, RejectsBadArguments) {
  std::vector<std::uint8_t> buffer(64);
  std::vector<double> doubles(4);
  EXPECT_THROW(quantize_blocks(buffer.data(), DType::kFloat32, -1, QuantBits::kInt8, buffer.data()),
               UsageError);
  EXPECT_THROW(quantize_blocks(doubles.data(), DType::kFloat64, 4, QuantBits::kInt8, buffer.data()),
               UsageError);
  EXPECT_THROW(quantize_blocks(nullptr, DType::kFloat32, 4, QuantBits::kInt4, buffer.data()),
               UsageError);
  EXPECT_THROW(
      dequantize_blocks(buffer.data(), QuantBits::kInt8, 4, doubles.data(), DType::kFloat64),
      UsageError);
  EXPECT_EQ(quantize_blocks(nullptr, DType::kFloat32, 0, QuantBits::kInt8, nullptr), 0);
}

}  // namespace
}  // namespace zeroshard::detail
