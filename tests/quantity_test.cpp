// Parsing and printing of the counts and byte sizes the command-line tools take and show.
#include "zeroshard/quantity.h"

#include <gtest/gtest.h>

#include "zeroshard/error.h"

namespace zeroshard {
namespace {

TEST(Quantity, ParsesCountsWithSuffixesAndExponents) {
  EXPECT_EQ(parse_count("7500000000", "--params"), 7'500'000'000);
  EXPECT_EQ(parse_count("7.5e9", "--params"), 7'500'000'000);
  EXPECT_EQ(parse_count("7.5B", "--params"), 7'500'000'000);
  EXPECT_EQ(parse_count("1.3M", "--params"), 1'300'000);
  EXPECT_EQ(parse_count("125k", "--params"), 125'000);
  EXPECT_EQ(parse_count("2T", "--params"), 2'000'000'000'000);
}

TEST(Quantity, RejectsCountsThatAreNotWholeOrNotNumbers) {
  EXPECT_THROW(parse_count("1.5", "--ranks"), UsageError);
  EXPECT_THROW(parse_count("-3", "--ranks"), UsageError);
  try {
    parse_count("lots", "--params");
    FAIL();
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("--params: got \"lots\""), std::string::npos);
  }
}

TEST(Quantity, ParsesDecimalAndBinaryByteSizes) {
  EXPECT_EQ(parse_bytes("80GB", "--fit-memory"), 80'000'000'000);
  EXPECT_EQ(parse_bytes("80 GB", "--fit-memory"), 80'000'000'000);
  EXPECT_EQ(parse_bytes("80e9", "--fit-memory"), 80'000'000'000);
  EXPECT_EQ(parse_bytes("16GiB", "--fit-memory"), std::int64_t{16} << 30);
  EXPECT_EQ(parse_bytes("512MiB", "--fit-memory"), std::int64_t{512} << 20);
  EXPECT_THROW(parse_bytes("80 parsecs", "--fit-memory"), UsageError);
}

TEST(Quantity, FormatsBytesAsThePaperDoes) {
  EXPECT_EQ(format_decimal_bytes(120'000'000'000), "120.0 GB");
  EXPECT_EQ(format_decimal_bytes(31'406'250'000), "31.4 GB");
  EXPECT_EQ(format_decimal_bytes(1'875'000'000), "1.9 GB");
  EXPECT_EQ(format_decimal_bytes(562'500'000), "562.5 MB");
  EXPECT_EQ(format_decimal_bytes(64), "64 B");
  EXPECT_EQ(format_binary_bytes(std::int64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(format_binary_bytes(0), "0 B");
  EXPECT_EQ(format_count(7'500'000'000), "7.50B");
  EXPECT_EQ(format_count(950), "950");
}

}  // namespace
}  // namespace zeroshard
