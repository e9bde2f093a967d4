// The communicator without a launcher (a world of one, no MPI), request semantics with a fake
// transport, traffic counters, names, and the collective timeout setting.
#include "zeroshard/communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Communicator> communicator_without_launcher() {
  for (const char* name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS", "SLURM_PROCID"}) {
    unsetenv(name);
  }
  return Communicator::from_environment();
}

std::size_t at(Collective collective) { return static_cast<std::size_t>(collective); }

TEST(SelfCommunicator, IsAWorldOfOneWithoutALauncher) {
  const auto comm = communicator_without_launcher();
  EXPECT_EQ(comm->backend(), "self");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
}

TEST(SelfCommunicator, AllReduceIsTheIdentityAndCountsTwiceItsElements) {
  const auto comm = communicator_without_launcher();
  std::vector<float> data = {1.5f, -2.0f, 3.25f};
  comm->all_reduce(data.data(), 3, DType::kFloat32, ReduceOp::kSum);
  comm->all_reduce(data.data(), 3, DType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(comm->traffic().elements[at(Collective::kAllReduce)], 12);
  EXPECT_EQ(comm->traffic().bytes[at(Collective::kAllReduce)], 48);
  EXPECT_EQ(comm->traffic().calls[at(Collective::kAllReduce)], 2);
}

TEST(SelfCommunicator, AllGatherLeavesDataAsItIsAndCountsIt) {
  const auto comm = communicator_without_launcher();
  std::vector<std::uint16_t> data = {1, 2, 3, 4};
  const std::vector<std::int64_t> counts = {4};
  Request request = comm->all_gather_async(data.data(), counts, DType::kBFloat16);
  EXPECT_FALSE(request.pending());
  request.wait();
  EXPECT_EQ(data, (std::vector<std::uint16_t>{1, 2, 3, 4}));
  EXPECT_EQ(comm->traffic().elements[at(Collective::kAllGather)], 4);
  EXPECT_EQ(comm->traffic().bytes[at(Collective::kAllGather)], 8);
}

TEST(SelfCommunicator, ReduceScatterCopiesTheWholeInputToTheOutput) {
  const auto comm = communicator_without_launcher();
  const std::vector<float> input = {1, 2, 3};
  std::vector<float> output(3);
  const std::vector<std::int64_t> counts = {3};
  comm->reduce_scatter(input.data(), output.data(), counts, DType::kFloat32);
  EXPECT_EQ(output, input);
  EXPECT_EQ(comm->traffic().elements[at(Collective::kReduceScatter)], 3);
  // In place, the input is already the result.
  comm->reduce_scatter(output.data(), output.data(), counts, DType::kFloat32);
  EXPECT_EQ(output, input);
}

TEST(SelfCommunicator, BroadcastAndBarrierAreCounted) {
  const auto comm = communicator_without_launcher();
  std::vector<float> data(5, 1.0f);
  comm->broadcast(data.data(), 5, DType::kFloat32, 0);
  comm->barrier();
  EXPECT_EQ(comm->traffic().elements[at(Collective::kBroadcast)], 5);
  EXPECT_EQ(comm->traffic().calls[at(Collective::kBarrier)], 1);
  EXPECT_EQ(comm->traffic().total_elements(), 5);
  EXPECT_EQ(comm->traffic().total_bytes(), 20);
  comm->reset_traffic();
  EXPECT_EQ(comm->traffic().total_bytes(), 0);
}

TEST(SelfCommunicator, RejectsArgumentsThatDoNotFitAWorldOfOne) {
  const auto comm = communicator_without_launcher();
  std::vector<float> data(4);
  const std::vector<std::int64_t> two_counts = {2, 2};
  EXPECT_THROW(comm->all_gather(data.data(), two_counts, DType::kFloat32), UsageError);
  EXPECT_THROW(comm->broadcast(data.data(), 4, DType::kFloat32, 1), UsageError);
  EXPECT_THROW(comm->all_reduce(nullptr, 4, DType::kFloat32), UsageError);
  EXPECT_THROW(comm->all_reduce(data.data(), -1, DType::kFloat32), UsageError);
  const std::vector<std::int64_t> counts = {4};
  EXPECT_THROW(comm->reduce_scatter(data.data(), data.data() + 2, counts, DType::kFloat32),
               UsageError);
  EXPECT_EQ(comm->traffic().total_elements(), 0);
}

// Records how a Request drives its transport.
struct FakeTransport {
  int waits = 0;
  int tests = 0;
  bool done = false;
  bool fail = false;
  bool destroyed = false;
};

class FakeImpl final : public Request::Impl {
 public:
  explicit FakeImpl(FakeTransport& transport) : transport_(transport) {}
  ~FakeImpl() override { transport_.destroyed = true; }
  void wait() override {
    ++transport_.waits;
    if (transport_.fail) throw TimeoutError("fake timeout");
    transport_.done = true;
  }
  bool test() override {
    ++transport_.tests;
    return transport_.done;
  }

 private:
  FakeTransport& transport_;
};

Request fake_request(FakeTransport& transport) {
  return Request(std::make_unique<FakeImpl>(transport));
}

TEST(Request, EmptyRequestIsComplete) {
  Request request;
  EXPECT_FALSE(request.pending());
  EXPECT_TRUE(request.test());
  request.wait();
}

TEST(Request, DestroyingAPendingRequestWaitsForIt) {
  FakeTransport transport;
  { Request request = fake_request(transport); }
  EXPECT_EQ(transport.waits, 1);
  EXPECT_TRUE(transport.destroyed);
}

TEST(Request, MoveAssignmentWaitsForTheRequestItReplaces) {
  FakeTransport old_transport;
  FakeTransport new_transport;
  Request request = fake_request(old_transport);
  request = fake_request(new_transport);
  EXPECT_EQ(old_transport.waits, 1);
  EXPECT_TRUE(old_transport.destroyed);
  EXPECT_EQ(new_transport.waits, 0);
  EXPECT_TRUE(request.pending());
}

TEST(Request, TestCompletesTheRequestOnceTheTransportIsDone) {
  FakeTransport transport;
  Request request = fake_request(transport);
  EXPECT_FALSE(request.test());
  EXPECT_TRUE(request.pending());
  transport.done = true;
  EXPECT_TRUE(request.test());
  EXPECT_FALSE(request.pending());
  EXPECT_TRUE(transport.destroyed);
}

TEST(Request, FailedWaitLeavesItPendingForARetry) {
  FakeTransport transport;
  transport.fail = true;
  Request request = fake_request(transport);
  EXPECT_THROW(request.wait(), TimeoutError);
  EXPECT_TRUE(request.pending());
  transport.fail = false;
  request.wait();
  EXPECT_FALSE(request.pending());
  EXPECT_EQ(transport.waits, 2);
}

TEST(Request, DestroyingAFailedRequestDoesNotWaitAgain) {
  FakeTransport transport;
  transport.fail = true;
  {
    Request request = fake_request(transport);
    EXPECT_THROW(request.wait(), TimeoutError);
  }
  EXPECT_EQ(transport.waits, 1);
  EXPECT_TRUE(transport.destroyed);
}

TEST(Request, ErrorInTheImplicitWaitIsSwallowed) {
  FakeTransport transport;
  transport.fail = true;
  { Request request = fake_request(transport); }
  EXPECT_EQ(transport.waits, 1);
  EXPECT_TRUE(transport.destroyed);
}

// A transport of fake requests, to check what the transport-independent base does with them.
class FakeCommunicator final : public Communicator {
 public:
  explicit FakeCommunicator(std::vector<FakeTransport>& transports) : transports_(transports) {}
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 2; }
  std::string backend() const override { return "fake"; }

 protected:
  Request start_all_reduce(void*, std::int64_t, DType, ReduceOp) override { return next(); }
  Request start_reduce_scatter(const void*, void*, std::span<const std::int64_t>, DType,
                               ReduceOp) override {
    return next();
  }
  Request start_all_gather(void*, std::span<const std::int64_t>, DType) override { return next(); }
  Request start_broadcast(void*, std::int64_t, DType, int) override { return next(); }
  void run_barrier() override { next().wait(); }
  [[noreturn]] void end_job(int error_code) noexcept override { std::_Exit(error_code); }

 private:
  Request next() { return fake_request(transports_.at(used_++)); }

  std::vector<FakeTransport>& transports_;
  std::size_t used_ = 0;
};

