// The ring reduce-scatter under 1..4 ranks: bit for bit the host reference summed in the ring's
// order for every dtype and op, within rounding of MPI's own reduce-scatter, in place the same
// bits as apart (ring and MPI's), and a rank that never joins still ends the wait within one
// timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "precision/half_conversion.h"
#include "zeroshard/communicator.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;

// Slices of several messages whose last one is short, and empty slices (every odd rank): large
// ones cross the 1 MiB chunk, small ones the chunk that max_elements_per_call forces.
std::vector<std::int64_t> slice_counts(int size, bool large) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::int64_t even = large ? 600011 - 1000 * r : 3 * r + 17;
    counts[static_cast<std::size_t>(r)] = r % 2 == 1 ? 0 : even;
  }
  return counts;
}

// Values of mixed sign and magnitude, so that the order of a sum shows in its rounding.
float input_value(int rank, std::int64_t j) {
  const std::uint32_t h = static_cast<std::uint32_t>(rank * 2654435761u) ^
                          static_cast<std::uint32_t>(j * 40503u + 12345u);
  return static_cast<float>(static_cast<int>(h % 20001u) - 10000) / 997.0f *
         static_cast<float>(1 + h % 7u);
}

bool has_nan(int rank, std::int64_t j, int size) { return j % 17 == 5 && j % size == rank; }

std::vector<std::uint8_t> input_bytes(int rank, int size, std::int64_t total, DType dtype,
                                      ReduceOp op) {
  std::vector<float> values(static_cast<std::size_t>(total));
  for (std::int64_t j = 0; j < total; ++j) {
    const bool nan = op == ReduceOp::kMax && has_nan(rank, j, size);
    values[static_cast<std::size_t>(j)] =
        nan ? std::numeric_limits<float>::quiet_NaN() : input_value(rank, j);
  }
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(total) * size_of(dtype));
  detail::convert_from_float(values.data(), bytes.data(), dtype, total);
  return bytes;
}

float to_float(const std::uint8_t* element, DType dtype) {
  std::uint16_t bits = 0;
  switch (dtype) {
    case DType::kFloat32: {
      float value = 0;
      std::memcpy(&value, element, sizeof value);
      return value;
    }
    case DType::kFloat16:
      std::memcpy(&bits, element, sizeof bits);
      return detail::half_to_float(bits);
    case DType::kBFloat16:
      std::memcpy(&bits, element, sizeof bits);
      return detail::bfloat16_to_float(bits);
    case DType::kFloat64: {
      double value = 0;
      std::memcpy(&value, element, sizeof value);
      return static_cast<float>(value);
    }
  }
  return 0;
}

// Rounds to the dtype and back, as the ring does each time it forwards a partial result.
float round_to(float value, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
      return value;
    case DType::kFloat16:
      return detail::half_to_float(detail::float_to_half(value));
    case DType::kBFloat16:
      return detail::bfloat16_to_float(detail::float_to_bfloat16(value));
  }
  return value;
}

// Slice b in the ring's order: x[b+1], then x[b+2], ..., x[b] (ranks mod N), each new x on the
// left of the operation, written out here without the library's reduction.
float ring_reference(int slice, std::int64_t j, int size, DType dtype, ReduceOp op) {
  const auto x = [&](int rank) {
    const bool nan = op == ReduceOp::kMax && has_nan(rank, j, size);
    return round_to(nan ? std::numeric_limits<float>::quiet_NaN() : input_value(rank, j), dtype);
  };
  float partial = x((slice + 1) % size);
  for (int k = 2; k <= size; ++k) {
    const float next = x((slice + k) % size);
    const float reduced = op == ReduceOp::kSum                   ? next + partial
                          : (next > partial || std::isnan(next)) ? next
                                                                 : partial;
    partial = round_to(reduced, dtype);
  }
  return partial;
}

struct Scattered {
  std::vector<std::int64_t> counts;
  std::vector<std::int64_t> offsets;
  std::vector<std::uint8_t> output;
};

