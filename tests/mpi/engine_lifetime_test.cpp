// What an engine leaves behind when it is destroyed: reductions still in flight mid-backward,
// Parameter handles, gathered-module guards and activation buffers that outlive it, and guards
// alive while it is moved. Run under ASan+UBSan (docs/testing.md) to see the memory errors each
// case once had.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

using ::testing::HasSubstr;

Engine toy_engine_at(int stage) {
  AdamWOptions options;
  options.lr = 1e-3;
  return make_engine(toy_config(stage), make_adamw(options));
}

// The model's backward fails after handing over `handed_over` gradients, the last registered
// tensors' first: that launches the reductions of the buckets they complete (one window of one
// micro-step, so at stages 0-1 too), and the exception unwinds the engine before any step(). A
// ring reduce-scatter moves one step per poll, so with three ranks or more the reduction launched
// by the last hand-over is still in flight.
void backward_that_throws(Engine& engine, const std::vector<ToyTensor>& tensors,
                          const std::vector<Parameter>& handles, int handed_over) {
  for (const Parameter& p : handles) engine.gather(p.module());
  for (const Parameter& p : handles) engine.release(p.module());
  int count = 0;
  for (std::size_t k = tensors.size(); k-- > 0;) {
    if (!tensors[k].trainable) continue;
    auto guard = engine.gathered(handles[k].module());
    add_toy_gradient(engine, handles[k], k, 0);
    engine.grad_ready(handles[k]);
    if (++count == handed_over) throw std::runtime_error("backward failed");
  }
}

TEST(EngineLifetime, AnEngineUnwoundMidBackwardWaitsForItsReductionsAtEveryStage) {
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  for (int stage = 0; stage <= 3; ++stage) {
    // super_offload (stages 1-3): the update thread also runs, on the buckets that landed.
    for (const bool super_offload : {false, true}) {
      if (super_offload && stage == 0) continue;
      Config config = toy_config(stage);
      if (super_offload) {
        config.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
        config.zero_optimization.offload_optimizer.super_offload = true;
      }
      // 1-5 of the 6 trainable gradients: a bucket boundary falls after one of them.
      for (int handed_over = 1; handed_over <= 5; ++handed_over) {
        const std::string where = "stage " + std::to_string(stage) +
                                  (super_offload ? " with super_offload" : "") + ", " +
                                  std::to_string(handed_over) + " gradients handed over";
        try {
          Engine engine = make_engine(config, decayed_adamw());
          const std::vector<Parameter> handles = register_toy(engine, tensors);
          backward_that_throws(engine, tensors, handles, handed_over);
          ADD_FAILURE() << "the backward did not throw; " << where;
        } catch (const std::runtime_error& error) {
          EXPECT_STREQ(error.what(), "backward failed") << where;
        }
      }
      // The ranks are still in step: a new engine trains.
      Engine engine = make_engine(config, decayed_adamw());
      const std::vector<Parameter> handles = register_toy(engine, tensors);
      toy_micro_step(engine, tensors, handles, 0);
      EXPECT_TRUE(engine.step().updated) << "stage " << stage;
    }
  }
}

TEST(EngineLifetime, EveryCallOnAParameterOfADestroyedEngineIsAUsageErrorNamingIt) {
  std::vector<Parameter> kept;
  {
    Engine engine = toy_engine_at(2);
    kept = register_toy(engine, uneven_toy_tensors());
  }
  const Parameter& weight = kept[0];  // "a.weight", trainable
  const Parameter& frozen = kept[2];  // "frozen.table"
  const std::vector<float> values(91, 0.5f);
  for (const Parameter& p : {weight, frozen}) {
    const std::vector<std::function<void()>> calls = {
        [&] { p.numel(); },          [&] { p.trainable(); }, [&] { p.dtype(); },
        [&] { p.module(); },         [&] { p.data(); },      [&] { p.raw_data(); },
        [&] { p.grad(); },           [&] { p.raw_grad(); },  [&] { p.grad_target(); },
        [&] { p.copy_from(values); }};
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const std::string message = message_of<UsageError>(calls[c]);
      EXPECT_THAT(message, HasSubstr("'" + p.name() + "'")) << "call " << c;
      EXPECT_THAT(message, HasSubstr("Engine was destroyed")) << "call " << c;
    }
  }
  // What the handle names stays readable, for messages and logs.
  EXPECT_EQ(weight.name(), "a.weight");
  EXPECT_EQ(weight.shape(), std::vector<std::int64_t>{91});
  EXPECT_EQ(frozen.name(), "frozen.table");
}

