// The MPI communicator under 1..4 ranks: results of every collective (fp32, fp16, bf16, uneven and
// empty slices, collectives split into several MPI calls), traffic counts, requests, timeouts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/node_groups.h"
#include "precision/half_conversion.h"
#include "zeroshard/communicator.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return -1;
}

std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> offsets(counts.size());
  std::exclusive_scan(counts.begin(), counts.end(), offsets.begin(), std::int64_t{0});
  return offsets;
}

// Uneven slices where every odd rank owns nothing, so empty slices are always exercised at np>=2.
std::vector<std::int64_t> uneven_counts(int size) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) counts[static_cast<std::size_t>(r)] = r % 2 == 1 ? 0 : 2 * r + 5;
  return counts;
}

// Every collective test runs twice: with MPI's own int limit (one MPI call per collective) and
// with a limit of 3 elements per call, which forces the split path used beyond INT_MAX.
class MpiCollective : public ::testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override {
    comm_ = detail::make_mpi_communicator({.max_elements_per_call = GetParam()});
    rank_ = comm_->rank();
    size_ = comm_->size();
  }

  std::unique_ptr<Communicator> comm_;
  int rank_ = 0;
  int size_ = 0;
};

TEST_P(MpiCollective, AllReduceSumsFp32) {
  std::vector<float> data(10);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank_ + 1 + i);
  comm_->all_reduce(data.data(), static_cast<std::int64_t>(data.size()), DType::kFloat32);
  for (std::size_t i = 0; i < data.size(); ++i) {
    EXPECT_EQ(data[i], static_cast<float>(size_ * (size_ + 1) / 2 + size_ * i)) << "element " << i;
  }
}

TEST_P(MpiCollective, AllReduceTakesMaxFp32) {
  const auto value = [](int rank, std::size_t i) {
    return static_cast<float>((rank * 7 + static_cast<int>(i) * 3) % 11) - 5.0f;
  };
  std::vector<float> data(9);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(rank_, i);
  comm_->all_reduce(data.data(), static_cast<std::int64_t>(data.size()), DType::kFloat32,
                    ReduceOp::kMax);
  for (std::size_t i = 0; i < data.size(); ++i) {
    float expected = value(0, i);
    for (int r = 1; r < size_; ++r) expected = std::max(expected, value(r, i));
    EXPECT_EQ(data[i], expected) << "element " << i;
  }
}

TEST_P(MpiCollective, ReduceScatterGivesEachRankItsReducedSlice) {
  const std::vector<std::int64_t> counts = uneven_counts(size_);
  const std::vector<std::int64_t> offsets = offsets_of(counts);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::vector<float> input(static_cast<std::size_t>(total));
  for (std::size_t j = 0; j < input.size(); ++j) input[j] = static_cast<float>(rank_ * 1000 + j);
  const auto mine = static_cast<std::size_t>(rank_);
  std::vector<float> output(static_cast<std::size_t>(counts[mine]), -1.0f);

  comm_->reduce_scatter(input.data(), output.data(), counts, DType::kFloat32);

  for (std::size_t k = 0; k < output.size(); ++k) {
    const auto j = static_cast<float>(offsets[mine] + static_cast<std::int64_t>(k));
    EXPECT_EQ(output[k], 1000.0f * static_cast<float>(size_ * (size_ - 1) / 2) + size_ * j)
        << "element " << k;
  }
}

