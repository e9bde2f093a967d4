// The flat layout of the trainable parameters and its split into one contiguous shard per rank:
// a pure value type, testable without any buffer or communicator.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace zeroshard::detail {

// Tensors start on 16-element boundaries: 64 bytes of fp32, one cache line and one AVX-512
// vector, so every tensor's slice of a shard starts aligned. Checkpoints record it: the flat
// offsets depend on it and not on the world size.
inline constexpr std::int64_t kTensorAlignment = 16;

/// How a rank's `owned` elements divide between the optimizer's parts, for the engine's optimizer
/// shard and the estimator alike. Without offload: one device part. Offloaded: the first `host`
/// elements on the host, the nearest multiple of kTensorAlignment to ratio x owned (so that each
/// part starts aligned and the gradient scan's ranges meet at multiples of 16), the rest on the
/// device; a part is there when it holds elements, and the host's also when it holds them all
/// (a rank that owns none still has it).
struct OptimizerSplit {
  std::int64_t host = 0;
  std::int64_t device = 0;
  bool host_part = false;
  bool device_part = false;
};
OptimizerSplit split_optimizer(bool offloaded, double ratio, std::int64_t owned);

/// A run of one tensor's elements inside some range of the flat buffer.
struct TensorPiece {
  int tensor = 0;
  std::int64_t offset_in_tensor = 0;
  std::int64_t flat_offset = 0;
  std::int64_t size = 0;
};

/// Tensors are placed in order, each starting on a multiple of `alignment` elements; the total is
/// padded so that it splits into `world_size` equal shards, each a multiple of `alignment`.
/// Rank r owns [r * shard_size, (r + 1) * shard_size).
class ShardLayout {
 public:
  ShardLayout() = default;
  ShardLayout(std::span<const std::int64_t> numels, int world_size, std::int64_t alignment);

  int world_size() const noexcept { return world_size_; }
  int tensor_count() const noexcept { return static_cast<int>(offsets_.size()); }
  std::int64_t offset(int tensor) const { return offsets_[tensor]; }
  std::int64_t numel(int tensor) const { return numels_[tensor]; }
  std::int64_t unpadded_total() const noexcept { return unpadded_total_; }
  std::int64_t padded_total() const noexcept { return padded_total_; }
  std::int64_t shard_size() const noexcept { return shard_size_; }
  std::int64_t shard_begin(int rank) const noexcept { return rank * shard_size_; }
  std::int64_t shard_end(int rank) const noexcept { return (rank + 1) * shard_size_; }

  /// Elements of [begin, end) that each rank owns, in rank order; they sum to end - begin.
  std::vector<std::int64_t> rank_counts(std::int64_t begin, std::int64_t end) const;
  /// The tensor runs inside [begin, end), in flat order (padding is skipped).
  std::vector<TensorPiece> pieces(std::int64_t begin, std::int64_t end) const;

 private:
  std::vector<std::int64_t> numels_;
  std::vector<std::int64_t> offsets_;
  int world_size_ = 1;
  std::int64_t unpadded_total_ = 0;
  std::int64_t padded_total_ = 0;
  std::int64_t shard_size_ = 0;
};

}  // namespace zeroshard::detail
