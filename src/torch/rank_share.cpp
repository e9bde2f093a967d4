// Each rank's share of a global batch: the rows of a tensor (Optimizer::rank_share) and the
// indices of a torch sampler's draw (RankShareSampler), by one rule.
#include <torch/serialize/archive.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "zeroshard/torch.h"

namespace zeroshard::torch {

namespace {

// Rank `rank`'s part of `rows` rows: [first, first + count), `count` the same on every rank.
struct Share {
  std::size_t first;
  std::size_t count;
};

Share share_of(std::size_t rows, int rank, int world) {
  const std::size_t count = rows / static_cast<std::size_t>(world);
  return {count * static_cast<std::size_t>(rank), count};
}

}  // namespace

std::pair<int, int> default_rank_and_world() {
  const std::unique_ptr<Communicator> world = Communicator::from_environment();
  if (world->size() > 1) return {world->rank(), world->size()};
  // Outside an MPI launcher the CPU communicator is a world of one; a GPU run started by a
  // launcher that sets RANK and WORLD_SIZE has its NCCL world there.
  const char* rank = std::getenv("RANK");
  const char* size = std::getenv("WORLD_SIZE");
  if (rank == nullptr || size == nullptr) return {0, 1};
  return {std::atoi(rank), std::atoi(size)};
}

RankShareSampler::RankShareSampler(std::unique_ptr<::torch::data::samplers::Sampler<>> base,
                                   int rank, int world)
    : base_(std::move(base)), rank_(rank), world_(world) {
  if (!base_ || world_ < 1 || rank_ < 0 || rank_ >= world_) {
    throw UsageError("zeroshard::torch::RankShareSampler: needs a base sampler and a rank in [0, " +
                     std::to_string(world_) + "), got rank " + std::to_string(rank_));
  }
}

void RankShareSampler::reset(::torch::optional<std::size_t> new_size) { base_->reset(new_size); }

::torch::optional<std::vector<std::size_t>> RankShareSampler::next(std::size_t batch_size) {
  ::torch::optional<std::vector<std::size_t>> drawn =
      base_->next(batch_size * static_cast<std::size_t>(world_));
  if (!drawn) return drawn;
  const Share share = share_of(drawn->size(), rank_, world_);
  // Fewer rows than ranks: every rank ends the epoch here alike.
  if (share.count == 0) return ::torch::nullopt;
  const auto first = drawn->begin() + static_cast<std::ptrdiff_t>(share.first);
  return std::vector<std::size_t>(first, first + static_cast<std::ptrdiff_t>(share.count));
}

void RankShareSampler::save(::torch::serialize::OutputArchive& archive) const {
  base_->save(archive);
}

void RankShareSampler::load(::torch::serialize::InputArchive& archive) { base_->load(archive); }

at::Tensor Optimizer::rank_share(const at::Tensor& batch) const {
  const int world = engine().world_size();
  const Share share = share_of(static_cast<std::size_t>(batch.size(0)), engine().rank(), world);
  if (share.count == 0) {
    throw UsageError("zeroshard::torch::Optimizer::rank_share: a batch of " +
                     std::to_string(batch.size(0)) + " rows has no row for each of " +
                     std::to_string(world) + " ranks; draw at least one row per rank");
  }
  return batch.narrow(0, static_cast<std::int64_t>(share.first),
                      static_cast<std::int64_t>(share.count));
}

}  // namespace zeroshard::torch
