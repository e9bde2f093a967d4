// Micro-batches of text windows for one rank, drawn through torch's distributed sampler.
#include "torch_gpt_batches.h"

#include <vector>

namespace torch_gpt {

RankBatches::RankBatches(const zeroshard::examples::TextCorpus& corpus, int seq, int micro_batch,
                         int rank, int world, std::uint64_t seed)
    : corpus_(corpus),
      seq_(seq),
      micro_batch_(micro_batch),
      seed_(seed),
      sampler_(static_cast<std::size_t>(corpus.train_tokens() / seq),
               static_cast<std::size_t>(world), static_cast<std::size_t>(rank)) {}

Batch RankBatches::next() {
  // c10::optional in libtorch 1.13, std::optional in later releases.
  auto indices = sampler_.next(static_cast<std::size_t>(micro_batch_));
  // A short last batch would give this rank fewer sequences than the others; start over.
  if (!indices || indices->size() < static_cast<std::size_t>(micro_batch_)) {
    sampler_.set_epoch(++epoch_);
    sampler_.reset();
    indices = sampler_.next(static_cast<std::size_t>(micro_batch_));
  }
  torch::Tensor tokens = torch::empty({micro_batch_, seq_}, torch::kInt);
  torch::Tensor targets = torch::empty({micro_batch_, seq_}, torch::kInt);
  for (int s = 0; s < micro_batch_; ++s) {
    corpus_.train_window(seed_, static_cast<std::int64_t>((*indices)[static_cast<std::size_t>(s)]),
                         tokens[s].data_ptr<int>(), targets[s].data_ptr<int>());
  }
  return {tokens.to(torch::kLong), targets.to(torch::kLong)};
}

}  // namespace torch_gpt