TEST_P(MpiCollective, TypedOverloadsTakeSpansOfFloat) {
  const std::vector<std::int64_t> counts = uneven_counts(size_);
  const std::vector<std::int64_t> offsets = offsets_of(counts);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const auto mine = static_cast<std::size_t>(rank_);

  std::vector<float> sum(4, static_cast<float>(rank_ + 1));
  comm_->all_reduce(std::span<float>(sum));
  EXPECT_EQ(sum, std::vector<float>(4, static_cast<float>(size_ * (size_ + 1) / 2)));

  std::vector<float> input(static_cast<std::size_t>(total), 1.0f);
  std::vector<float> output(static_cast<std::size_t>(counts[mine]));
  comm_->reduce_scatter(input, output, counts);
  EXPECT_EQ(output, std::vector<float>(output.size(), static_cast<float>(size_)));

  std::vector<float> gathered(static_cast<std::size_t>(total), -1.0f);
  for (std::int64_t k = 0; k < counts[mine]; ++k) {
    gathered[static_cast<std::size_t>(offsets[mine] + k)] = static_cast<float>(rank_);
  }
  comm_->all_gather(gathered, counts);
  for (int r = 0; r < size_; ++r) {
    const auto rr = static_cast<std::size_t>(r);
    for (std::int64_t k = 0; k < counts[rr]; ++k) {
      EXPECT_EQ(gathered[static_cast<std::size_t>(offsets[rr] + k)], static_cast<float>(r));
    }
  }

  std::vector<float> root_value(3, static_cast<float>(rank_));
  comm_->broadcast(root_value, size_ - 1);
  EXPECT_EQ(root_value, std::vector<float>(3, static_cast<float>(size_ - 1)));
}

TEST_P(MpiCollective, TypedOverloadsCheckTheSpanAgainstTheCounts) {
  // Checked before any message is sent, on every rank alike: no rank is left waiting.
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(size_), 2);
  std::vector<float> short_input(static_cast<std::size_t>(2 * size_ - 1));
  std::vector<float> output(2);
  try {
    comm_->reduce_scatter(short_input, output, counts);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& error) {
    EXPECT_THAT(error.what(),
                HasSubstr("reduce-scatter: input holds " + std::to_string(2 * size_ - 1) +
                          " elements, but the counts need " + std::to_string(2 * size_)));
  }
  std::vector<float> too_long(static_cast<std::size_t>(2 * size_ + 1));
  EXPECT_THROW(comm_->all_gather(too_long, counts), UsageError);
}

// fp64 values that fp32 cannot hold (2^40 plus a multiple of 2^-10): every sum below is exact in
// fp64, in any order, so a detour through fp32 anywhere would show.
double fine_value(int rank, std::int64_t i) {
  return std::ldexp(1.0, 40) + rank + std::ldexp(static_cast<double>(i), -10);
}

double fine_sum(int size, std::int64_t i) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += fine_value(r, i);
  return sum;
}

TEST_P(MpiCollective, TypedOverloadsTakeSpansOfDoubleAndKeepFp64Precision) {
  const std::vector<std::int64_t> counts = uneven_counts(size_);
  const std::vector<std::int64_t> offsets = offsets_of(counts);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const auto mine = static_cast<std::size_t>(rank_);

  std::vector<double> sum(5);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = fine_value(rank_, static_cast<int>(i));
  comm_->all_reduce(std::span<double>(sum));
  for (std::size_t i = 0; i < sum.size(); ++i) {
    EXPECT_EQ(sum[i], fine_sum(size_, static_cast<std::int64_t>(i))) << "element " << i;
  }
  EXPECT_EQ(comm_->traffic().bytes[static_cast<int>(Collective::kAllReduce)], 2 * 5 * 8);

  std::vector<double> top(5);
  for (std::size_t i = 0; i < top.size(); ++i) top[i] = fine_value(rank_, static_cast<int>(i));
  comm_->all_reduce(std::span<double>(top), ReduceOp::kMax);
  for (std::size_t i = 0; i < top.size(); ++i) {
    EXPECT_EQ(top[i], fine_value(size_ - 1, static_cast<std::int64_t>(i))) << "element " << i;
  }

  // The ring (the default) and MPI's own reduce-scatter.
  for (const detail::ReduceScatterAlgorithm algorithm :
       {detail::ReduceScatterAlgorithm::kRing, detail::ReduceScatterAlgorithm::kMpi}) {
    const std::unique_ptr<Communicator> comm = detail::make_mpi_communicator(
        {.max_elements_per_call = GetParam(), .reduce_scatter = algorithm});
    std::vector<double> input(static_cast<std::size_t>(total));
    for (std::size_t j = 0; j < input.size(); ++j) {
      input[j] = fine_value(rank_, static_cast<std::int64_t>(j));
    }
    std::vector<double> output(static_cast<std::size_t>(counts[mine]), -1.0);
    comm->reduce_scatter(input, output, counts);
    for (std::size_t k = 0; k < output.size(); ++k) {
      EXPECT_EQ(output[k], fine_sum(size_, offsets[mine] + static_cast<std::int64_t>(k)))
          << "element " << k
          << (algorithm == detail::ReduceScatterAlgorithm::kRing ? " (ring)" : "");
    }
  }

  std::vector<double> gathered(static_cast<std::size_t>(total), -1.0);
  for (std::int64_t k = 0; k < counts[mine]; ++k) {
    gathered[static_cast<std::size_t>(offsets[mine] + k)] = fine_value(rank_, k);
  }
  comm_->all_gather(gathered, counts);
  for (int r = 0; r < size_; ++r) {
    const auto rr = static_cast<std::size_t>(r);
    for (std::int64_t k = 0; k < counts[rr]; ++k) {
      EXPECT_EQ(gathered[static_cast<std::size_t>(offsets[rr] + k)], fine_value(r, k));
    }
  }

  std::vector<double> root_value(3);
  for (std::size_t i = 0; i < root_value.size(); ++i) {
    root_value[i] = fine_value(rank_, static_cast<int>(i));
  }
  comm_->broadcast(root_value, size_ - 1);
  for (std::size_t i = 0; i < root_value.size(); ++i) {
    EXPECT_EQ(root_value[i], fine_value(size_ - 1, static_cast<int>(i)));
  }

  std::vector<double> too_long(static_cast<std::size_t>(total + 1));
  EXPECT_THROW(comm_->all_gather(too_long, counts), UsageError);
}

