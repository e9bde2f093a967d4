// Zeroing host arrays on the OpenMP team in the CPU update's tiles and static schedule, so that
// each page is first touched (and, on a NUMA host, placed) by the thread that will update it; and
// copying them in the same tiles, each by the thread that touched it.
#pragma once

#include <cstddef>

namespace zeroshard::detail {

/// Bytes from which zero_host() and copy_host() spread over the team: 2^20 elements of 2 bytes, the
/// smallest array of an update the CPU rules thread (kernels/cpu/cpu_optimizer.cpp checks the
/// match).
inline constexpr std::size_t kFirstTouchThreadedFrom = std::size_t{2} << 20;
/// Bytes per tile: 2^16 fp32 elements, the update's tile of the master weights and states. A
/// 16-bit array's tiles hold twice the update's elements; the static schedule still hands each
/// thread the same share of the array, to within one tile.
inline constexpr std::size_t kFirstTouchTile = std::size_t{1} << 18;
/// Huge pages: host allocations of at least this many bytes are aligned to it and advised
/// MADV_HUGEPAGE, so that they are mapped once per 2 MiB instead of once per 4 KiB.
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

/// memset(data, 0, bytes), over the OpenMP team in tiles from kFirstTouchThreadedFrom bytes on.
void zero_host(void* data, std::size_t bytes) noexcept;

/// memcpy(destination, source, bytes) for non-overlapping arrays, spread as zero_host(): a CPU
/// rank's copy between tiers (an offloaded update's write-back through staging) is as many bytes
/// as a 16-bit array of the update, which one thread would copy at a fraction of the host's speed.
void copy_host(void* destination, const void* source, std::size_t bytes) noexcept;

}  // namespace zeroshard::detail
