// The tensors both block quantizer tests encode, so that the CUDA kernels are compared with the
// CPU encoder on exactly the inputs whose error bound the CPU test asserts.
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "layout/quantized_block_format.h"
#include "zeroshard/dtype.h"

namespace zeroshard::quantizer_inputs {

struct QuantizerInput {
  std::string name;
  std::vector<float> values;
};

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kSmallestSubnormal = std::numeric_limits<float>::denorm_min();

// Counts that cover n < B, one exact block, short last blocks and many blocks.
inline const std::vector<std::size_t>& quantizer_counts() {
  static const std::vector<std::size_t> counts{1, 2, 7, 255, 256, 257, 1000, 4099};
  return counts;
}

template <class Distribution>
std::vector<float> random_values(std::size_t count, unsigned seed, Distribution distribution,
                                 bool random_sign = false) {
  std::mt19937 generator(seed);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> values(count);
  for (float& value : values) {
    value = static_cast<float>(distribution(generator));
    if (random_sign && negative(generator)) value = -value;
  }
  return values;
}

inline std::vector<QuantizerInput> random_inputs() {
  std::vector<QuantizerInput> inputs;
  unsigned seed = 1;
  for (const std::size_t count : quantizer_counts()) {
    const std::string size = " n=" + std::to_string(count);
    inputs.push_back({"uniform" + size,
                      random_values(count, seed++, std::uniform_real_distribution(-1.0, 1.0))});
    inputs.push_back(
        {"normal 1e-3" + size, random_values(count, seed++, std::normal_distribution(0.0, 1e-3))});
    // Magnitudes over about 2^-40 .. 2^40 in one block: most codes are 0 next to the outliers.
    inputs.push_back({"lognormal" + size,
                      random_values(count, seed++, std::lognormal_distribution(0.0, 8.0), true)});
    inputs.push_back({"positive 1e30" + size,
                      random_values(count, seed++, std::uniform_real_distribution(0.0, 1e30))});
  }
  return inputs;
}

inline std::vector<QuantizerInput> constant_inputs() {
  std::vector<QuantizerInput> inputs;
  for (const float value : {1.0f, -3.5f, 0.1f, -2.0e-3f, 6.0e4f, 1.0e-30f}) {
    for (const std::size_t count : {std::size_t{1}, std::size_t{300}}) {
      inputs.push_back({"constant " + std::to_string(value) + " n=" + std::to_string(count),
                        std::vector<float>(count, value)});
    }
  }
  return inputs;
}

inline std::vector<QuantizerInput> zero_inputs() {
  std::vector<float> mixed_signs(600, 0.0f);
  for (std::size_t i = 0; i < mixed_signs.size(); i += 3) mixed_signs[i] = -0.0f;
  return {{"zeros n=1", {0.0f}},
          {"zeros n=513", std::vector<float>(513, 0.0f)},
          {"signed zeros n=600", mixed_signs}};
}

inline std::vector<QuantizerInput> huge_inputs() {
  std::vector<float> mixed = random_values(700, 77, std::uniform_real_distribution(-1.0, 1.0));
  mixed[0] = FLT_MAX;
  mixed[1] = 1e-30f;
  mixed[300] = -FLT_MAX;
  mixed[301] = -1e-38f;
  mixed[600] = FLT_MAX;
  mixed[601] = -FLT_MAX;
  std::vector<float> near_max =
      random_values(512, 78, std::uniform_real_distribution(0.99 * FLT_MAX, double{FLT_MAX}), true);
  // The largest finite bf16 and fp16; FLT_MAX itself rounds to inf in both.
  const float bf16_max = 0x1.fep127f;
  const float fp16_max = 65504.0f;
  return {{"FLT_MAX n=1", {FLT_MAX}},
          {"largest bf16 n=3", {bf16_max, -bf16_max, 1e-30f}},
          {"largest fp16 n=4", {fp16_max, -fp16_max, 1e-3f, -6e-8f}},
          {"-FLT_MAX n=3", {-FLT_MAX, -FLT_MAX, -FLT_MAX}},
          {"FLT_MAX mixed with tiny n=700", mixed},
          {"near FLT_MAX n=512", near_max},
          {"one below FLT_MAX n=2", {std::nextafter(FLT_MAX, 0.0f), -FLT_MAX / 127.0f}}};
}

inline std::vector<QuantizerInput> subnormal_inputs() {
  std::vector<float> random_subnormal(400);
  std::mt19937 generator(91);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7fffff);
  std::bernoulli_distribution negative(0.5);
  for (float& value : random_subnormal) {
    value = std::ldexp(static_cast<float>(mantissa(generator)), -149);
    if (negative(generator)) value = -value;
  }
  std::vector<float> few_ulps(300);
  for (std::size_t i = 0; i < few_ulps.size(); ++i) {
    few_ulps[i] = kSmallestSubnormal * static_cast<float>(static_cast<int>(i % 400) - 150);
  }
  return {{"smallest subnormal n=1", {kSmallestSubnormal}},
          {"smallest subnormals n=5",
           {kSmallestSubnormal, -kSmallestSubnormal, 0.0f, 2 * kSmallestSubnormal,
            -3 * kSmallestSubnormal}},
          {"random subnormals n=400", random_subnormal},
          {"subnormal multiples n=300", few_ulps},
          {"FLT_MIN with subnormals n=3", {FLT_MIN, kSmallestSubnormal, -FLT_MIN / 3}}};
}

