// A synthetic, learnable classification task generated from a seed, and the data-parallel rule
// that decides which of its samples each rank trains on.
#pragma once

#include <cstdint>
#include <vector>

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

/// The samples of the stream one rank trains on in one micro-step.
struct SampleRange {
  std::int64_t first = 0;
  int count = 0;
};

/// Optimizer step `step` consumes global batch `step` (micro_batch x accumulation_steps x
/// world_size consecutive samples). Micro-step m takes the m-th run of micro_batch x world_size
/// of them and rank r the r-th micro_batch of that run, so the samples behind each update, and
/// therefore the training run, are the same whatever the world size for one global batch size.
SampleRange data_parallel_range(std::int64_t step, int micro_step, int accumulation_steps,
                                int micro_batch, int rank, int world_size);

}  // namespace zeroshard::examples
