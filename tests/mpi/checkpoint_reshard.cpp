// Resharding at load: a checkpoint saved at world size N and stage S loads at world size M and
// stage T with the same parameters and rule states. ctest runs the save at N ranks
// (ZEROSHARD_RESHARD_MODE=save), then the load at M ranks, which saves again and compares every
// section of both checkpoints over the whole flat layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

namespace fs = std::filesystem;

struct Setting {
  std::string mode;
  std::string dir;
  int stage = 0;
};

std::optional<Setting> setting() {
  const char* mode = std::getenv("ZEROSHARD_RESHARD_MODE");
  const char* dir = std::getenv("ZEROSHARD_RESHARD_DIR");
  const char* stage = std::getenv("ZEROSHARD_RESHARD_STAGE");
  if (mode == nullptr || dir == nullptr || stage == nullptr) return std::nullopt;
  return Setting{mode, dir, std::atoi(stage)};
}

Engine make_toy_engine(int stage) {
  Config config = toy_config(stage);
  config.scheduler.type = "WarmupLR";
  config.scheduler.params = {{"warmup_num_steps", 5.0}, {"warmup_max_lr", 0.01}};
  return make_engine(std::move(config), rule_cases()[0].make());
}

void train(Engine& engine, const std::vector<ToyTensor>& tensors,
           const std::vector<Parameter>& handles, std::int64_t from, std::int64_t to) {
  for (std::int64_t s = from; s < to; ++s) {
    toy_micro_step(engine, tensors, handles, s);
    engine.step();
  }
}

TEST(CheckpointReshard, SavesOrLoadsAsCtestSays) {
  const std::optional<Setting> s = setting();
  if (!s) GTEST_SKIP() << "run by ctest's checkpoint_reshard cases, which set the mode";
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = make_toy_engine(s->stage);
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  if (s->mode == "save") {
    train(engine, tensors, handles, 0, 3);
    engine.communicator().barrier();
    if (engine.rank() == 0) fs::remove_all(s->dir);
    engine.communicator().barrier();
    engine.save_checkpoint(s->dir, "saved");
    return;
  }
  ASSERT_EQ(s->mode, "load");
  const CheckpointInfo info = engine.load_checkpoint(s->dir);
  ASSERT_EQ(info.tag, "saved");
  EXPECT_EQ(engine.global_step(), 3);
  const std::vector<float> consolidated = engine.consolidated_parameters();
  engine.communicator().barrier();
  if (engine.rank() == 0) fs::remove_all(s->dir + "/resaved");
  engine.save_checkpoint(s->dir, "resaved");
  if (engine.rank() != 0) return;

  const std::string saved_dir = s->dir + "/saved";
  const std::string resaved_dir = s->dir + "/resaved";
  const detail::Manifest saved = detail::read_manifest(saved_dir);
  const detail::Manifest resaved = detail::read_manifest(resaved_dir);
  EXPECT_EQ(resaved.world_size, engine.world_size());
  EXPECT_EQ(resaved.stage, s->stage);
  ASSERT_EQ(saved.state_count, resaved.state_count);
  const std::int64_t total = std::max(saved.padded_total, resaved.padded_total);
  const detail::ShardReader a(saved, saved_dir);
  const detail::ShardReader b(resaved, resaved_dir);
  for (int section = 0; section <= saved.state_count; ++section) {
    std::vector<float> before(total);
    std::vector<float> after(total);
    a.read(section, 0, total, before.data());
    b.read(section, 0, total, after.data());
    for (std::int64_t i = 0; i < total; ++i) {
      ASSERT_EQ(before[i], after[i]) << "section " << section << ", flat element " << i;
    }
    if (section == 0) {
      // The engine's own view of the master weights matches the file's, tensor by tensor.
      std::vector<float> expected;
      for (const detail::ManifestTensor& t : saved.tensors) {
        if (!t.trainable) continue;
        expected.insert(expected.end(), before.begin() + t.offset,
                        before.begin() + t.offset + t.numel);
      }
      EXPECT_EQ(consolidated, expected);
    }
  }
  // Rule states are non-trivial after three steps (Adam's second moment is positive somewhere).
  std::vector<float> v(total);
  a.read(2, 0, total, v.data());
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.0f);
}

}  // namespace
}  // namespace zeroshard::testing
