// Argument checks shared by every communicator backend.
#include "comm/collective_checks.h"

#include <cstddef>
#include <cstdint>

#include "util/check.h"

namespace zeroshard::detail {

void check_buffer(Collective collective, const void* data, std::int64_t count) {
  ZEROSHARD_CHECK_USAGE(count >= 0, to_string(collective)
                                        << ": got count " << count << ", expected >= 0");
  ZEROSHARD_CHECK_USAGE(count == 0 || data != nullptr,
                        to_string(collective) << ": null buffer for " << count << " elements");
}

std::int64_t checked_total(Collective collective, std::span<const std::int64_t> counts,
                           int world_size) {
  ZEROSHARD_CHECK_USAGE(counts.size() == static_cast<std::size_t>(world_size),
                        to_string(collective)
                            << ": got " << counts.size() << " counts, expected one per rank ("
                            << world_size << ")");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    ZEROSHARD_CHECK_USAGE(counts[i] >= 0, to_string(collective) << ": counts[" << i << "] is "
                                                                << counts[i] << ", expected >= 0");
    total += counts[i];
  }
  return total;
}

void check_root(int root, int world_size) {
  ZEROSHARD_CHECK_USAGE(root >= 0 && root < world_size,
                        "broadcast: got root " << root << ", expected 0.." << world_size - 1);
}

bool check_in_place(const void* input, std::int64_t input_bytes, std::int64_t own_offset,
                    const void* output, std::int64_t output_bytes) {
  // Compared as integers: relational operators on pointers into different objects are unspecified.
  const auto in = reinterpret_cast<std::uintptr_t>(input);
  const auto out = reinterpret_cast<std::uintptr_t>(output);
  if (input != nullptr && out == in + static_cast<std::uintptr_t>(own_offset)) return true;
  const bool overlap = input_bytes > 0 && output_bytes > 0 &&
                       in < out + static_cast<std::uintptr_t>(output_bytes) &&
                       out < in + static_cast<std::uintptr_t>(input_bytes);
  ZEROSHARD_CHECK_USAGE(!overlap,
                        "reduce-scatter: output overlaps input but is not this rank's "
                        "own slice of it; pass that slice (in place) or a separate "
                        "buffer");
  return false;
}

std::int64_t check_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                              const void* output, std::span<const std::int64_t> recv_counts,
                              DType dtype, int rank, int world_size) {
  const std::int64_t sent = checked_total(Collective::kAllToAll, send_counts, world_size);
  const std::int64_t received = checked_total(Collective::kAllToAll, recv_counts, world_size);
  check_buffer(Collective::kAllToAll, input, sent);
  check_buffer(Collective::kAllToAll, output, received);
  const auto in = reinterpret_cast<std::uintptr_t>(input);
  const auto out = reinterpret_cast<std::uintptr_t>(output);
  const auto in_bytes = static_cast<std::uintptr_t>(sent) * size_of(dtype);
  const auto out_bytes = static_cast<std::uintptr_t>(received) * size_of(dtype);
  ZEROSHARD_CHECK_USAGE(
      in_bytes == 0 || out_bytes == 0 || in + in_bytes <= out || out + out_bytes <= in,
      "all-to-all: the output overlaps the input; pass separate buffers");
  return sent - send_counts[static_cast<std::size_t>(rank)];
}

}  // namespace zeroshard::detail