TEST(CommunicatorTimeout, NumbersTheCollectivesAndNamesTheOneThatTimedOut) {
  std::vector<FakeTransport> transports(3);
  transports[2].fail = true;
  FakeCommunicator comm(transports);
  float data[4] = {};
  comm.all_reduce(data, 4, DType::kFloat32);
  comm.broadcast(data, 2, DType::kBFloat16, 1);
  try {
    comm.all_reduce(data, 3, DType::kFloat16);
    ADD_FAILURE() << "the fake timeout did not surface";
  } catch (const TimeoutError& error) {
    EXPECT_THAT(error.what(), HasSubstr("collective #3 all-reduce of 3 fp16 elements on rank 0 of "
                                        "2 (fake) timed out"));
    EXPECT_THAT(error.what(), HasSubstr("fake timeout"));
    EXPECT_THAT(error.what(), HasSubstr("the fake transport cannot tell which ranks arrived"));
  }
}

TEST(CommunicatorTimeout, AfterTheFirstTimeoutEveryRequestFailsAtOnceWithoutWaiting) {
  std::vector<FakeTransport> transports(4);
  for (FakeTransport& transport : transports) transport.fail = true;
  FakeCommunicator comm(transports);
  float data[4] = {};
  Request first = comm.all_reduce_async(data, 4, DType::kFloat32, ReduceOp::kSum);
  Request second = comm.all_reduce_async(data, 4, DType::kFloat32, ReduceOp::kSum);
  Request third = comm.all_reduce_async(data, 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_THROW(first.wait(), TimeoutError);
  try {
    second.wait();
    ADD_FAILURE() << "the second request waited";
  } catch (const TimeoutError& error) {
    EXPECT_THAT(error.what(), HasSubstr("collective #2 all-reduce"));
    EXPECT_THAT(error.what(), HasSubstr("abandoned at once: an earlier timeout"));
    EXPECT_THAT(error.what(), HasSubstr("collective #1 all-reduce of 4 fp32 elements"));
  }
  EXPECT_THROW(second.test(), TimeoutError);
  EXPECT_THROW(comm.barrier(), TimeoutError);
  EXPECT_EQ(transports[1].waits + transports[1].tests, 0) << "the transport was asked to wait";
  { Request dropped = std::move(third); }
  EXPECT_EQ(transports[2].waits, 0) << "a dropped request waited after the timeout";
  EXPECT_TRUE(transports[2].destroyed);
}

TEST(CommunicatorTimeout, AbortDumpsTheFlightRecorderToTheTraceDirectory) {
  const std::string dir = ::testing::TempDir() + "communicator_test_abort_trace";
  std::filesystem::remove_all(dir);
  setenv("ZEROSHARD_TRACE_DIR", dir.c_str(), 1);
  std::vector<FakeTransport> transports(1);
  FakeCommunicator comm(transports);
  float data[2] = {};
  comm.all_reduce(data, 2, DType::kFloat32);
  EXPECT_EXIT(comm.abort(3), ::testing::ExitedWithCode(3), "");
  unsetenv("ZEROSHARD_TRACE_DIR");
  bool found = false;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(file.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    found = found || (file.path().filename().string().rfind("rank-0", 0) == 0 &&
                      text.find("abort(3)") != std::string::npos &&
                      text.find("\"op\": \"all-reduce\"") != std::string::npos);
  }
  EXPECT_TRUE(found) << "no rank-0 dump naming the abort and the all-reduce in " << dir;
}

// Every flight-recorder dump in `dir`, parsed.
std::vector<nlohmann::json> dumps_in(const std::string& dir) {
  std::vector<nlohmann::json> dumps;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(file.path());
    dumps.push_back(nlohmann::json::parse(in));
  }
  return dumps;
}