Scattered reduce_scatter(Communicator& comm, bool large, DType dtype, ReduceOp op) {
  Scattered run;
  run.counts = slice_counts(comm.size(), large);
  run.offsets.resize(run.counts.size());
  std::exclusive_scan(run.counts.begin(), run.counts.end(), run.offsets.begin(), std::int64_t{0});
  const std::int64_t total = std::accumulate(run.counts.begin(), run.counts.end(), std::int64_t{0});
  const std::vector<std::uint8_t> input = input_bytes(comm.rank(), comm.size(), total, dtype, op);
  const auto mine = static_cast<std::size_t>(run.counts[static_cast<std::size_t>(comm.rank())]);
  run.output.assign(mine * size_of(dtype), 0xA5);
  comm.reduce_scatter(input.data(), run.output.data(), run.counts, dtype, op);
  return run;
}

struct RingCase {
  std::int64_t max_elements_per_call;
  bool large;
};

class RingReduceScatter : public ::testing::TestWithParam<RingCase> {
 protected:
  std::unique_ptr<Communicator> make(detail::ReduceScatterAlgorithm algorithm) const {
    return detail::make_mpi_communicator(
        {.max_elements_per_call = GetParam().max_elements_per_call, .reduce_scatter = algorithm});
  }
};

TEST_P(RingReduceScatter, EqualsTheHostReferenceInRingOrderBitForBit) {
  const auto comm = make(detail::ReduceScatterAlgorithm::kRing);
  const int rank = comm->rank();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      const Scattered run = reduce_scatter(*comm, GetParam().large, dtype, op);
      const std::int64_t start = run.offsets[static_cast<std::size_t>(rank)];
      const auto count = static_cast<std::int64_t>(run.output.size() / size_of(dtype));
      std::int64_t mismatches = 0;
      for (std::int64_t k = 0; k < count; ++k) {
        const float got =
            to_float(&run.output[static_cast<std::size_t>(k) * size_of(dtype)], dtype);
        const float expected = ring_reference(rank, start + k, comm->size(), dtype, op);
        const bool same = std::isnan(expected) ? std::isnan(got) : got == expected;
        if (!same && ++mismatches <= 5) {
          ADD_FAILURE() << to_string(dtype) << (op == ReduceOp::kSum ? " sum" : " max")
                        << " element " << start + k << ": got " << got << ", expected " << expected;
        }
      }
      EXPECT_EQ(mismatches, 0) << to_string(dtype) << (op == ReduceOp::kSum ? " sum" : " max");
    }
  }
}

TEST_P(RingReduceScatter, EqualsMpisOwnReduceScatterWithinRounding) {
  const auto ring = make(detail::ReduceScatterAlgorithm::kRing);
  const auto mpi = make(detail::ReduceScatterAlgorithm::kMpi);
  const int n = ring->size();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    // One rounding per partial sum: at most N-1 of them, each within half an ulp of the sum of
    // magnitudes (values stay below 71 in magnitude).
    const double ulp = dtype == DType::kFloat32   ? std::ldexp(1.0, -23)
                       : dtype == DType::kFloat16 ? std::ldexp(1.0, -10)
                                                  : std::ldexp(1.0, -7);
    const double tolerance = 2.0 * n * ulp * 71.0 * n;
    // Only sums: max has no rounding, and fp32 MPI_MAX treats NaN its own way.
    const Scattered a = reduce_scatter(*ring, GetParam().large, dtype, ReduceOp::kSum);
    const Scattered b = reduce_scatter(*mpi, GetParam().large, dtype, ReduceOp::kSum);
    ASSERT_EQ(a.output.size(), b.output.size());
    for (std::size_t k = 0; k < a.output.size() / size_of(dtype); ++k) {
      const float x = to_float(&a.output[k * size_of(dtype)], dtype);
      const float y = to_float(&b.output[k * size_of(dtype)], dtype);
      ASSERT_NEAR(x, y, tolerance) << to_string(dtype) << " element " << k;
    }
  }
}

