// A synthetic, learnable classification task generated from a seed; data_parallel_range
// (data_parallel_range.h) decides which of its samples each rank trains on.
#pragma once

#include <cstdint>
#include <vector>

#include "data_parallel_range.h"

namespace zeroshard::examples {

/// Gaussian clusters: class c has a random centre in R^inputs and a sample of class c is that
/// centre plus unit Gaussian noise; labels are uniform. Sample i depends only on the seed and i,
/// so any rank can produce any slice of the stream without producing the rest.
class SyntheticClassification {
 public:
  /// Throws UsageError when inputs or classes is not positive.
  SyntheticClassification(int inputs, int classes, std::uint64_t seed);

  /// Writes samples [first, first + count) of the stream: x as [count, inputs] row-major,
  /// labels in [0, classes).
  void sample(std::int64_t first, int count, float* x, int* labels) const;

  int inputs() const noexcept { return inputs_; }
  int classes() const noexcept { return classes_; }

 private:
  int inputs_;
  int classes_;
  std::uint64_t seed_;
  std::vector<float> centres_;  ///< [classes, inputs]
};

}  // namespace zeroshard::examples