// Every exponent, with a few mantissas: each block is [a, x] with x random in [-a, a], which
// walks the scale's rounding through every binade, the subnormal and the near-overflow ones.
inline std::vector<QuantizerInput> exponent_sweep_inputs() {
  std::mt19937 generator(5);
  std::uniform_real_distribution<float> fraction(-1.0f, 1.0f);
  std::vector<float> values;
  for (int exponent = -149; exponent <= 127; ++exponent) {
    for (const float mantissa : {1.0f, 1.1f, 1.5f, 1.9999999f}) {
      const float a = std::ldexp(mantissa, exponent);
      if (!std::isfinite(a) || a == 0.0f) continue;
      std::vector<float> block(zeroshard::detail::kQuantBlockElements, 0.0f);
      block[0] = a;
      for (std::size_t i = 1; i < block.size(); ++i) block[i] = a * fraction(generator);
      values.insert(values.end(), block.begin(), block.end());
    }
  }
  return {{"exponent sweep", values}};
}

// Blocks holding inf or NaN, alone and among finite blocks.
inline std::vector<QuantizerInput> nonfinite_inputs() {
  std::vector<float> values = random_values(6 * 256 + 10, 17, std::normal_distribution(0.0, 1.0));
  values[0] = kInf;               // block 0, first element
  values[2 * 256 + 255] = -kInf;  // block 2, last element
  values[3 * 256 + 100] = kNaN;   // block 3
  values[3 * 256 + 101] = kInf;
  values[6 * 256 + 9] = -kNaN;  // the short last block
  return {{"inf, -inf and NaN in 4 of 7 blocks", values},
          {"NaN n=1", {kNaN}},
          {"inf next to FLT_MAX n=2", {FLT_MAX, kInf}}};
}

inline std::vector<QuantizerInput> all_quantizer_inputs() {
  std::vector<QuantizerInput> inputs;
  for (auto&& group : {random_inputs(), constant_inputs(), zero_inputs(), huge_inputs(),
                       subnormal_inputs(), exponent_sweep_inputs(), nonfinite_inputs()}) {
    inputs.insert(inputs.end(), group.begin(), group.end());
  }
  return inputs;
}

/// The parameters both tests run over: each code width from each source type.
using QuantizerCase = std::tuple<detail::QuantBits, DType>;

inline auto quantizer_cases() {
  return ::testing::Combine(::testing::Values(detail::QuantBits::kInt8, detail::QuantBits::kInt4),
                            ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16));
}

/// "int8_fp32" and the like.
inline std::string quantizer_case_name(const ::testing::TestParamInfo<QuantizerCase>& info) {
  return "int" + std::to_string(static_cast<int>(std::get<0>(info.param))) + "_" +
         to_string(std::get<1>(info.param));
}

}  // namespace zeroshard::quantizer_inputs
