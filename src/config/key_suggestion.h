// "Did you mean ...?" for misspelt config keys and values: the closest known word by edit
// distance, when it is close enough to be a plausible typo.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zeroshard::detail {

/// Edit distance between `a` and `b` ignoring ASCII case: insert, delete, substitute and swap
/// of two neighbours each cost 1 (optimal string alignment).
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate closest to `word`, or nothing when none is within a third of the word's length
/// (at least 1 edit). Ties go to the earliest candidate.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

}  // namespace zeroshard::detail
