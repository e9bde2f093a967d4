// Data-parallel groups from the program's own MPI communicator: the world splits into groups of
// 2 (as under 2-way tensor parallelism), each group trains on data of its own, and each trains
// exactly as a 2-rank run would, at every stage, without a message crossing to the other group.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "mpi/toy_model.h"
#include "zeroshard/communicator_mpi.h"

namespace zeroshard::testing {
namespace {

// Splits the world into consecutive groups of 2 (the last one may hold 1 rank); frees the split
// communicator, which from_mpi has duplicated, when the test ends.
class DataParallelGroup {
 public:
  DataParallelGroup() {
    // The world communicator initialises MPI the way the engine's tests do.
    world_ = Communicator::from_environment();
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    color_ = world_rank / 2;
    MPI_Comm_split(MPI_COMM_WORLD, color_, world_rank, &split_);
  }
  ~DataParallelGroup() { MPI_Comm_free(&split_); }
  DataParallelGroup(const DataParallelGroup&) = delete;
  DataParallelGroup& operator=(const DataParallelGroup&) = delete;

  MPI_Comm comm() const { return split_; }
  int color() const { return color_; }
  Communicator& world() { return *world_; }

 private:
  std::unique_ptr<Communicator> world_;
  MPI_Comm split_ = MPI_COMM_NULL;
  int color_ = 0;
};

class DataParallelGroups : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelGroups, EachGroupTrainsAsARunOfItsSize) {
  const int stage = GetParam();
  DataParallelGroup group;
  std::unique_ptr<Communicator> comm = Communicator::from_mpi(group.comm());
  int group_size = 0;
  MPI_Comm_size(group.comm(), &group_size);
  ASSERT_EQ(comm->size(), group_size);

  // Each group runs another update rule, so its parameters, and with them its gradients,
  // differ from the other group's after the first step: a reduction that crossed groups would
  // change the sums.
  const RuleCase rule = rule_cases()[static_cast<std::size_t>(group.color()) % rule_cases().size()];
  Engine engine(toy_config(stage), Device::cpu(), std::move(comm), rule.make());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  auto reference_rule = rule.make();
  ToyReference reference(tensors, *reference_rule, group_size);
  for (std::int64_t step = 0; step < 10; ++step) {
    toy_micro_step(engine, tensors, handles, step);
    EXPECT_TRUE(engine.step().updated);
    reference.step(
        step, [&](std::size_t) { return reference_rule->default_lr(); },
        reference_rule->default_weight_decay());
  }
  const std::vector<float> actual = engine.consolidated_parameters();
  const std::vector<float> expected = reference.trainable_values();
  EXPECT_EQ(actual.size(), expected.size());
  std::size_t differing = 0;
  for (std::size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    if (actual[i] != expected[i] && differing++ == 0) {
      ADD_FAILURE() << "element " << i << ": " << actual[i] << " vs " << expected[i]
                    << " of a run of " << group_size << ", " << rule.name << ", stage " << stage;
    }
  }
  EXPECT_EQ(differing, 0u) << "elements not bit-identical to a run of " << group_size;
  // Reached whatever failed above, so that no rank waits for another for ever: the program's
  // world still works beside the groups.
  group.world().barrier();
}

INSTANTIATE_TEST_SUITE_P(Stages, DataParallelGroups, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

TEST(DataParallelGroups, NullCommunicatorIsAUsageError) {
  DataParallelGroup group;
  EXPECT_THROW(Communicator::from_mpi(MPI_COMM_NULL), UsageError);
}

}  // namespace
}  // namespace zeroshard::testing
