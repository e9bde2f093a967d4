// Per-rank element counts, as reduce-scatter and all-gather take them: one entry per rank, the
// ranks' parts laid out one after another in rank order.
#pragma once

#include <cstdint>
#include <numeric>
#include <span>

namespace zeroshard::detail {

/// The elements of every rank's part together.
inline std::int64_t total_of(std::span<const std::int64_t> counts) noexcept {
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

/// Where `rank`'s part begins: the elements of the ranks before it.
inline std::int64_t offset_of(std::span<const std::int64_t> counts, int rank) noexcept {
  return total_of(counts.first(static_cast<std::size_t>(rank)));
}

}  // namespace zeroshard::detail