TEST_P(MpiCollective, AllGatherFillsEveryRanksSliceInPlace) {
  const std::vector<std::int64_t> counts = uneven_counts(size_);
  const std::vector<std::int64_t> offsets = offsets_of(counts);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::vector<float> data(static_cast<std::size_t>(total), -1.0f);
  const auto mine = static_cast<std::size_t>(rank_);
  for (std::int64_t k = 0; k < counts[mine]; ++k) {
    data[static_cast<std::size_t>(offsets[mine] + k)] = static_cast<float>(rank_ * 100 + k);
  }

  comm_->all_gather(data.data(), counts, DType::kFloat32);

  for (int r = 0; r < size_; ++r) {
    const auto owner = static_cast<std::size_t>(r);
    for (std::int64_t k = 0; k < counts[owner]; ++k) {
      EXPECT_EQ(data[static_cast<std::size_t>(offsets[owner] + k)], static_cast<float>(r * 100 + k))
          << "rank " << r << "'s element " << k;
    }
  }
}

TEST_P(MpiCollective, BroadcastsFromTheLastRank) {
  const int root = size_ - 1;
  std::vector<float> data(8, -1.0f);
  if (rank_ == root) std::iota(data.begin(), data.end(), 0.5f);
  comm_->broadcast(data.data(), static_cast<std::int64_t>(data.size()), DType::kFloat32, root);
  for (std::size_t i = 0; i < data.size(); ++i) EXPECT_EQ(data[i], 0.5f + i) << "element " << i;
}

TEST_P(MpiCollective, OverlapsTwoCollectivesWithLocalWork) {
  std::vector<float> summed(7, static_cast<float>(rank_ + 1));
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(size_), 4);
  std::vector<float> gathered(static_cast<std::size_t>(4 * size_), -1.0f);
  std::fill_n(gathered.begin() + 4 * rank_, 4, static_cast<float>(rank_));

  Request sum = comm_->all_reduce_async(summed.data(), 7, DType::kFloat32, ReduceOp::kSum);
  Request gather = comm_->all_gather_async(gathered.data(), counts, DType::kFloat32);
  double local = 0;
  for (int i = 1; i <= 100000; ++i) local += 1.0 / i;
  gather.wait();
  sum.wait();

  EXPECT_GT(local, 12.0);
  EXPECT_FALSE(sum.pending());
  EXPECT_FALSE(gather.pending());
  for (float value : summed) EXPECT_EQ(value, static_cast<float>(size_ * (size_ + 1) / 2));
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    EXPECT_EQ(gathered[i], static_cast<float>(i / 4)) << "element " << i;
  }
}

