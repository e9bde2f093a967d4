// The NCCL communicator: environment parsing (runs anywhere), a world of one and a missing peer
// (one GPU), and uneven collectives and collective timeouts between ranks in threads (one GPU per
// rank, or NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1).
#include <gtest/gtest.h>

#if ZEROSHARD_WITH_CUDA

#include <cuda_runtime_api.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_selection.h"
#include "comm/cuda/nccl_communicator.h"
#include "zeroshard/error.h"

namespace zeroshard::cuda {
namespace {

// Sets (or unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

template <class T>
std::vector<T> download(const DeviceBuffer& buffer, std::size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), buffer.data(), count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  EXPECT_EQ(cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return buffer;
}

// --- environment: no GPU needed ----------------------------------------------------------------

TEST(NcclEnvironment, SeveralRanksWithoutRendezvousFileIsAUsageError) {
  ScopedEnv rank("RANK", "0");
  ScopedEnv world("WORLD_SIZE", "2");
  ScopedEnv file("ZEROSHARD_RDZV_FILE", nullptr);
  try {
    make_nccl_communicator_from_environment(0);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("ZEROSHARD_RDZV_FILE"), std::string::npos)
        << error.what();
  }
}

TEST(NcclEnvironment, RankWithoutWorldSizeIsAUsageError) {
  ScopedEnv rank("RANK", "1");
  ScopedEnv world("WORLD_SIZE", nullptr);
  EXPECT_THROW(make_nccl_communicator_from_environment(0), UsageError);
}

TEST(NcclEnvironment, MalformedLocalRankIsAUsageError) {
  ScopedEnv local_rank("LOCAL_RANK", "first");
  EXPECT_THROW(local_rank_from_environment(), UsageError);
}

// --- one GPU -----------------------------------------------------------------------------------

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda_unavailable_reason();
    }
  }
};

TEST_F(NcclOneRank, WorldOfOneRunsEveryCollectiveAndCountsTraffic) {
  ScopedEnv rank("RANK", nullptr);
  ScopedEnv world("WORLD_SIZE", nullptr);
  auto communicator = make_nccl_communicator_from_environment(0);
  EXPECT_EQ(communicator->rank(), 0);
  EXPECT_EQ(communicator->size(), 1);
  EXPECT_EQ(communicator->backend(), "nccl");

  const std::vector<float> values = {1.0f, -2.0f, 3.5f, 4.0f, 5.0f};
  DeviceBuffer data = upload(values);
  communicator->all_reduce(data.data(), 5, DType::kFloat32);
  EXPECT_EQ(download<float>(data, 5), values);

  DeviceBuffer output(5 * sizeof(float));
  const std::int64_t counts[] = {5};
  communicator->reduce_scatter(data.data(), output.data(), counts, DType::kFloat32);
  EXPECT_EQ(download<float>(output, 5), values);
  // In place: the output is this rank's slice of the input, here all of it.
  communicator->reduce_scatter(data.data(), data.data(), counts, DType::kFloat32);
  EXPECT_EQ(download<float>(data, 5), values);

  communicator->all_gather(data.data(), counts, DType::kFloat32);
  communicator->broadcast(data.data(), 5, DType::kFloat32, 0);
  communicator->barrier();
  EXPECT_EQ(download<float>(data, 5), values);

  const TrafficCounters& traffic = communicator->traffic();
  EXPECT_EQ(traffic.elements[static_cast<int>(Collective::kAllReduce)], 10);
  EXPECT_EQ(traffic.bytes[static_cast<int>(Collective::kAllReduce)], 40);
  EXPECT_EQ(traffic.elements[static_cast<int>(Collective::kReduceScatter)], 10);
  EXPECT_EQ(traffic.elements[static_cast<int>(Collective::kAllGather)], 5);
  EXPECT_EQ(traffic.elements[static_cast<int>(Collective::kBroadcast)], 5);
  EXPECT_EQ(traffic.calls[static_cast<int>(Collective::kBarrier)], 1);
}

TEST_F(NcclOneRank, AllToAllCopiesItsOwnBlockAndASplitOfOneWorks) {
  auto communicator = make_nccl_communicator(0, 0, 1, [](void*, std::size_t) {});
  const std::vector<float> values = {0.5f, -1.0f, 2.0f};
  DeviceBuffer input = upload(values);
  DeviceBuffer output(values.size() * sizeof(float));
  const std::int64_t counts[] = {3};
  communicator->all_to_all(input.data(), counts, output.data(), counts, DType::kFloat32);
  EXPECT_EQ(download<float>(output, 3), values);
  // Its own block is not traffic.
  EXPECT_EQ(communicator->traffic().elements[static_cast<int>(Collective::kAllToAll)], 0);
  const std::unique_ptr<Communicator> group = communicator->split(0, 0);
  EXPECT_EQ(group->backend(), "nccl");
  EXPECT_EQ(group->size(), 1);
  DeviceBuffer data = upload(values);
  group->all_reduce(data.data(), 3, DType::kFloat32);
  EXPECT_EQ(download<float>(data, 3), values);
}

