// zero_host and copy_host: one memset or memcpy per tile, the tiles spread over the OpenMP team
// like the update's.
#include "memory/host_first_touch.h"

#include <cstdint>
#include <cstring>

#include "util/cpu_team.h"

namespace zeroshard::detail {

namespace {

// Calls `tile(begin, end)` for each tile of [0, bytes): on the caller's thread below
// kFirstTouchThreadedFrom, else schedule(static) as the update's tiles, so that thread k of P
// handles the k-th P-th of the array.
template <class Tile>
void for_each_tile(std::size_t bytes, Tile&& tile) noexcept {
  if (bytes < kFirstTouchThreadedFrom) {
    if (bytes > 0) tile(std::size_t{0}, bytes);
    return;
  }
  const auto tiles = static_cast<std::int64_t>((bytes + kFirstTouchTile - 1) / kFirstTouchTile);
#pragma omp parallel for schedule(static) num_threads(cpu_team_size())
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::size_t begin = static_cast<std::size_t>(t) * kFirstTouchTile;
    tile(begin, begin + kFirstTouchTile < bytes ? begin + kFirstTouchTile : bytes);
  }
}

}  // namespace

void zero_host(void* data, std::size_t bytes) noexcept {
  auto* base = static_cast<unsigned char*>(data);
  for_each_tile(bytes, [base](std::size_t begin, std::size_t end) {
    std::memset(base + begin, 0, end - begin);
  });
}

void copy_host(void* destination, const void* source, std::size_t bytes) noexcept {
  auto* to = static_cast<unsigned char*>(destination);
  const auto* from = static_cast<const unsigned char*>(source);
  for_each_tile(bytes, [to, from](std::size_t begin, std::size_t end) {
    std::memcpy(to + begin, from + begin, end - begin);
  });
}

}  // namespace zeroshard::detail
