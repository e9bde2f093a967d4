// The batch-size identity train_batch_size = micro batch x gradient_accumulation_steps x world
// size: with the world size, any two of the three determine the third, as in DeepSpeed.
#pragma once

#include <cstdint>
#include <optional>

namespace zeroshard::detail {

struct BatchSizes {
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
};

/// Fills in what was not given (DeepSpeed's `_set_batch_related_parameters`): only
/// train_batch_size -> 1 accumulation step; only the micro batch -> 1 accumulation step.
/// Throws ConfigError with key path "train_batch_size" when neither train_batch_size nor the
/// micro batch is given, or when the sizes do not satisfy the identity.
BatchSizes resolve_batch_sizes(std::optional<std::int64_t> train_batch_size,
                               std::optional<std::int64_t> micro_batch,
                               std::optional<std::int64_t> accumulation_steps, int world_size);

}  // namespace zeroshard::detail