// Quarter steps up to a few tens fit both fp16 (11-bit) and bf16 (8-bit) significands, as do
// all their partial sums, so any summation order gives the exact result.
void expect_exact_16bit_sum(Communicator& comm, DType dtype) {
  constexpr std::size_t kCount = 11;
  std::vector<float> values(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    values[i] = 0.25f * static_cast<float>(i % 8) + static_cast<float>(comm.rank()) - 1.0f;
  }
  std::vector<std::uint16_t> data(kCount);
  detail::convert_from_float(values.data(), data.data(), dtype, kCount);

  comm.all_reduce(data.data(), kCount, dtype);

  std::vector<float> result(kCount);
  detail::convert_to_float(data.data(), dtype, result.data(), kCount);
  const int n = comm.size();
  for (std::size_t i = 0; i < kCount; ++i) {
    const float expected =
        n * (0.25f * static_cast<float>(i % 8) - 1.0f) + static_cast<float>(n * (n - 1) / 2);
    EXPECT_EQ(result[i], expected) << to_string(dtype) << " element " << i;
  }
}

TEST_P(MpiCollective, SumsFp16Exactly) { expect_exact_16bit_sum(*comm_, DType::kFloat16); }
TEST_P(MpiCollective, SumsBf16Exactly) { expect_exact_16bit_sum(*comm_, DType::kBFloat16); }

TEST_P(MpiCollective, TakesMaxOf16BitValuesAndReduceScattersThem) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> values(static_cast<std::size_t>(2 * size_));
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<float>((rank_ + static_cast<int>(i)) % size_) - 0.5f;
    }
    std::vector<std::uint16_t> data(values.size());
    detail::convert_from_float(values.data(), data.data(), dtype, std::ssize(values));
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(size_), 2);
    std::vector<std::uint16_t> slice(2);

    comm_->reduce_scatter(data.data(), slice.data(), counts, dtype, ReduceOp::kMax);

    // Every position sees every value 0..size-1 once over the ranks.
    for (std::uint16_t bits : slice) {
      float got = 0;
      detail::convert_to_float(&bits, dtype, &got, 1);
      EXPECT_EQ(got, static_cast<float>(size_ - 1) - 0.5f) << to_string(dtype);
    }
  }
}

TEST_P(MpiCollective, CountsTrafficByTheConvention) {
  const std::vector<std::int64_t> counts = uneven_counts(size_);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  // Large enough for the all-reduce of 6 even where the slices add up to less (np 1 and 2).
  std::vector<std::uint16_t> buffer(static_cast<std::size_t>(std::max<std::int64_t>(total, 6)));
  std::vector<std::uint16_t> slice(
      static_cast<std::size_t>(counts[static_cast<std::size_t>(rank_)]));

  comm_->all_reduce(buffer.data(), 6, DType::kBFloat16);
  comm_->all_reduce(buffer.data(), 4, DType::kFloat16);
  comm_->reduce_scatter(buffer.data(), slice.data(), counts, DType::kFloat16);
  comm_->all_gather(buffer.data(), counts, DType::kBFloat16);
  comm_->broadcast(buffer.data(), 5, DType::kFloat16, 0);
  comm_->barrier();

  const TrafficCounters& traffic = comm_->traffic();
  const auto at = [](Collective c) { return static_cast<std::size_t>(c); };
  EXPECT_EQ(traffic.elements[at(Collective::kAllReduce)], 2 * 6 + 2 * 4);
  EXPECT_EQ(traffic.calls[at(Collective::kAllReduce)], 2);
  EXPECT_EQ(traffic.elements[at(Collective::kReduceScatter)], total);
  EXPECT_EQ(traffic.elements[at(Collective::kAllGather)], total);
  EXPECT_EQ(traffic.elements[at(Collective::kBroadcast)], 5);
  EXPECT_EQ(traffic.elements[at(Collective::kBarrier)], 0);
  EXPECT_EQ(traffic.calls[at(Collective::kBarrier)], 1);
  EXPECT_EQ(traffic.total_elements(), 20 + 2 * total + 5);
  EXPECT_EQ(traffic.total_bytes(), 2 * traffic.total_elements());

  comm_->reset_traffic();
  EXPECT_EQ(comm_->traffic().total_elements(), 0);
}

