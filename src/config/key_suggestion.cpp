// Edit distance and closest-match lookup behind the config parser's "did you mean" hints.
#include "config/key_suggestion.h"

#include <algorithm>
#include <cctype>

namespace zeroshard::detail {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  auto same = [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  };
  // Row i of the table holds the distances between a[0, i) and every b[0, j). A swap looks two
  // rows back, so three rows suffice: memory grows with b alone.
  std::vector<std::size_t> two_back(b.size() + 1);
  std::vector<std::size_t> previous(b.size() + 1);
  std::vector<std::size_t> current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1,
                             previous[j - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) {
        current[j] = std::min(current[j], two_back[j - 2] + 1);
      }
    }
    two_back.swap(previous);
    previous.swap(current);
  }
  return previous[b.size()];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(1, word.size() / 3);
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    // The distance is at least the difference in length, so this skips no closer match; it
    // keeps a megabyte-long word from costing a megabyte-by-key table per candidate. What is
    // left to compare is at most about 1.5 times the candidate's length.
    const std::size_t gap = word.size() > candidate.size() ? word.size() - candidate.size()
                                                           : candidate.size() - word.size();
    if (gap >= best_distance) continue;
    std::size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

}  // namespace zeroshard::detail
