// Solving and checking the batch-size identity.
#include "config/batch_sizes.h"

#include <string>

#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

const char* const kKey = "train_batch_size";

std::int64_t product(std::int64_t a, std::int64_t b) {
  std::int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) {
    throw ConfigError(kKey, "the batch sizes multiply to more than 2^63");
  }
  return result;
}

// `total` must be a whole multiple of `divisor`; `divisor_text` says where the divisor comes
// from.
std::int64_t divide_exactly(std::int64_t total, std::int64_t divisor,
                            const std::string& divisor_text) {
  if (total % divisor != 0) {
    throw ConfigError(
        kKey, "got " + std::to_string(total) + ", which is not a multiple of " + divisor_text);
  }
  return total / divisor;
}

}  // namespace

BatchSizes resolve_batch_sizes(std::optional<std::int64_t> train_batch_size,
                               std::optional<std::int64_t> micro_batch,
                               std::optional<std::int64_t> accumulation_steps, int world_size) {
  const std::string world = "world size " + std::to_string(world_size);
  BatchSizes sizes;
  if (train_batch_size && micro_batch && accumulation_steps) {
    std::int64_t expected = product(product(*micro_batch, *accumulation_steps), world_size);
    if (expected != *train_batch_size) {
      throw ConfigError(kKey, "got " + std::to_string(*train_batch_size) +
                                  ", but train_micro_batch_size_per_gpu " +
                                  std::to_string(*micro_batch) + " x gradient_accumulation_steps " +
                                  std::to_string(*accumulation_steps) + " x " + world + " = " +
                                  std::to_string(expected));
    }
    sizes = {*train_batch_size, *micro_batch, *accumulation_steps};
  } else if (train_batch_size && micro_batch) {
    std::int64_t per_step = product(*micro_batch, world_size);
    sizes = {*train_batch_size, *micro_batch,
             divide_exactly(*train_batch_size, per_step,
                            "train_micro_batch_size_per_gpu " + std::to_string(*micro_batch) +
                                " x " + world + " = " + std::to_string(per_step))};
  } else if (train_batch_size && accumulation_steps) {
    std::int64_t per_micro_batch = product(*accumulation_steps, world_size);
    sizes = {*train_batch_size,
             divide_exactly(*train_batch_size, per_micro_batch,
                            "gradient_accumulation_steps " + std::to_string(*accumulation_steps) +
                                " x " + world + " = " + std::to_string(per_micro_batch)),
             *accumulation_steps};
  } else if (micro_batch && accumulation_steps) {
    sizes = {product(product(*micro_batch, *accumulation_steps), world_size), *micro_batch,
             *accumulation_steps};
  } else if (train_batch_size) {
    sizes = {*train_batch_size, divide_exactly(*train_batch_size, world_size, world), 1};
  } else if (micro_batch) {
    sizes = {product(*micro_batch, world_size), *micro_batch, 1};
  } else {
    throw ConfigError(kKey,
                      "missing; give train_batch_size or train_micro_batch_size_per_gpu (or "
                      "both), as DeepSpeed requires");
  }
  return sizes;
}

}  // namespace zeroshard::detail
