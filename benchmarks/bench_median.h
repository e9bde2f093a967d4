// The median every benchmark reports: for an even count the upper of the two middle values, so
// that it is always one measured value, whose round can be printed beside it.
#pragma once

#include <algorithm>
#include <vector>

namespace zeroshard::bench {

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace zeroshard::bench