TEST(EngineLifetime, AParameterOfADestroyedEngineIsRefusedByAnotherEngine) {
  Parameter stale;
  {
    Engine engine = toy_engine_at(2);
    stale = engine.register_parameter("a.weight", {8});
  }
  Engine engine = toy_engine_at(2);
  engine.register_parameter("a.weight", {8});
  EXPECT_THAT(message_of<UsageError>([&] { engine.grad_ready(stale); }),
              HasSubstr("another engine"));
  EXPECT_THAT(message_of<UsageError>([&] { engine.flat_offset(stale); }),
              HasSubstr("another engine"));
}

TEST(EngineLifetime, NameAndShapeOfAHandleStayValidAfterItsEngineIsDestroyed) {
  std::optional<Engine> engine(toy_engine_at(2));
  const Parameter p = engine->register_parameter("fc1.weight", {4, 3});
  const std::string& name = p.name();
  const std::vector<std::int64_t>& shape = p.shape();
  engine.reset();
  EXPECT_EQ(name, "fc1.weight");
  EXPECT_EQ(shape, (std::vector<std::int64_t>{4, 3}));
}

// The guard is kept past its engine's end, as an exception unwinding a trainer might leave it.
TEST(EngineLifetime, AGatheredModuleThatOutlivesItsEngineDoesNothingAtItsEnd) {
  for (int stage = 0; stage <= 3; ++stage) {
    std::optional<Engine::GatheredModule> module_guard;
    std::optional<Engine::GatheredModel> model_guard;
    {
      auto engine = std::make_unique<Engine>(toy_engine_at(stage));
      const std::vector<Parameter> handles = register_toy(*engine, uneven_toy_tensors());
      module_guard.emplace(engine->gathered(handles[3].module()));
      model_guard.emplace(engine->gathered_model());
    }
    module_guard.reset();
    model_guard.reset();
  }
}

// A guard alive while its engine moves (into a container, out of a factory) releases on the
// engine it now lives in.
TEST(EngineLifetime, AGatheredModuleReleasesOnTheEngineItsEngineWasMovedInto) {
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  for (int stage = 0; stage <= 3; ++stage) {
    Engine engine = toy_engine_at(stage);
    const std::vector<Parameter> handles = register_toy(engine, tensors);
    std::optional<Engine> moved;
    {
      auto module_guard = engine.gathered(handles[3].module());
      auto model_guard = engine.gathered_model();
      moved.emplace(std::move(engine));
    }
    // Every module was released: stage 3's step() refuses to update while one is gathered.
    toy_micro_step(*moved, tensors, handles, 0);
    EXPECT_TRUE(moved->step().updated) << "stage " << stage;
  }
}

TEST(EngineLifetime, AnActivationBufferThatOutlivesItsEngineIsEmptied) {
  ActivationBuffer kept;
  {
    Engine engine = toy_engine_at(2);
    engine.register_parameter("a.weight", {8});
    kept = engine.allocate_activations(4096);
    ASSERT_NE(kept.data(), nullptr);
    EXPECT_EQ(kept.bytes(), 4096u);
    ActivationBuffer replaced = engine.allocate_activations(64);
    replaced = engine.allocate_activations(128);  // the 64 bytes go back at once
    EXPECT_EQ(
        engine.memory_report().at(MemoryCategory::kActivations, engine_memory(engine)).current,
        4096 + 128);
  }
  // Freed with the engine: a pointer into freed memory would be the alternative.
  EXPECT_EQ(kept.data(), nullptr);
  EXPECT_EQ(kept.bytes(), 0u);
}

TEST(EngineLifetime, EveryCallOnAMovedFromEngineIsAUsageError) {
  Engine engine = toy_engine_at(2);
  engine.register_parameter("a.weight", {8});
  Engine moved = std::move(engine);
  const std::string message = message_of<UsageError>([&] { engine.step(); });
  EXPECT_THAT(message, HasSubstr("moved-from Engine"));
  EXPECT_THROW(engine.register_parameter("b.weight", {4}), UsageError);
  EXPECT_THROW(engine.memory_report(), UsageError);
  EXPECT_THROW(engine.allocate_activations(16), UsageError);
  EXPECT_EQ(moved.parameters().size(), 1u);
}

}  // namespace
}  // namespace zeroshard::testing
