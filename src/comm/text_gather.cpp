// Text over a float-only all-gather: lengths first, then the bytes packed two to an element.
#include "comm/text_gather.h"

#include <array>
#include <cstring>

namespace zeroshard::detail {

namespace {

// An all-gather copies elements bit for bit without arithmetic, so bytes travel packed two to a
// 16-bit element: the texts, and before them each length as the 8 bytes of a 64-bit integer (a
// float would carry lengths exactly only below 2^24).
constexpr std::size_t kLengthElements = sizeof(std::uint64_t) / sizeof(std::uint16_t);
using PackedLength = std::array<std::uint16_t, kLengthElements>;

}  // namespace

std::vector<std::string> gather_text(const std::string& text, int rank, int world,
                                     const HostAllGather& gather) {
  const auto ranks = static_cast<std::size_t>(world);
  const auto me = static_cast<std::size_t>(rank);
  std::vector<PackedLength> packed_lengths(ranks, PackedLength{});
  const std::uint64_t my_length = text.size();
  std::memcpy(packed_lengths[me].data(), &my_length, sizeof my_length);
  const std::vector<std::int64_t> length_counts(ranks, kLengthElements);
  gather(packed_lengths.data(), length_counts, DType::kFloat16);

  std::vector<std::uint64_t> lengths(ranks);
  std::vector<std::int64_t> counts(ranks);
  std::vector<std::int64_t> offsets(ranks);
  std::int64_t total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    std::memcpy(&lengths[r], packed_lengths[r].data(), sizeof lengths[r]);
    counts[r] = static_cast<std::int64_t>((lengths[r] + 1) / 2);
    offsets[r] = total;
    total += counts[r];
  }
  std::vector<std::uint16_t> packed(static_cast<std::size_t>(total), 0);
  // Every rank knows every length, so all of them skip the second collective when no rank has
  // text; `packed` then has no storage, which memcpy must never be handed.
  if (total > 0) {
    if (!text.empty()) std::memcpy(packed.data() + offsets[me], text.data(), text.size());
    gather(packed.data(), counts, DType::kFloat16);
  }

  std::vector<std::string> texts;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (lengths[r] == 0) {
      texts.emplace_back();
      continue;
    }
    const char* begin = reinterpret_cast<const char*>(packed.data() + offsets[r]);
    texts.emplace_back(begin, lengths[r]);
  }
  return texts;
}

}  // namespace zeroshard::detail