// The program's communicator and the engine's stall together; the one that times out must not
// take the other's records with it when the error unwinds the engine.
TEST(CommunicatorTimeout, ATimeoutDumpsEveryCommunicatorOfTheProcess) {
  const std::string dir = ::testing::TempDir() + "communicator_test_timeout_dumps_all";
  std::filesystem::remove_all(dir);
  setenv("ZEROSHARD_TRACE_DIR", dir.c_str(), 1);
  std::vector<FakeTransport> engine_transports(2);
  FakeCommunicator engine(engine_transports);
  float data[2] = {};
  engine.broadcast(data, 2, DType::kFloat32, 0);
  engine.all_reduce(data, 2, DType::kFloat32);
  std::vector<FakeTransport> program_transports(1);
  program_transports[0].fail = true;
  FakeCommunicator program(program_transports);
  try {
    program.all_reduce(data, 1, DType::kFloat32);
    ADD_FAILURE() << "the fake timeout did not surface";
  } catch (const TimeoutError& error) {
    EXPECT_THAT(error.what(), HasSubstr("and this process's other communicators': " + dir));
  }
  unsetenv("ZEROSHARD_TRACE_DIR");

  const std::vector<nlohmann::json> dumps = dumps_in(dir);
  ASSERT_EQ(dumps.size(), 2u) << "expected the program's dump and the engine's in " << dir;
  const auto timed_out = std::find_if(
      dumps.begin(), dumps.end(), [](const nlohmann::json& d) { return d.at("gave_up_in") == 1; });
  ASSERT_NE(timed_out, dumps.end());
  EXPECT_THAT(timed_out->at("reason").get<std::string>(),
              HasSubstr("collective #1 all-reduce of 1 fp32 elements on rank 0 of 2 (fake) "
                        "timed out"));
  const nlohmann::json& other = dumps[timed_out == dumps.begin() ? 1 : 0];
  EXPECT_EQ(other.at("reason").get<std::string>(),
            "dumped with communicator " + std::to_string(timed_out->at("communicator").get<int>()) +
                " of this process, whose collective #1 all-reduce of 1 fp32 elements on rank 0 of "
                "2 (fake) timed out first");
  ASSERT_EQ(other.at("entries").size(), 2u);
  EXPECT_EQ(other.at("entries")[0].at("op"), "broadcast");
  EXPECT_EQ(other.at("entries")[1].at("op"), "all-reduce");
  EXPECT_EQ(other.at("entries")[1].at("state"), "completed");

  // An abort then rewrites both, each keeping the reason it was first dumped for.
  setenv("ZEROSHARD_TRACE_DIR", dir.c_str(), 1);
  EXPECT_EXIT(program.abort(3), ::testing::ExitedWithCode(3), "");
  unsetenv("ZEROSHARD_TRACE_DIR");
  for (const nlohmann::json& dump : dumps_in(dir)) {
    EXPECT_EQ(dump.at("reason").get<std::string>().find("abort("), std::string::npos)
        << dump.at("reason");
  }
}