// Reduces in place on the ranks `in_place` picks, apart on the others; returns this rank's slice
// and checks that the rest of its input is as it was.
std::vector<std::uint8_t> reduce_scatter_in_place(Communicator& comm, bool large, DType dtype,
                                                  ReduceOp op, bool in_place) {
  const std::vector<std::int64_t> counts = slice_counts(comm.size(), large);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  const auto rank = static_cast<std::size_t>(comm.rank());
  const std::int64_t before =
      std::accumulate(counts.begin(), counts.begin() + comm.rank(), std::int64_t{0});
  const std::size_t element = size_of(dtype);
  const std::size_t first = static_cast<std::size_t>(before) * element;
  const std::size_t bytes = static_cast<std::size_t>(counts[rank]) * element;
  const std::vector<std::uint8_t> original =
      input_bytes(comm.rank(), comm.size(), total, dtype, op);
  if (!in_place) {
    std::vector<std::uint8_t> output(bytes, 0xA5);
    comm.reduce_scatter(original.data(), output.data(), counts, dtype, op);
    return output;
  }
  std::vector<std::uint8_t> data = original;
  comm.reduce_scatter(data.data(), data.data() + first, counts, dtype, op);
  EXPECT_EQ(std::memcmp(data.data(), original.data(), first), 0) << "input before the slice";
  EXPECT_EQ(std::memcmp(data.data() + first + bytes, original.data() + first + bytes,
                        data.size() - first - bytes),
            0)
      << "input after the slice";
  return {data.begin() + static_cast<std::ptrdiff_t>(first),
          data.begin() + static_cast<std::ptrdiff_t>(first + bytes)};
}

TEST_P(RingReduceScatter, InPlaceGivesTheSameBitsAsApartOnEveryRankOrSome) {
  for (const auto algorithm :
       {detail::ReduceScatterAlgorithm::kRing, detail::ReduceScatterAlgorithm::kMpi}) {
    const auto comm = make(algorithm);
    const char* name = algorithm == detail::ReduceScatterAlgorithm::kRing ? "ring" : "mpi";
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const std::vector<std::uint8_t> apart =
            reduce_scatter_in_place(*comm, GetParam().large, dtype, op, false);
        // Every rank in place, then only the even ranks (which own the non-empty slices) and
        // then only the odd ones: each rank decides for itself.
        for (int mode = 0; mode < 3; ++mode) {
          const bool in_place = mode == 0 || comm->rank() % 2 == mode - 1;
          const std::vector<std::uint8_t> got =
              reduce_scatter_in_place(*comm, GetParam().large, dtype, op, in_place);
          EXPECT_TRUE(got == apart)
              << name << " " << to_string(dtype) << (op == ReduceOp::kSum ? " sum" : " max")
              << ", mode " << mode << ", rank " << comm->rank();
        }
      }
    }
  }
}

TEST(ReduceScatterInPlace, AnOutputOverlappingTheInputElsewhereIsRefused) {
  const auto comm = detail::make_mpi_communicator({});
  const int n = comm->size();
  // Equal slices, so that every rank's output overlaps and every rank refuses before any call.
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 4);
  std::vector<float> data(static_cast<std::size_t>(4 * n) + 1, 1.0f);
  float* own = data.data() + 4 * comm->rank();
  try {
    comm->reduce_scatter(data.data(), own + 1, counts, DType::kFloat32);
    ADD_FAILURE() << "an output one element past this rank's slice was accepted";
  } catch (const UsageError& error) {
    EXPECT_THAT(error.what(), HasSubstr("output overlaps input but is not this rank's own slice"));
  }
  comm->barrier();
}

INSTANTIATE_TEST_SUITE_P(ChunkedAt1MiBOrAFewElements, RingReduceScatter,
                         ::testing::Values(RingCase{INT_MAX, true}, RingCase{3, false},
                                           RingCase{8, false}),
                         [](const ::testing::TestParamInfo<RingCase>& info) {
                           return info.param.large
                                      ? std::string("OneMiBChunks")
                                      : "Chunks" + std::to_string(info.param.max_elements_per_call);
                         });

TEST(RingReduceScatterProgress, CompletesWhenRanksWaitOnTheirRingsInOppositeOrders) {
  // A ring moves only when its rank polls; waiting on one request must advance the other ring
  // too, or even ranks (waiting on the first) and odd ranks (on the second) would starve each
  // other. Many chunks per slice keep both rings in flight for a while.
  // Starved rings would time out, not hang the suite.
  const auto comm = detail::make_mpi_communicator(
      {.timeout = std::chrono::duration<double>(30), .max_elements_per_call = 5});
  const int n = comm->size();
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 101);
  const std::vector<float> first(static_cast<std::size_t>(101 * n), 1.0f);
  const std::vector<float> second(static_cast<std::size_t>(101 * n), 2.0f);
  std::vector<float> first_out(101);
  std::vector<float> second_out(101);
  Request a = comm->reduce_scatter_async(first.data(), first_out.data(), counts, DType::kFloat32,
                                         ReduceOp::kSum);
  Request b = comm->reduce_scatter_async(second.data(), second_out.data(), counts, DType::kFloat32,
                                         ReduceOp::kSum);
  if (comm->rank() % 2 == 0) {
    a.wait();
    b.wait();
  } else {
    b.wait();
    a.wait();
  }
  for (float value : first_out) EXPECT_EQ(value, static_cast<float>(n));
  for (float value : second_out) EXPECT_EQ(value, static_cast<float>(2 * n));
}

