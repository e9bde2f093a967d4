// zero_host: one memset per tile, the tiles spread over the OpenMP team like the update's.
#include "memory/host_first_touch.h"

#include <cstdint>
#include <cstring>

#include "util/cpu_team.h"

namespace zeroshard::detail {

void zero_host(void* data, std::size_t bytes) noexcept {
  if (bytes < kFirstTouchThreadedFrom) {
    if (bytes > 0) std::memset(data, 0, bytes);
    return;
  }
  auto* base = static_cast<unsigned char*>(data);
  const auto tiles = static_cast<std::int64_t>((bytes + kFirstTouchTile - 1) / kFirstTouchTile);
  // schedule(static), as the update's tiles: thread k of P touches the k-th P-th of the array.
#pragma omp parallel for schedule(static) num_threads(cpu_team_size())
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::size_t begin = static_cast<std::size_t>(t) * kFirstTouchTile;
    const std::size_t end = begin + kFirstTouchTile < bytes ? begin + kFirstTouchTile : bytes;
    std::memset(base + begin, 0, end - begin);
  }
}

}  // namespace zeroshard::detail