TEST_F(NcclOneRank, CollectiveWaitsForWorkOnTheComputeStream) {
  auto communicator = make_nccl_communicator(0, 0, 1, [](void*, std::size_t) {});
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  communicator->set_compute_stream(compute);
  const std::size_t count = std::size_t{1} << 24;
  DeviceBuffer data(count * sizeof(float));
  DeviceBuffer output(count * sizeof(float));
  // Queued on the compute stream just before the collective; the collective must see it.
  ASSERT_EQ(cudaMemsetAsync(data.data(), 0x3f, count * sizeof(float), compute), cudaSuccess);
  const std::int64_t counts[] = {static_cast<std::int64_t>(count)};
  communicator->reduce_scatter(data.data(), output.data(), counts, DType::kFloat32);
  const std::vector<float> got = download<float>(output, count);
  const float want = std::bit_cast<float>(0x3f3f3f3fu);
  EXPECT_EQ(got.front(), want);
  EXPECT_EQ(got.back(), want);
  communicator.reset();
  EXPECT_EQ(cudaStreamDestroy(compute), cudaSuccess);
}

TEST_F(NcclOneRank, MissingPeerTimesOutNamingRankAndAbortsInsteadOfHanging) {
  ScopedEnv timeout("ZEROSHARD_COLLECTIVE_TIMEOUT_S", "3");
  // Rank 0 of a world of two whose rank 1 never starts.
  try {
    make_nccl_communicator(0, 0, 2, [](void*, std::size_t) {});
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("rank 0 of 2"), std::string::npos) << error.what();
  }
}

// --- several ranks, one thread each ------------------------------------------------------------

// Runs `body(rank)` on `world` threads sharing one NCCL unique id; rethrows the first failure.
void run_ranks(int world, const std::function<void(NcclCommunicator&)>& body) {
  const std::vector<std::byte> id = new_nccl_unique_id();
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  std::vector<std::exception_ptr> failures(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ASSERT_EQ(cudaSetDevice(rank % devices), cudaSuccess);
        NcclCommunicator communicator(rank, world, rank % devices, id.data());
        body(communicator);
      } catch (...) {
        failures[rank] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

class NcclTwoRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda_unavailable_reason();
    }
    int devices = 0;
    ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
    const int version = nccl_version();
    const char* shared = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    const bool may_share = version >= 23000 /* 2.30.0 */ && shared && std::string(shared) == "1";
    if (devices < 2 && !may_share) {
      GTEST_SKIP() << "two NCCL ranks need two GPUs (found " << devices << "), or NCCL 2.30+ "
                   << "(found " << version << ") with NCCL_MULTI_RANK_GPU_ENABLE=1";
    }
  }
};

TEST_F(NcclTwoRanks, UnevenReduceScatterAndAllGatherMoveEachRanksSlice) {
  const std::vector<std::int64_t> counts = {3, 5};
  run_ranks(2, [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    // Rank r contributes (r + 1) * (i + 1) at element i.
    std::vector<float> input(8);
    for (int i = 0; i < 8; ++i) input[i] = static_cast<float>((rank + 1) * (i + 1));
    DeviceBuffer d_input = upload(input);
    const std::int64_t own = counts[rank];
    const std::int64_t offset = rank == 0 ? 0 : counts[0];
    DeviceBuffer d_output(static_cast<std::size_t>(own) * sizeof(float));
    communicator.reduce_scatter(d_input.data(), d_output.data(), counts, DType::kFloat32);
    const std::vector<float> reduced = download<float>(d_output, static_cast<std::size_t>(own));
    for (std::int64_t i = 0; i < own; ++i) {
      EXPECT_EQ(reduced[i], 3.0f * static_cast<float>(offset + i + 1)) << "rank " << rank;
    }
    // In place (one reduce per slice, this rank's with its send and receive buffers the same):
    // the same sums, and the other slice of the input as it was.
    float* own_slice = static_cast<float*>(d_input.data()) + offset;
    communicator.reduce_scatter(d_input.data(), own_slice, counts, DType::kFloat32);
    const std::vector<float> in_place = download<float>(d_input, 8);
    for (std::int64_t i = 0; i < 8; ++i) {
      const bool mine = i >= offset && i < offset + own;
      EXPECT_EQ(in_place[i], mine ? reduced[i - offset] : input[i]) << "rank " << rank;
    }

    std::vector<float> gathered(8, -1.0f);
    for (std::int64_t i = 0; i < own; ++i) gathered[offset + i] = static_cast<float>(10 * rank + i);
    DeviceBuffer d_gathered = upload(gathered);
    communicator.all_gather(d_gathered.data(), counts, DType::kFloat32);
    const std::vector<float> all = download<float>(d_gathered, 8);
    for (int r = 0; r < 2; ++r) {
      for (std::int64_t i = 0; i < counts[r]; ++i) {
        EXPECT_EQ(all[(r == 0 ? 0 : counts[0]) + i], static_cast<float>(10 * r + i))
            << "rank " << rank;
      }
    }
    EXPECT_EQ(communicator.traffic().elements[static_cast<int>(Collective::kReduceScatter)], 16);
    EXPECT_EQ(communicator.traffic().elements[static_cast<int>(Collective::kAllGather)], 8);
  });
}