TEST_P(MpiCollective, DroppedRequestCompletesBeforeItsDestructorReturns) {
  std::vector<float> data(6, 1.0f);
  { Request dropped = comm_->all_reduce_async(data.data(), 6, DType::kFloat32, ReduceOp::kSum); }
  for (float value : data) EXPECT_EQ(value, static_cast<float>(size_));

  std::vector<float> first(5, 1.0f);
  std::vector<float> second(5, 2.0f);
  Request request = comm_->all_reduce_async(first.data(), 5, DType::kFloat32, ReduceOp::kSum);
  request = comm_->all_reduce_async(second.data(), 5, DType::kFloat32, ReduceOp::kSum);
  // The assignment waited for the first reduction before taking over the second.
  for (float value : first) EXPECT_EQ(value, static_cast<float>(size_));
  request.wait();
  for (float value : second) EXPECT_EQ(value, static_cast<float>(2 * size_));
}

TEST_P(MpiCollective, RejectsCountsThatDoNotMatchTheWorld) {
  std::vector<float> data(8);
  const std::vector<std::int64_t> too_many(static_cast<std::size_t>(size_ + 1), 1);
  EXPECT_THROW(comm_->all_gather(data.data(), too_many, DType::kFloat32), UsageError);
  EXPECT_THROW(comm_->broadcast(data.data(), 8, DType::kFloat32, size_), UsageError);
  EXPECT_EQ(comm_->traffic().total_elements(), 0);
}

// What rank `from` sends rank `to` in the all-to-all tests: uneven, some blocks empty.
std::int64_t block_count(int from, int to) { return (from + 2 * to) % 4 + (from == to ? 1 : 0); }
float block_value(int from, int to, std::int64_t k) {
  return static_cast<float>(from * 1000 + to * 100) + static_cast<float>(k);
}

TEST_P(MpiCollective, AllToAllDeliversEveryRanksBlockInRankOrder) {
  std::vector<std::int64_t> sends(static_cast<std::size_t>(size_));
  std::vector<std::int64_t> receives(static_cast<std::size_t>(size_));
  std::vector<float> input;
  for (int to = 0; to < size_; ++to) {
    sends[static_cast<std::size_t>(to)] = block_count(rank_, to);
    receives[static_cast<std::size_t>(to)] = block_count(to, rank_);
    for (std::int64_t k = 0; k < block_count(rank_, to); ++k) {
      input.push_back(block_value(rank_, to, k));
    }
  }
  const std::int64_t received = std::accumulate(receives.begin(), receives.end(), std::int64_t{0});
  std::vector<float> output(static_cast<std::size_t>(received), -1.0f);

  comm_->all_to_all(input.data(), sends, output.data(), receives, DType::kFloat32);

  std::size_t at = 0;
  for (int from = 0; from < size_; ++from) {
    for (std::int64_t k = 0; k < block_count(from, rank_); ++k, ++at) {
      EXPECT_EQ(output[at], block_value(from, rank_, k)) << "element " << k << " from " << from;
    }
  }
  const std::int64_t to_others =
      static_cast<std::int64_t>(input.size()) - block_count(rank_, rank_);
  EXPECT_EQ(comm_->traffic().elements[static_cast<std::size_t>(Collective::kAllToAll)], to_others);
  EXPECT_EQ(comm_->traffic().bytes[static_cast<std::size_t>(Collective::kAllToAll)], 4 * to_others);
}

TEST_P(MpiCollective, AllToAllRejectsOverlappingBuffersAndAMismatchedOwnBlock) {
  std::vector<float> data(64);
  const std::vector<std::int64_t> twos(static_cast<std::size_t>(size_), 2);
  EXPECT_THROW(comm_->all_to_all(data.data(), twos, data.data() + 1, twos, DType::kFloat32),
               UsageError);
  std::vector<std::int64_t> more = twos;
  more[static_cast<std::size_t>(rank_)] = 3;
  std::vector<float> out(64);
  EXPECT_THROW(comm_->all_to_all(data.data(), twos, out.data(), more, DType::kFloat32), UsageError);
}

