// The public fp32 <-> 16-bit conversions a model uses on raw_data() and raw_grad(): exact
// widening, round-to-nearest-even narrowing, overflow to infinity, plain copies for fp32.
#include "zeroshard/dtype.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace zeroshard {
namespace {

TEST(DTypeConversion, NarrowsToNearestEvenAndWidensExactly) {
  // 1 + 2^-11 lies halfway between fp16's 1 and 1 + 2^-10: ties go to the even 1.
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: to the even 1 + 2^-9.
  const std::vector<float> values = {1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -2.5f, 1e5f};
  std::vector<std::uint16_t> half(values.size());
  from_float(values.data(), half.data(), DType::kFloat16, static_cast<std::int64_t>(values.size()));
  EXPECT_EQ(half, (std::vector<std::uint16_t>{0x3c00, 0x3c00, 0x3c02, 0xc100, 0x7c00}));
  std::vector<float> back(values.size());
  to_float(half.data(), DType::kFloat16, back.data(), static_cast<std::int64_t>(half.size()));
  EXPECT_EQ(back, (std::vector<float>{1.0f, 1.0f, 1.0f + 0x1p-9f, -2.5f,
                                      std::numeric_limits<float>::infinity()}));

  std::vector<std::uint16_t> brain(values.size());
  from_float(values.data(), brain.data(), DType::kBFloat16,
             static_cast<std::int64_t>(values.size()));
  EXPECT_EQ(brain[0], 0x3f80);
  EXPECT_EQ(brain[3], 0xc020);
  to_float(brain.data(), DType::kBFloat16, back.data(), static_cast<std::int64_t>(brain.size()));
  EXPECT_EQ(back[4], 99840.0f) << "1e5 rounds to the nearest bf16, 99840";
}

TEST(DTypeConversion, CopiesFp32) {
  const std::vector<float> values = {0.1f, -3.0f, 7e30f};
  std::vector<float> copy(values.size());
  from_float(values.data(), copy.data(), DType::kFloat32, 3);
  EXPECT_EQ(copy, values);
  to_float(values.data(), DType::kFloat32, copy.data(), 3);
  EXPECT_EQ(copy, values);
}

}  // namespace
}  // namespace zeroshard
