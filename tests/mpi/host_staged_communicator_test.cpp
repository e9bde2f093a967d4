// The host-staged communicator under 1..4 ranks, with a copier whose copies complete only after
// being polled a few times (as a GPU's asynchronous copies do): every collective gives the bytes
// the plain MPI communicator gives, requests in flight overlap and complete in any order of
// waiting, traffic counts agree, and the staging pool stops growing after the first step.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "comm/host_staged_communicator.h"
#include "comm/mpi_communicator.h"
#include "precision/half_conversion.h"
#include "zeroshard/communicator.h"
#include "zeroshard/error.h"

#if ZEROSHARD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_selection.h"
#include "comm/cuda/cuda_staging.h"
#endif

namespace zeroshard {
namespace {

using detail::StagingBuffer;
using detail::StagingCopy;

class HeapStagingBuffer final : public StagingBuffer {
 public:
  explicit HeapStagingBuffer(std::size_t bytes) : bytes_(bytes) {}
  void* data() const noexcept override { return bytes_.data(); }
  std::size_t bytes() const noexcept override { return bytes_.size(); }

 private:
  mutable std::vector<std::byte> bytes_;
};

// The bytes move when the copy is found done (after `polls` polls) or waited for, so a caller
// that reads the destination early, or frees the source early, sees the wrong bytes.
class DeferredCopy final : public StagingCopy {
 public:
  DeferredCopy(void* destination, const void* source, std::size_t bytes, int polls)
      : destination_(destination), source_(source), bytes_(bytes), polls_left_(polls) {}
  bool done() override {
    if (polls_left_-- > 0) return false;
    wait();
    return true;
  }
  void wait() override {
    if (source_ != nullptr) std::memcpy(destination_, source_, bytes_);
    source_ = nullptr;
  }

 private:
  void* destination_;
  const void* source_;
  std::size_t bytes_;
  int polls_left_;
};

class DeferredCopier final : public detail::StagingCopier {
 public:
  explicit DeferredCopier(int polls) : polls_(polls) {}
  std::unique_ptr<StagingBuffer> allocate(std::size_t bytes) override {
    return std::make_unique<HeapStagingBuffer>(bytes);
  }
  void follow_compute() override { ++follows_; }
  int follows() const { return follows_; }
  std::unique_ptr<StagingCopy> to_host(void* host, const void* device, std::size_t bytes) override {
    return std::make_unique<DeferredCopy>(host, device, bytes, polls_);
  }
  std::unique_ptr<StagingCopy> to_device(void* device, const void* host,
                                         std::size_t bytes) override {
    return std::make_unique<DeferredCopy>(device, host, bytes, polls_);
  }
  void set_compute_stream(void*) noexcept override {}
  std::unique_ptr<StagingCopier> another() const override {
    return std::make_unique<DeferredCopier>(polls_);
  }

 private:
  int polls_;
  int follows_ = 0;
};

// `count` values of `dtype` that differ per rank and per element, as raw bytes.
std::vector<std::byte> values(std::int64_t count, DType dtype, int rank, int salt) {
  std::vector<float> floats(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    floats[static_cast<std::size_t>(i)] =
        0.25f * static_cast<float>((rank + 1) * (i % 7 + salt)) - 0.125f * static_cast<float>(i);
  }
  std::vector<std::byte> bytes(static_cast<std::size_t>(count) * size_of(dtype));
  detail::convert_from_float(floats.data(), bytes.data(), dtype, count);
  return bytes;
}

std::vector<std::int64_t> uneven_counts(int size) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) counts[static_cast<std::size_t>(r)] = r % 2 == 1 ? 0 : 3 * r + 5;
  return counts;
}