INSTANTIATE_TEST_SUITE_P(OneMpiCallOrSplit, MpiCollective, ::testing::Values(INT_MAX, 3),
                         [](const ::testing::TestParamInfo<std::int64_t>& info) {
                           return info.param == INT_MAX ? std::string("OneCall")
                                                        : std::string("SplitInto3ElementCalls");
                         });

TEST(MpiCommunicator, FromEnvironmentIsMpiOverTheLaunchersWorld) {
  const std::unique_ptr<Communicator> comm = Communicator::from_environment();
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->size(), launcher_world_size());
  EXPECT_GE(comm->rank(), 0);
  EXPECT_LT(comm->rank(), comm->size());
}

TEST(MpiCommunicator, WaitOnADeadPeerTimesOutNamingSequenceCollectiveCountAndSilentRank) {
  // Rank 0 waits with a short deadline for a broadcast that rank 1 joins only after rank 0 gave
  // up. Rank 0 then keeps making MPI progress (the second world barrier) so that the broadcast,
  // which it abandoned, still reaches the ranks it forwards to.
  using std::chrono::duration;
  const auto world = detail::make_mpi_communicator({});
  if (world->size() < 2) GTEST_SKIP() << "needs a second rank to play the dead peer";
  const int rank = world->rank();
  const auto comm = detail::make_mpi_communicator(
      {.timeout = rank == 0 ? duration<double>(0.2) : duration<double>(60)});
  std::vector<float> data(5, rank == 1 ? 7.0f : 0.0f);

  if (rank == 0) {
    Request request = comm->broadcast_async(data.data(), 5, DType::kFloat32, 1);
    try {
      request.wait();
      ADD_FAILURE() << "the broadcast finished although its root had not joined";
    } catch (const TimeoutError& error) {
      EXPECT_EQ(error.code(), ErrorCode::kTimeout);
      EXPECT_THAT(error.what(),
                  HasSubstr("collective #1 broadcast of 5 fp32 elements on rank 0 of"));
      EXPECT_THAT(error.what(), HasSubstr("ZEROSHARD_COLLECTIVE_TIMEOUT_S"));
      // Rank 1 waits in another communicator's barrier, so it cannot answer on this one.
      EXPECT_THAT(error.what(), HasSubstr("rank 1: no answer"));
      EXPECT_THAT(error.what(), HasSubstr("Behind or missing: rank 1"));
    }
    EXPECT_TRUE(request.pending());
    EXPECT_THROW(request.wait(), TimeoutError) << "a timed-out communicator must not wait again";
    world->barrier();
  } else {
    world->barrier();
    comm->broadcast(data.data(), 5, DType::kFloat32, 1);
    for (float value : data) EXPECT_EQ(value, 7.0f);
  }
  world->barrier();
}

TEST(MpiCommunicator, AfterATimeoutTheOtherRequestsInFlightFailAtOnce) {
  // Three requests in flight while rank 1 does not take part: the first wait times out, the other
  // two must fail at once pointing at it, so the error comes within one timeout, not three.
  using Clock = std::chrono::steady_clock;
  using std::chrono::duration;
  const auto world = detail::make_mpi_communicator({});
  if (world->size() < 2) GTEST_SKIP() << "needs a second rank to stop taking part";
  const int rank = world->rank();
  constexpr double kTimeout = 2.0;
  const auto comm = detail::make_mpi_communicator({.timeout = duration<double>(kTimeout)});
  std::vector<std::vector<float>> buffers(3, std::vector<float>(4, 1.0f));

  if (rank == 0) {
    const Clock::time_point start = Clock::now();
    std::vector<Request> requests;
    for (auto& buffer : buffers) {
      requests.push_back(comm->all_reduce_async(buffer.data(), 4, DType::kFloat32, ReduceOp::kSum));
    }
    std::vector<std::string> messages;
    std::vector<double> waited;
    for (Request& request : requests) {
      const Clock::time_point before = Clock::now();
      try {
        request.wait();
        ADD_FAILURE() << "an all-reduce finished although rank 1 never joined";
      } catch (const TimeoutError& error) {
        messages.push_back(error.what());
      }
      waited.push_back(duration<double>(Clock::now() - before).count());
    }
    const double total = duration<double>(Clock::now() - start).count();
    ASSERT_EQ(messages.size(), 3u);
    EXPECT_THAT(messages[0], HasSubstr("collective #1 all-reduce of 4 fp32 elements"));
    for (int i = 1; i < 3; ++i) {
      EXPECT_THAT(messages[i], HasSubstr("#" + std::to_string(i + 1) + " all-reduce"));
      EXPECT_THAT(messages[i], HasSubstr("abandoned at once: an earlier timeout"));
      EXPECT_THAT(messages[i], HasSubstr("collective #1 all-reduce"));
      EXPECT_LT(waited[i], kTimeout / 2) << "request " << i + 1 << " waited a timeout of its own";
    }
    // Generous: one timeout, the side-channel question and a noisy machine, but not two timeouts.
    EXPECT_LT(total, 2 * kTimeout) << "the error took " << total << " s";
    EXPECT_THROW(comm->barrier(), TimeoutError) << "new collectives must fail at once too";
    world->barrier();
  } else {
    world->barrier();
    for (auto& buffer : buffers) comm->all_reduce(buffer.data(), 4, DType::kFloat32);
  }
  // Rank 0 keeps MPI progressing here, so that the all-reduces it abandoned complete elsewhere.
  world->barrier();
}

}  // namespace
}  // namespace zeroshard

