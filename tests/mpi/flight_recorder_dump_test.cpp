// The flight-recorder dumps of a process's communicators under MPI: a timeout on the program's own
// communicator dumps the engine's recorder too, which the error would otherwise unwind unseen.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(FlightRecorderDump, AProgramCommunicatorsTimeoutDumpsTheEnginesRecorderToo) {
  using std::chrono::duration;
  const auto world = detail::make_mpi_communicator({});
  if (world->size() < 2) GTEST_SKIP() << "needs a second rank to stay out of the all-reduce";
  const int rank = world->rank();
  // The program's own communicator, as a trainer makes it before its engine; only rank 0's gives
  // up soon.
  const auto program = detail::make_mpi_communicator(
      {.timeout = rank == 0 ? duration<double>(1.0) : duration<double>(600)});
  AdamWOptions options;
  options.lr = 1e-3;
  Engine engine = make_engine(toy_config(2), make_adamw(options));
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  toy_micro_step(engine, tensors, handles, 0);
  engine.step();
  const TrafficCounters& traffic = engine.communicator().traffic();
  std::int64_t engine_collectives = 0;
  for (std::int64_t calls : traffic.calls) engine_collectives += calls;
  ASSERT_GT(engine_collectives, 0);

  const std::string dir =
      ::testing::TempDir() + "flight_recorder_dump_test_np" + std::to_string(world->size());
  float loss = 1.0f;
  std::vector<nlohmann::json> dumps;
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    setenv("ZEROSHARD_TRACE_DIR", dir.c_str(), 1);
    EXPECT_THROW(program->all_reduce(&loss, 1, DType::kFloat32), TimeoutError);
    unsetenv("ZEROSHARD_TRACE_DIR");
    if (std::filesystem::is_directory(dir)) {
      for (const auto& file : std::filesystem::directory_iterator(dir)) {
        std::ifstream in(file.path());
        dumps.push_back(nlohmann::json::parse(in));
      }
    }
    world->barrier();
  } else {
    // Joins the all-reduce only after rank 0 gave up, so that it completes before MPI finalizes.
    world->barrier();
    program->all_reduce(&loss, 1, DType::kFloat32);
  }
  // Rank 0 keeps MPI progressing here, so that the all-reduce it abandoned completes elsewhere.
  world->barrier();
  if (rank != 0) return;

  const nlohmann::json* program_dump = nullptr;
  const nlohmann::json* engine_dump = nullptr;
  for (const nlohmann::json& dump : dumps) {
    if (dump.at("gave_up_in") == 1) program_dump = &dump;
    if (dump.at("last_started") == engine_collectives) engine_dump = &dump;
  }
  ASSERT_NE(program_dump, nullptr) << "no dump of the program's communicator in " << dir;
  EXPECT_THAT(program_dump->at("reason").get<std::string>(),
              HasSubstr("collective #1 all-reduce of 1 fp32 elements on rank 0 of"));
  ASSERT_NE(engine_dump, nullptr) << "no dump holding the engine's " << engine_collectives
                                  << " collectives in " << dir;
  EXPECT_THAT(engine_dump->at("reason").get<std::string>(),
              StartsWith("dumped with communicator " +
                         std::to_string(program_dump->at("communicator").get<int>())));
  for (const nlohmann::json& entry : engine_dump->at("entries")) {
    EXPECT_EQ(entry.at("state"), "completed") << entry;
  }
}

}  // namespace
}  // namespace zeroshard::testing