class HostStaged : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    plain_ = detail::make_mpi_communicator({});
    auto copier = std::make_unique<DeferredCopier>(3);
    copier_ = copier.get();
    staged_ = std::make_unique<detail::HostStagedCommunicator>(detail::make_mpi_communicator({}),
                                                               std::move(copier));
    rank_ = plain_->rank();
    size_ = plain_->size();
  }

  // One of each collective on `plain` and on the staged communicator, all four in flight at
  // once on the staged one and waited for in reverse order; returns the staged results and
  // expects them equal to the plain ones.
  void run_step(int salt) {
    const DType dtype = GetParam();
    const std::vector<std::int64_t> counts = uneven_counts(size_);
    const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    const std::int64_t own = counts[static_cast<std::size_t>(rank_)];
    const std::int64_t own_offset =
        std::accumulate(counts.begin(), counts.begin() + rank_, std::int64_t{0});
    const std::size_t element = size_of(dtype);

    // The all-to-all sends counts[r] elements to rank r and receives own elements from each.
    const std::int64_t own_from_all = own * size_;
    struct Buffers {
      std::vector<std::byte> all_reduce, scatter_in, scatter_out, gather, broadcast, to_all_out;
    };
    auto fresh = [&] {
      Buffers b{values(11, dtype, rank_, salt),
                values(total, dtype, rank_, salt + 1),
                std::vector<std::byte>(static_cast<std::size_t>(own) * element),
                std::vector<std::byte>(static_cast<std::size_t>(total) * element),
                values(9, dtype, rank_, salt + 2),
                std::vector<std::byte>(static_cast<std::size_t>(own_from_all) * element)};
      const std::vector<std::byte> mine = values(own, dtype, rank_, salt + 3);
      std::copy(mine.begin(), mine.end(),
                b.gather.begin() + static_cast<std::ptrdiff_t>(own_offset * element));
      return b;
    };
    Buffers want = fresh();
    Buffers got = fresh();
    const int root = size_ - 1;
    const ReduceOp op = salt % 2 == 0 ? ReduceOp::kSum : ReduceOp::kMax;

    plain_->all_reduce(want.all_reduce.data(), 11, dtype, op);
    plain_->reduce_scatter(want.scatter_in.data(), want.scatter_out.data(), counts, dtype, op);
    plain_->all_gather(want.gather.data(), counts, dtype);
    plain_->broadcast(want.broadcast.data(), 9, dtype, root);
    const std::vector<std::int64_t> from_each(static_cast<std::size_t>(size_), own);
    plain_->all_to_all(want.scatter_in.data(), counts, want.to_all_out.data(), from_each, dtype);

    Request requests[] = {staged_->all_reduce_async(got.all_reduce.data(), 11, dtype, op),
                          staged_->reduce_scatter_async(got.scatter_in.data(),
                                                        got.scatter_out.data(), counts, dtype, op),
                          staged_->all_gather_async(got.gather.data(), counts, dtype),
                          staged_->broadcast_async(got.broadcast.data(), 9, dtype, root),
                          staged_->all_to_all_async(got.scatter_in.data(), counts,
                                                    got.to_all_out.data(), from_each, dtype)};
    // The copies in take several polls, so nothing can be complete yet.
    EXPECT_FALSE(requests[0].test());
    for (int i = 4; i >= 0; --i) requests[i].wait();

    EXPECT_EQ(got.all_reduce, want.all_reduce) << "all-reduce";
    EXPECT_EQ(got.scatter_out, want.scatter_out) << "reduce-scatter";
    EXPECT_EQ(got.gather, want.gather) << "all-gather";
    EXPECT_EQ(got.broadcast, want.broadcast) << "broadcast";
    EXPECT_EQ(got.to_all_out, want.to_all_out) << "all-to-all";
  }

  std::unique_ptr<Communicator> plain_;
  std::unique_ptr<detail::HostStagedCommunicator> staged_;
  const DeferredCopier* copier_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

TEST_P(HostStaged, EveryCollectiveGivesThePlainMpiResultWithRequestsInFlightTogether) {
  run_step(1);
  run_step(2);
}

// Every collective, a broadcast's receivers with nothing to copy in included, orders its copies
// after the compute stream: its output may still be being allocated or zeroed there.
TEST_P(HostStaged, EveryCollectiveFollowsTheComputeStream) {
  run_step(11);
  EXPECT_EQ(copier_->follows(), 5);
}

TEST_P(HostStaged, CountsTheSameTrafficAsPlainMpi) {
  run_step(3);
  staged_->barrier();
  plain_->barrier();
  const TrafficCounters& staged = staged_->traffic();
  const TrafficCounters& plain = plain_->traffic();
  for (int c = 0; c < kCollectiveCount; ++c) {
    EXPECT_EQ(staged.elements[c], plain.elements[c]) << to_string(static_cast<Collective>(c));
    EXPECT_EQ(staged.bytes[c], plain.bytes[c]) << to_string(static_cast<Collective>(c));
    EXPECT_EQ(staged.calls[c], plain.calls[c]) << to_string(static_cast<Collective>(c));
  }
}

TEST_P(HostStaged, ASplitStagesItsGroupsCollectives) {
  const std::unique_ptr<Communicator> group = staged_->split(rank_ % 2, rank_);
  EXPECT_EQ(group->backend(), "mpi+staging");
  std::vector<std::byte> data = values(5, GetParam(), rank_, 7);
  std::vector<std::byte> want = data;
  const std::unique_ptr<Communicator> plain_group = plain_->split(rank_ % 2, rank_);
  plain_group->all_reduce(want.data(), 5, GetParam(), ReduceOp::kMax);
  group->all_reduce(data.data(), 5, GetParam(), ReduceOp::kMax);
  EXPECT_EQ(data, want);
}

TEST_P(HostStaged, TheStagingPoolStopsGrowingAfterTheFirstStep) {
  run_step(4);
  const std::size_t after_first = staged_->staging_bytes();
  EXPECT_GT(after_first, 0u);
  for (int step = 5; step < 9; ++step) run_step(step);
  EXPECT_EQ(staged_->staging_bytes(), after_first);
}