namespace zeroshard {
namespace {

TEST(CommunicatorText, EveryRanksTextArrivesInRankOrder) {
  auto comm = Communicator::from_environment();
  // Odd and even lengths, and an empty text, exercise the two-bytes-per-element packing.
  const std::string mine =
      comm->rank() == 1 ? "" : std::string(comm->rank() + 3, 'a' + comm->rank());
  const std::vector<std::string> texts = comm->all_gather_text(mine);
  ASSERT_EQ(static_cast<int>(texts.size()), comm->size());
  for (int r = 0; r < comm->size(); ++r) {
    EXPECT_EQ(texts[r], r == 1 ? "" : std::string(r + 3, 'a' + r)) << "rank " << r;
  }
}

// Lengths past 2^24 lose their low bits in a float: the gather must carry them exactly (an odd
// length rounded up once made the copy write past its buffer).
TEST(CommunicatorText, TextsLongerThanFloatsCountArriveWhole) {
  auto comm = Communicator::from_environment();
  const std::size_t length =
      (std::size_t{1} << 24) + 1 + 2 * static_cast<std::size_t>(comm->rank());
  std::string mine(length, static_cast<char>('a' + comm->rank()));
  mine.back() = '!';
  const std::vector<std::string> texts = comm->all_gather_text(mine);
  ASSERT_EQ(static_cast<int>(texts.size()), comm->size());
  for (int r = 0; r < comm->size(); ++r) {
    const std::size_t expected = (std::size_t{1} << 24) + 1 + 2 * static_cast<std::size_t>(r);
    ASSERT_EQ(texts[r].size(), expected) << "rank " << r;
    EXPECT_EQ(texts[r].back(), '!') << "rank " << r;
    EXPECT_EQ(texts[r].find_first_not_of(static_cast<char>('a' + r)), expected - 1) << "rank " << r;
  }
}

TEST(CommunicatorText, EmptyTextsOnEveryRankGiveEmptyTexts) {
  auto comm = Communicator::from_environment();
  const std::vector<std::string> texts = comm->all_gather_text("");
  ASSERT_EQ(static_cast<int>(texts.size()), comm->size());
  for (const std::string& text : texts) EXPECT_TRUE(text.empty());
}

}  // namespace
}  // namespace zeroshard

namespace zeroshard {
namespace {

TEST(CommunicatorSplit, RanksOfAColorFormACommunicatorOrderedByKey) {
  const std::unique_ptr<Communicator> world = Communicator::from_environment();
  const int rank = world->rank();
  const int size = world->size();
  // Odd and even ranks apart, each group ranked from its highest world rank down.
  const std::unique_ptr<Communicator> group = world->split(rank % 2, -rank);
  int members = 0;
  int above = 0;
  for (int r = rank % 2; r < size; r += 2) {
    ++members;
    if (r > rank) ++above;
  }
  EXPECT_EQ(group->backend(), "mpi");
  EXPECT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), above);
  std::vector<float> value{static_cast<float>(rank)};
  group->all_reduce(value);
  float expected = 0;
  for (int r = rank % 2; r < size; r += 2) expected += static_cast<float>(r);
  EXPECT_EQ(value[0], expected);
  // The world still works, and its messages do not mix with the group's.
  std::vector<float> one{1.0f};
  world->all_reduce(one);
  EXPECT_EQ(one[0], static_cast<float>(size));
  EXPECT_THROW(world->split(-1, 0), UsageError);
}