TEST(Names, DTypesAndCollectives) {
  EXPECT_STREQ(to_string(DType::kFloat32), "fp32");
  EXPECT_STREQ(to_string(DType::kFloat16), "fp16");
  EXPECT_STREQ(to_string(DType::kBFloat16), "bf16");
  EXPECT_STREQ(to_string(Collective::kAllReduce), "all-reduce");
  EXPECT_STREQ(to_string(Collective::kReduceScatter), "reduce-scatter");
  EXPECT_STREQ(to_string(Collective::kAllGather), "all-gather");
  EXPECT_STREQ(to_string(Collective::kBroadcast), "broadcast");
  EXPECT_STREQ(to_string(Collective::kBarrier), "barrier");
}

TEST(CollectiveTimeout, ComesFromTheEnvironmentWithA600SecondDefault) {
  unsetenv("ZEROSHARD_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(detail::collective_timeout_from_environment().count(), 600.0);
  setenv("ZEROSHARD_COLLECTIVE_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(detail::collective_timeout_from_environment().count(), 2.5);
  for (const char* bad : {"", "abc", "0", "-3", "10s"}) {
    setenv("ZEROSHARD_COLLECTIVE_TIMEOUT_S", bad, 1);
    try {
      detail::collective_timeout_from_environment();
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.key_path(), "ZEROSHARD_COLLECTIVE_TIMEOUT_S");
      EXPECT_THAT(error.what(), HasSubstr("expected a positive number of seconds"));
    }
  }
  unsetenv("ZEROSHARD_COLLECTIVE_TIMEOUT_S");
}

TEST(CommunicatorForDevice, TheCpuGetsTheHostCommunicator) {
  unsetenv("ZEROSHARD_COMM_BACKEND");
  EXPECT_EQ(Communicator::from_environment(Device::cpu())->backend(),
            communicator_without_launcher()->backend());
}

TEST(CommunicatorForDevice, AnUnknownTransportIsAUsageErrorNamingTheVariable) {
  setenv("ZEROSHARD_COMM_BACKEND", "gloo", 1);
  try {
    Communicator::from_environment(Device::cpu());
    ADD_FAILURE() << "accepted ZEROSHARD_COMM_BACKEND=gloo";
  } catch (const UsageError& error) {
    EXPECT_THAT(error.what(), HasSubstr("ZEROSHARD_COMM_BACKEND='gloo'"));
    EXPECT_THAT(error.what(), HasSubstr("expected nccl or mpi"));
  }
  unsetenv("ZEROSHARD_COMM_BACKEND");
}

TEST(CommunicatorForDevice, NcclForCpuBuffersIsAUsageError) {
  setenv("ZEROSHARD_COMM_BACKEND", "NCCL", 1);
  try {
    Communicator::from_environment(Device::cpu());
    ADD_FAILURE() << "accepted ZEROSHARD_COMM_BACKEND=NCCL for the CPU";
  } catch (const UsageError& error) {
    EXPECT_THAT(error.what(), HasSubstr("the device is cpu"));
  }
  unsetenv("ZEROSHARD_COMM_BACKEND");
}

}  // namespace
}  // namespace zeroshard