TEST_F(NcclTwoRanks, AllToAllDeliversUnevenBlocksInRankOrder) {
  run_ranks(2, [&](NcclCommunicator& communicator) {
    const int rank = communicator.rank();
    // Rank r sends r + 2 * peer + 1 elements to each peer, valued 100 r + 10 peer + i.
    const auto count = [](int from, int to) { return std::int64_t{from + 2 * to + 1}; };
    std::vector<std::int64_t> sends = {count(rank, 0), count(rank, 1)};
    std::vector<std::int64_t> receives = {count(0, rank), count(1, rank)};
    std::vector<float> input;
    for (int to = 0; to < 2; ++to) {
      for (std::int64_t i = 0; i < count(rank, to); ++i) {
        input.push_back(static_cast<float>(100 * rank + 10 * to + i));
      }
    }
    DeviceBuffer d_input = upload(input);
    const std::size_t received = static_cast<std::size_t>(receives[0] + receives[1]);
    DeviceBuffer d_output(received * sizeof(float));
    communicator.all_to_all(d_input.data(), sends, d_output.data(), receives, DType::kFloat32);
    const std::vector<float> got = download<float>(d_output, received);
    std::size_t at = 0;
    for (int from = 0; from < 2; ++from) {
      for (std::int64_t i = 0; i < count(from, rank); ++i, ++at) {
        EXPECT_EQ(got[at], static_cast<float>(100 * from + 10 * rank + i)) << "rank " << rank;
      }
    }
    EXPECT_EQ(communicator.traffic().elements[static_cast<int>(Collective::kAllToAll)],
              count(rank, 1 - rank));
    // Each rank alone in its group.
    const std::unique_ptr<Communicator> alone = communicator.split(rank, 0);
    EXPECT_EQ(alone->size(), 1);
  });
}

TEST_F(NcclTwoRanks, HalfPrecisionAllReduceAndEqualReduceScatter) {
  run_ranks(2, [&](NcclCommunicator& communicator) {
    // 0x3c00 is 1.0 in fp16, 0x4000 is 2.0; 0x3f80 is 1.0 in bf16, 0x4000 is 2.0.
    for (const auto& [dtype, one, two] : {std::tuple{DType::kFloat16, 0x3c00, 0x4000},
                                          std::tuple{DType::kBFloat16, 0x3f80, 0x4000}}) {
      DeviceBuffer data = upload(std::vector<std::uint16_t>(6, static_cast<std::uint16_t>(one)));
      communicator.all_reduce(data.data(), 6, dtype);
      for (std::uint16_t bits : download<std::uint16_t>(data, 6)) EXPECT_EQ(bits, two);
      DeviceBuffer output(3 * sizeof(std::uint16_t));
      const std::int64_t counts[] = {3, 3};
      communicator.reduce_scatter(data.data(), output.data(), counts, dtype, ReduceOp::kMax);
      for (std::uint16_t bits : download<std::uint16_t>(output, 3)) EXPECT_EQ(bits, two);
    }
  });
}

TEST_F(NcclTwoRanks, CollectiveThatOneRankSkipsTimesOutAndRefusesLaterCalls) {
  ScopedEnv timeout("ZEROSHARD_COLLECTIVE_TIMEOUT_S", "3");
  run_ranks(2, [&](NcclCommunicator& communicator) {
    DeviceBuffer data(1024 * sizeof(float));
    if (communicator.rank() == 1) return;  // rank 1 never joins the all-reduce
    try {
      communicator.all_reduce(data.data(), 1024, DType::kFloat32);
      ADD_FAILURE() << "expected TimeoutError";
    } catch (const TimeoutError& error) {
      EXPECT_NE(std::string(error.what()).find("collective #1 all-reduce of 1024 fp32 elements"),
                std::string::npos)
          << error.what();
      EXPECT_NE(std::string(error.what()).find("rank 0"), std::string::npos) << error.what();
    }
    // The first timeout ends the communicator: later collectives fail at once, pointing at it.
    try {
      communicator.broadcast(data.data(), 1, DType::kFloat32, 0);
      ADD_FAILURE() << "expected the broadcast after the timeout to be refused";
    } catch (const TimeoutError& error) {
      EXPECT_NE(std::string(error.what()).find("abandoned at once: an earlier timeout"),
                std::string::npos)
          << error.what();
    }
  });
}

}  // namespace
}  // namespace zeroshard::cuda

#else  // !ZEROSHARD_WITH_CUDA

TEST(NcclCommunicator, NeedsTheCudaBackend) {
  GTEST_SKIP() << "zeroshard was built without CUDA (ZEROSHARD_CUDA=OFF or no nvcc found)";
}

#endif