// Pretends ranks 2h and 2h+1 share host h.
class PairedHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = Communicator::from_environment();
    const std::string host = "host" + std::to_string(world_->rank() / 2);
    setenv("ZEROSHARD_HOST_NAME", host.c_str(), 1);
  }
  void TearDown() override { unsetenv("ZEROSHARD_HOST_NAME"); }
  std::unique_ptr<Communicator> world_;
};

TEST_F(PairedHosts, NodeGroupsHoldTheRanksOfOneHost) {
  const int size = world_->size();
  if (size % 2 != 0) {
    // A host with one rank cannot hold a group of two.
    EXPECT_THROW(detail::make_node_groups(*world_, 2, "zero_optimization.zero_hpz_partition_size"),
                 ConfigError);
    return;
  }
  const detail::NodeGroups groups =
      detail::make_node_groups(*world_, 2, "zero_optimization.zero_hpz_partition_size");
  const int rank = world_->rank();
  EXPECT_EQ(groups.group_size, 2);
  EXPECT_EQ(groups.group_count, size / 2);
  EXPECT_EQ(groups.group, rank / 2);
  EXPECT_EQ(groups.index, rank % 2);
  for (int g = 0; g < groups.group_count; ++g) {
    EXPECT_EQ(groups.members[g], (std::vector<int>{2 * g, 2 * g + 1}));
  }
  EXPECT_EQ(groups.within->size(), 2);
  EXPECT_EQ(groups.within->rank(), rank % 2);
  EXPECT_EQ(groups.across->size(), size / 2);
  EXPECT_EQ(groups.across->rank(), rank / 2);
  std::vector<float> value{static_cast<float>(rank)};
  groups.within->all_reduce(value);
  EXPECT_EQ(value[0], static_cast<float>(rank / 2 * 4 + 1));
}

TEST_F(PairedHosts, AGroupLargerThanAHostIsRefusedNamingTheKeyAndTheHost) {
  try {
    detail::make_node_groups(*world_, 3, "zero_optimization.zero_hpz_partition_size");
    ADD_FAILURE() << "groups of 3 on hosts of 2 were accepted";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), HasSubstr("zero_optimization.zero_hpz_partition_size"));
    EXPECT_THAT(error.what(), HasSubstr("host 'host0'"));
  }
  const detail::NodeGroups single =
      detail::make_node_groups(*world_, 1, "zero_optimization.zero_hpz_partition_size");
  EXPECT_EQ(single.within->size(), 1);
  EXPECT_EQ(single.across->size(), world_->size());
}

TEST_F(PairedHosts, GroupSizeZeroGroupsEveryRankOfAHost) {
  const int size = world_->size();
  const char* key = "zero_optimization.zero_quantized_gradients";
  if (size > 1 && size % 2 != 0) {
    // The last host runs one rank where the others run two.
    try {
      detail::make_node_groups(*world_, 0, key);
      ADD_FAILURE() << "hosts of 2 and 1 ranks were accepted";
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key_path(), key);
      EXPECT_THAT(error.what(), HasSubstr("host 'host" + std::to_string(size / 2) + "' runs 1"));
    }
    return;
  }
  const detail::NodeGroups groups = detail::make_node_groups(*world_, 0, key);
  const int per_host = std::min(size, 2);
  EXPECT_EQ(groups.group_size, per_host);
  EXPECT_EQ(groups.group_count, size / per_host);
  EXPECT_EQ(groups.group, world_->rank() / per_host);
  EXPECT_EQ(groups.within->size(), per_host);
  EXPECT_EQ(groups.across->size(), size / per_host);
}

}  // namespace
}  // namespace zeroshard
