// The flat layout splits any set of tensor sizes into equal, aligned, contiguous shards.
#include "layout/shard_layout.h"

#include <gtest/gtest.h>

#include <numeric>

namespace zeroshard::detail {
namespace {

TEST(ShardLayout, PadsWhenSizeDoesNotDivide) {
  const std::vector<std::int64_t> numels = {91, 7, 77, 11, 33, 3};
  for (int world = 1; world <= 4; ++world) {
    ShardLayout layout(numels, world, 16);
    EXPECT_EQ(layout.unpadded_total(), 222);
    EXPECT_EQ(layout.padded_total() % (16 * world), 0);
    EXPECT_EQ(layout.shard_size() * world, layout.padded_total());
    EXPECT_GE(layout.padded_total(), layout.offset(5) + 3);
  }
}

TEST(ShardLayout, AlignsEveryTensorStart) {
  ShardLayout layout(std::vector<std::int64_t>{5, 17, 1, 32}, 3, 16);
  EXPECT_EQ(layout.offset(0), 0);
  EXPECT_EQ(layout.offset(1), 16);
  EXPECT_EQ(layout.offset(2), 48);
  EXPECT_EQ(layout.offset(3), 64);
}

TEST(ShardLayout, RankCountsCoverAnyRangeExactly) {
  ShardLayout layout(std::vector<std::int64_t>{100, 50, 77}, 3, 16);
  for (std::int64_t begin : {0, 5, 64, 100}) {
    for (std::int64_t end : {begin, begin + 1, begin + 70, layout.padded_total()}) {
      if (end > layout.padded_total() || end < begin) continue;
      const auto counts = layout.rank_counts(begin, end);
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), std::int64_t{0}), end - begin);
    }
  }
}

TEST(ShardLayout, PiecesSkipPaddingAndSplitTensorsAtShardEdges) {
  ShardLayout layout(std::vector<std::int64_t>{20, 30}, 2, 16);
  // Offsets 0 and 32, padded total 64, shards [0,32) and [32,64).
  const auto first = layout.pieces(layout.shard_begin(0), layout.shard_end(0));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].tensor, 0);
  EXPECT_EQ(first[0].size, 20);
  const auto middle = layout.pieces(10, 40);
  ASSERT_EQ(middle.size(), 2u);
  EXPECT_EQ(middle[0].offset_in_tensor, 10);
  EXPECT_EQ(middle[0].size, 10);
  EXPECT_EQ(middle[1].tensor, 1);
  EXPECT_EQ(middle[1].flat_offset, 32);
  EXPECT_EQ(middle[1].size, 8);
}

TEST(ShardLayout, AnEmptyModelStillHasOneShardPerRank) {
  ShardLayout layout(std::vector<std::int64_t>{}, 4, 16);
  EXPECT_EQ(layout.shard_size(), 16);
  EXPECT_TRUE(layout.pieces(0, layout.padded_total()).empty());
}

}  // namespace
}  // namespace zeroshard::detail
