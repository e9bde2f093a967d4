// Flat layout of trainable parameters and its per-rank shards.
#include "layout/shard_layout.h"

#include <algorithm>
#include <cmath>

namespace zeroshard::detail {

namespace {
std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

ShardLayout::ShardLayout(std::span<const std::int64_t> numels, int world_size,
                         std::int64_t alignment)
    : numels_(numels.begin(), numels.end()), world_size_(world_size) {
  std::int64_t cursor = 0;
  offsets_.reserve(numels.size());
  for (std::int64_t n : numels) {
    cursor = round_up(cursor, alignment);
    offsets_.push_back(cursor);
    cursor += n;
    unpadded_total_ += n;
  }
  // Equal shards that are each aligned keep every rank's vector loops on aligned addresses.
  padded_total_ = round_up(std::max<std::int64_t>(cursor, 1), alignment * world_size);
  shard_size_ = padded_total_ / world_size;
}

std::vector<std::int64_t> ShardLayout::rank_counts(std::int64_t begin, std::int64_t end) const {
  std::vector<std::int64_t> counts(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    counts[r] =
        std::max<std::int64_t>(0, std::min(end, shard_end(r)) - std::max(begin, shard_begin(r)));
  }
  return counts;
}

std::vector<TensorPiece> ShardLayout::pieces(std::int64_t begin, std::int64_t end) const {
  std::vector<TensorPiece> result;
  // First tensor that ends after `begin`: offsets are sorted, so binary search.
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), begin);
  int t = static_cast<int>(it - offsets_.begin()) - 1;
  if (t < 0) t = 0;
  for (; t < tensor_count() && offsets_[t] < end; ++t) {
    const std::int64_t lo = std::max(begin, offsets_[t]);
    const std::int64_t hi = std::min(end, offsets_[t] + numels_[t]);
    if (hi > lo) result.push_back({t, lo - offsets_[t], lo, hi - lo});
  }
  return result;
}

OptimizerSplit split_optimizer(bool offloaded, double ratio, std::int64_t owned) {
  OptimizerSplit split;
  if (offloaded) {
    const auto units = std::llround(ratio * static_cast<double>(owned) / kTensorAlignment);
    split.host = std::clamp<std::int64_t>(units * kTensorAlignment, 0, owned);
  }
  split.device = owned - split.host;
  split.host_part = offloaded && (split.host > 0 || split.device == 0);
  split.device_part = split.device > 0 || !offloaded;
  return split;
}

}  // namespace zeroshard::detail