TEST_P(HostStaged, TheStagingPoolIsHostCommunicationMemoryOfTheTrackerItIsChargedTo) {
  detail::MemoryTracker tracker;
  staged_->charge_staging_to(tracker);
  run_step(9);
  EXPECT_GT(staged_->staging_bytes(), 0u);
  EXPECT_EQ(tracker.current(MemoryCategory::kCommunication, MemoryLocation::kHost),
            static_cast<std::int64_t>(staged_->staging_bytes()));
  run_step(10);
  EXPECT_EQ(tracker.current(MemoryCategory::kCommunication, MemoryLocation::kHost),
            static_cast<std::int64_t>(staged_->staging_bytes()));
  EXPECT_THROW(staged_->charge_staging_to(tracker), UsageError);
  staged_.reset();
  EXPECT_EQ(tracker.current(MemoryCategory::kCommunication, MemoryLocation::kHost), 0);
}

TEST_P(HostStaged, ReducesInPlaceToThePlainMpiResultLeavingTheRestOfTheInput) {
  const DType dtype = GetParam();
  const std::vector<std::int64_t> counts = uneven_counts(size_);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const std::size_t element = size_of(dtype);
  const std::size_t first = static_cast<std::size_t>(std::accumulate(
                                counts.begin(), counts.begin() + rank_, std::int64_t{0})) *
                            element;
  const std::size_t bytes =
      static_cast<std::size_t>(counts[static_cast<std::size_t>(rank_)]) * element;
  const std::vector<std::byte> input = values(total, dtype, rank_, 5);
  std::vector<std::byte> want(bytes);
  plain_->reduce_scatter(input.data(), want.data(), counts, dtype);
  std::vector<std::byte> data = input;
  staged_->reduce_scatter(data.data(), data.data() + first, counts, dtype);
  EXPECT_TRUE(
      std::equal(want.begin(), want.end(), data.begin() + static_cast<std::ptrdiff_t>(first)));
  EXPECT_TRUE(
      std::equal(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(first), input.begin()));
  EXPECT_TRUE(std::equal(data.begin() + static_cast<std::ptrdiff_t>(first + bytes), data.end(),
                         input.begin() + static_cast<std::ptrdiff_t>(first + bytes)));
}

TEST_P(HostStaged, PollingAloneCompletesARequest) {
  std::vector<std::byte> data = values(5, GetParam(), rank_, 1);
  std::vector<std::byte> want = data;
  plain_->all_reduce(want.data(), 5, GetParam());
  Request request = staged_->all_reduce_async(data.data(), 5, GetParam(), ReduceOp::kSum);
  int polls = 0;
  while (!request.test()) ++polls;
  EXPECT_GT(polls, 0);
  EXPECT_EQ(data, want);
}

INSTANTIATE_TEST_SUITE_P(Types, HostStaged,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(HostStagedCommunicator, DescribesItselfAsStagedMpiOverDeviceBuffers) {
  const detail::HostStagedCommunicator staged(detail::make_mpi_communicator({}),
                                              std::make_unique<DeferredCopier>(0));
  EXPECT_EQ(staged.backend(), "mpi+staging");
  EXPECT_EQ(staged.buffer_device(), DeviceType::kCuda);
}

#if ZEROSHARD_WITH_CUDA
// The CUDA copier: device buffers whose input is still being written on a non-blocking compute
// stream when the collective is called.
TEST(HostStagedOnTheGpu, CollectivesSeeTheComputeStreamsWorkAndMatchPlainMpi) {
  if (!cuda::cuda_device_available()) {
    GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
  }
  const int device = cuda::select_device_for_local_rank();
  auto plain = detail::make_mpi_communicator({});
  detail::HostStagedCommunicator staged(detail::make_mpi_communicator({}),
                                        cuda::make_cuda_staging_copier(device));
  const cuda::CudaStream compute;
  staged.set_compute_stream(compute.get());
  const int rank = plain->rank();
  const std::int64_t count = std::int64_t{1} << 22;
  const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(float);
  std::vector<float> want(static_cast<std::size_t>(count), 0.0f);
  std::memset(want.data(), 0x10 + rank, bytes);
  plain->all_reduce(want.data(), count, DType::kFloat32);

  const cuda::DeviceBuffer data(bytes);
  ASSERT_EQ(cudaMemsetAsync(data.data(), 0x10 + rank, bytes, compute.get()), cudaSuccess);
  staged.all_reduce(data.data(), count, DType::kFloat32);
  std::vector<float> got(static_cast<std::size_t>(count));
  ASSERT_EQ(cudaMemcpy(got.data(), data.data(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want);
}
#endif

}  // namespace
}  // namespace zeroshard
