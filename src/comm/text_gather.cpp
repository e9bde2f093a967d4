// Text over a float-only all-gather: lengths first, then the bytes packed two to an element.
#include "comm/text_gather.h"

#include <cstring>

namespace zeroshard::detail {

// An all-gather copies elements bit for bit without arithmetic, so the bytes travel packed two to
// a 16-bit element, and the lengths as fp32 (exact for any text under 16 MiB).
std::vector<std::string> gather_text(const std::string& text, int rank, int world,
                                     const HostAllGather& gather) {
  const auto ranks = static_cast<std::size_t>(world);
  std::vector<float> lengths(ranks, 0.0f);
  lengths[static_cast<std::size_t>(rank)] = static_cast<float>(text.size());
  const std::vector<std::int64_t> ones(ranks, 1);
  gather(lengths.data(), ones, DType::kFloat32);

  std::vector<std::int64_t> counts(ranks);
  std::vector<std::int64_t> offsets(ranks);
  std::int64_t total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    counts[r] = (static_cast<std::int64_t>(lengths[r]) + 1) / 2;
    offsets[r] = total;
    total += counts[r];
  }
  std::vector<std::uint16_t> packed(static_cast<std::size_t>(total), 0);
  std::memcpy(packed.data() + offsets[static_cast<std::size_t>(rank)], text.data(), text.size());
  gather(packed.data(), counts, DType::kFloat16);

  std::vector<std::string> texts;
  for (std::size_t r = 0; r < ranks; ++r) {
    const char* begin = reinterpret_cast<const char*>(packed.data() + offsets[r]);
    texts.emplace_back(begin, static_cast<std::size_t>(lengths[r]));
  }
  return texts;
}

}  // namespace zeroshard::detail
