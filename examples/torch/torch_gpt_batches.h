// The example's training batches: byte-level windows of examples/gpt's TextCorpus, spread over
// the ranks by libtorch's DistributedRandomSampler so that each rank trains on other sequences.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "text_data.h"  // zeroshard::examples::TextCorpus

namespace torch_gpt {

struct Batch {
  torch::Tensor tokens;   ///< [micro_batch, seq], int64
  torch::Tensor targets;  ///< the token after each of them
};

class RankBatches {
 public:
  /// The corpus' training stream, read as train_tokens / seq windows (each drawn by TextCorpus
  /// from `seed` and its index), of which this rank takes a 1/world share per epoch.
  RankBatches(const zeroshard::examples::TextCorpus& corpus, int seq, int micro_batch, int rank,
              int world, std::uint64_t seed);
  /// The next micro-batch; a new epoch (another shuffle) when this one runs out.
  Batch next();

 private:
  const zeroshard::examples::TextCorpus& corpus_;
  int seq_;
  int micro_batch_;
  std::uint64_t seed_;
  std::size_t epoch_ = 0;
  torch::data::samplers::DistributedRandomSampler sampler_;
};

}  // namespace torch_gpt
