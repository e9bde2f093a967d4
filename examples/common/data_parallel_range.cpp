// Which items of the stream each rank trains on (see the header for the rule).
#include "data_parallel_range.h"

namespace zeroshard::examples {

BatchRange data_parallel_range(std::int64_t step, int micro_step, int accumulation_steps,
                               int micro_batch, int rank, int world_size) {
  const std::int64_t run = static_cast<std::int64_t>(micro_batch) * world_size;
  const std::int64_t first = (step * accumulation_steps + micro_step) * run +
                             static_cast<std::int64_t>(rank) * micro_batch;
  return {first, micro_batch};
}

}  // namespace zeroshard::examples
