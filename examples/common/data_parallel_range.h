// The data-parallel rule the example trainers share: which run of a global batch each rank trains
// on in each micro-step.
#pragma once

#include <cstdint>

namespace zeroshard::examples {

/// The items (samples, sequences) of the stream one rank trains on in one micro-step.
struct BatchRange {
  std::int64_t first = 0;
  int count = 0;
};

/// Optimizer step `step` consumes global batch `step` (micro_batch x accumulation_steps x
/// world_size consecutive items). Micro-step m takes the m-th run of micro_batch x world_size
/// of them and rank r the r-th micro_batch of that run, so the items behind each update, and
/// therefore the training run, are the same whatever the world size for one global batch size.
BatchRange data_parallel_range(std::int64_t step, int micro_step, int accumulation_steps,
                               int micro_batch, int rank, int world_size);

}  // namespace zeroshard::examples