TEST(ReduceScatterAlgorithm, ComesFromTheEnvironmentAndDefaultsToTheRing) {
  const char* before = std::getenv("ZEROSHARD_REDUCE_SCATTER");
  const std::string saved = before ? before : "";
  unsetenv("ZEROSHARD_REDUCE_SCATTER");
  EXPECT_EQ(detail::reduce_scatter_algorithm_from_environment(),
            detail::ReduceScatterAlgorithm::kRing);
  setenv("ZEROSHARD_REDUCE_SCATTER", "mpi", 1);
  EXPECT_EQ(detail::reduce_scatter_algorithm_from_environment(),
            detail::ReduceScatterAlgorithm::kMpi);
  setenv("ZEROSHARD_REDUCE_SCATTER", "ring", 1);
  EXPECT_EQ(detail::reduce_scatter_algorithm_from_environment(),
            detail::ReduceScatterAlgorithm::kRing);
  setenv("ZEROSHARD_REDUCE_SCATTER", "tree", 1);
  try {
    detail::reduce_scatter_algorithm_from_environment();
    ADD_FAILURE() << "'tree' was accepted";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), HasSubstr("ZEROSHARD_REDUCE_SCATTER"));
    EXPECT_THAT(error.what(), HasSubstr("got 'tree', expected 'ring' or 'mpi'"));
  }
  if (before) {
    setenv("ZEROSHARD_REDUCE_SCATTER", saved.c_str(), 1);
  } else {
    unsetenv("ZEROSHARD_REDUCE_SCATTER");
  }
}

TEST(RingReduceScatterTimeout, ARankThatNeverJoinsEndsEveryWaitWithinOneTimeout) {
  // The last rank makes the communicator but never joins the two reduce-scatters: every slice's
  // ring passes through it, so every other rank must time out on the first and fail the second
  // at once. Both are abandoned; the messages left unmatched are a few bytes each.
  using Clock = std::chrono::steady_clock;
  using std::chrono::duration;
  const auto world = detail::make_mpi_communicator({});
  if (world->size() < 2) GTEST_SKIP() << "needs a second rank to stop taking part";
  constexpr double kTimeout = 1.0;
  const auto comm = detail::make_mpi_communicator({.timeout = duration<double>(kTimeout)});
  const int silent = comm->size() - 1;
  if (comm->rank() != silent) {
    const std::vector<std::int64_t> counts(static_cast<std::size_t>(comm->size()), 4);
    const std::vector<float> input(static_cast<std::size_t>(4 * comm->size()), 1.0f);
    std::vector<std::vector<float>> outputs(2, std::vector<float>(4));
    const Clock::time_point start = Clock::now();
    std::vector<Request> requests;
    for (auto& output : outputs) {
      requests.push_back(comm->reduce_scatter_async(input.data(), output.data(), counts,
                                                    DType::kFloat32, ReduceOp::kSum));
    }
    std::vector<std::string> messages;
    for (Request& request : requests) {
      try {
        request.wait();
        ADD_FAILURE() << "a reduce-scatter finished although rank " << silent << " never joined";
      } catch (const TimeoutError& error) {
        messages.push_back(error.what());
      }
    }
    const double total = duration<double>(Clock::now() - start).count();
    ASSERT_EQ(messages.size(), 2u);
    EXPECT_THAT(messages[0], HasSubstr("collective #1 reduce-scatter of " +
                                       std::to_string(4 * comm->size()) + " fp32 elements"));
    EXPECT_THAT(messages[1], HasSubstr("abandoned at once: an earlier timeout"));
    EXPECT_LT(total, 1.75 * kTimeout) << "the errors took " << total << " s";
  }
  world->barrier();
}

}  // namespace
}  // namespace zeroshard
