// The size of the pinned staging between an offloaded update and the device: the engine allocates
// it and the memory estimator counts it from the same formula.
#pragma once

#include <cstdint>

namespace zeroshard::detail {

/// Offload: elements of updated parameters per write-back through staging (8 MiB of 16-bit
/// values), so the staging stays small whatever sub_group_size is.
inline constexpr std::int64_t kWriteBackElements = std::int64_t{1} << 22;

/// Bytes of one staging half: the largest share of a reduced bucket the rank receives
/// (`share_bytes`), or, when the update writes the parameters back through staging, one
/// write-back of at most kWriteBackElements, a sub-group and the `owned` elements, whichever is
/// larger. The memory estimator counts two halves of this.
std::int64_t host_staging_half_bytes(std::int64_t share_bytes, bool writes_back, std::int64_t owned,
                                     std::int64_t sub_group_size, std::int64_t element_bytes);

}  // namespace zeroshard::detail
