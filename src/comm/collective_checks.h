// Argument checks shared by every communicator backend, so each collective rejects the same
// misuse with the same message whatever the transport.
#pragma once

#include <cstdint>
#include <span>

#include "zeroshard/communicator.h"

namespace zeroshard::detail {

/// Checks a count of elements is not negative and a buffer is given when it is positive.
void check_buffer(Collective collective, const void* data, std::int64_t count);

/// Checks `counts` has one non-negative entry per rank; returns their sum.
std::int64_t checked_total(Collective collective, std::span<const std::int64_t> counts,
                           int world_size);

/// Checks a broadcast root names a rank of the world.
void check_root(int root, int world_size);

/// A reduce-scatter's `output` is either this rank's own slice of `input` (at `own_offset` bytes,
/// `output_bytes` long), which makes it in place, or apart from `input`; returns whether it is in
/// place and throws UsageError for any other overlap. Decided by position alone, so that a rank
/// whose slice is empty answers as every other rank that passes the same layout.
bool check_in_place(const void* input, std::int64_t input_bytes, std::int64_t own_offset,
                    const void* output, std::int64_t output_bytes);

/// An all-to-all's arguments: one count per rank on each side, buffers for them, and `input`
/// and `output` apart. Returns the elements this rank sends to the other ranks (its traffic).
std::int64_t check_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                              const void* output, std::span<const std::int64_t> recv_counts,
                              DType dtype, int rank, int world_size);

}  // namespace zeroshard::detail
