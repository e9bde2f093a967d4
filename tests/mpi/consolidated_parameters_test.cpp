// The consolidated parameters stream through one bounded chunk: consolidated_parameters() holds
// its result and one gathered chunk, never a full-size copy beside them, and the chunk visitor
// holds only the chunk. Heap bytes are counted by replacing operator new in this program; engine
// buffers by the engine's memory report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>  // malloc_usable_size

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine_internals.h"
#include "mpi/toy_model.h"

namespace {

// Bytes allocated through operator new and not yet freed, and the most since the last reset.
std::atomic<std::int64_t> live_heap_bytes{0};
std::atomic<std::int64_t> peak_heap_bytes{0};

void* counted_allocation(std::size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  const std::int64_t now = live_heap_bytes += static_cast<std::int64_t>(malloc_usable_size(p));
  std::int64_t peak = peak_heap_bytes.load();
  while (now > peak && !peak_heap_bytes.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  live_heap_bytes -= static_cast<std::int64_t>(malloc_usable_size(p));
  std::free(p);
}

}  // namespace

void* operator new(std::size_t bytes) { return counted_allocation(bytes); }
void* operator new[](std::size_t bytes) { return counted_allocation(bytes); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace zeroshard::testing {
namespace {

// Four times the default chunk, so that a full-size copy cannot hide inside the chunk's bound;
// odd sizes, so that tensors straddle chunks and each other's padding.
std::vector<ToyTensor> large_tensors() {
  const std::int64_t chunk = kConsolidationChunkElements;
  return {{"big.weight", 3 * chunk + 5},
          {"big.bias", 7},
          {"head.weight", chunk - 3},
          {"head.bias", 11}};
}

std::vector<float> initial_values(const std::vector<ToyTensor>& tensors) {
  std::vector<float> values;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
      values.push_back(initial_value(static_cast<int>(k), i));
    }
  }
  return values;
}

/// What a call held at most beyond what was held before it: heap bytes and engine buffers.
struct ExtraBytes {
  std::int64_t heap = 0;
  std::int64_t engine = 0;
};

template <class Call>
ExtraBytes extra_bytes_of(Engine& engine, Call call) {
  engine.reset_memory_peaks();
  const std::int64_t engine_before = engine.memory_report().total_current(engine_memory(engine));
  const std::int64_t heap_before = live_heap_bytes.load();
  peak_heap_bytes = heap_before;
  call();
  const ExtraBytes extra{
      peak_heap_bytes.load() - heap_before,
      engine.memory_report().total_peak[static_cast<int>(engine_memory(engine))] - engine_before};
  return extra;
}

class ConsolidatedParameters : public ::testing::TestWithParam<int> {};

TEST_P(ConsolidatedParameters, HoldTheResultAndOneChunkAtMost) {
  const std::vector<ToyTensor> tensors = large_tensors();
  Engine engine = make_engine(toy_config(GetParam()), make_adamw());
  register_toy(engine, tensors);
  engine.finalize();
  const std::int64_t chunk_bytes = kConsolidationChunkElements * 4;
  std::vector<float> values;
  const ExtraBytes extra =
      extra_bytes_of(engine, [&] { values = engine.consolidated_parameters(); });
  const auto result_bytes = static_cast<std::int64_t>(values.size() * sizeof(float));
  // The result, one chunk's host copy (a GPU engine's) and small bookkeeping; not a second copy.
  EXPECT_LE(extra.heap, result_bytes + chunk_bytes + (std::int64_t{1} << 20))
      << "result " << result_bytes << " bytes";
  // A GPU engine also stages the ranks' failure texts through device memory: a few bytes.
  EXPECT_LE(extra.engine, chunk_bytes + backend_workspace_allowance(engine));
  EXPECT_EQ(values, initial_values(tensors));
}

// The visitor alone holds a chunk and nothing of the model's size; every element comes once, in
// order, with its parameter and offset.
TEST_P(ConsolidatedParameters, TheVisitorHoldsOneChunkAndVisitsEveryElementInOrder) {
  const std::vector<ToyTensor> tensors = large_tensors();
  Engine engine = make_engine(toy_config(GetParam()), make_adamw());
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  engine.finalize();
  const std::int64_t chunk = kConsolidationChunkElements / 4;
  std::size_t tensor = 0;
  std::int64_t next = 0;  // the next element of `tensor` expected
  std::int64_t wrong = 0;
  const ExtraBytes extra = extra_bytes_of(engine, [&] {
    engine.visit_consolidated_parameters(
        [&](const ConsolidatedChunk& c) {
          if (next == tensors[tensor].numel) {
            ++tensor;
            next = 0;
          }
          ASSERT_LT(tensor, tensors.size());
          ASSERT_EQ(c.parameter.name(), handles[tensor].name());
          ASSERT_EQ(c.offset, next);
          ASSERT_LE(static_cast<std::int64_t>(c.values.size()), chunk);
          for (std::size_t i = 0; i < c.values.size(); ++i) {
            wrong += c.values[i] != initial_value(static_cast<int>(tensor), next + i);
          }
          next += static_cast<std::int64_t>(c.values.size());
        },
        chunk);
  });
  EXPECT_EQ(tensor, tensors.size() - 1);
  EXPECT_EQ(next, tensors.back().numel);
  EXPECT_EQ(wrong, 0);
  EXPECT_LE(extra.heap, std::int64_t{1} << 20);
  EXPECT_LE(extra.engine, chunk * 4 + backend_workspace_allowance(engine));
}

INSTANTIATE_TEST_SUITE_P(Stages, ConsolidatedParameters, ::testing::Values(0, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

struct Placement {
  int stage;
  bool nvme;  ///< optimizer states (and at stage 3 parameters) in swap files
};

Config placement_config(const Placement& placement) {
  Config config = toy_config(placement.stage);
  if (placement.nvme) {
    OffloadConfig& offload = config.zero_optimization.offload_optimizer;
    offload.device = OffloadDevice::kNvme;
    offload.nvme_path = nvme_test_directory();
    config.zero_optimization.sub_group_size = 24;
  }
  return config;
}

class ConsolidatedChunks : public ::testing::TestWithParam<Placement> {};

// After training, chunks of a few elements (boundaries inside tensors, padding and shards) give
// what consolidated_parameters() gives; frozen parameters are not visited.
TEST_P(ConsolidatedChunks, OfAnySizeGiveTheConsolidatedParameters) {
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = make_engine(placement_config(GetParam()), make_adamw());
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  for (std::int64_t step = 0; step < 3; ++step) {
    toy_micro_step_any_precision(engine, tensors, handles, step);
    engine.step();
  }
  const std::vector<float> whole = engine.consolidated_parameters();
  std::vector<std::string> trainable;
  for (const ToyTensor& t : tensors) {
    if (t.trainable) trainable.push_back(t.name);
  }
  for (const std::int64_t chunk : {std::int64_t{1}, std::int64_t{5}, std::int64_t{16},
                                   std::int64_t{100}, kConsolidationChunkElements}) {
    std::vector<float> streamed;
    std::vector<std::string> names;
    engine.visit_consolidated_parameters(
        [&](const ConsolidatedChunk& c) {
          if (c.offset == 0) names.push_back(c.parameter.name());
          streamed.insert(streamed.end(), c.values.begin(), c.values.end());
        },
        chunk);
    EXPECT_EQ(streamed, whole) << "chunk " << chunk;
    EXPECT_EQ(names, trainable) << "chunk " << chunk;
  }
  EXPECT_THROW(engine.visit_consolidated_parameters([](const ConsolidatedChunk&) {}, 0),
               UsageError);
}

// A visitor that throws on one rank: that rank gets the exception once every chunk is through,
// the others finish, and the engine's collectives stay in step.
TEST_P(ConsolidatedChunks, AVisitorThatThrowsOnOneRankLeavesNoRankWaiting) {
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  Engine engine = make_engine(placement_config(GetParam()), make_adamw());
  register_toy(engine, tensors);
  const int thrower = engine.world_size() - 1;
  int calls = 0;
  const auto visit = [&](const ConsolidatedChunk&) {
    if (++calls == 2 && engine.rank() == thrower) throw std::runtime_error("visitor failed");
  };
  if (engine.rank() == thrower) {
    EXPECT_THROW(engine.visit_consolidated_parameters(visit, 8), std::runtime_error);
    EXPECT_EQ(calls, 2);
  } else {
    EXPECT_NO_THROW(engine.visit_consolidated_parameters(visit, 8));
  }
  EXPECT_EQ(engine.consolidated_parameters().size(),
            static_cast<std::size_t>(engine.trainable_numel()));
}

// A read of one rank's swap file fails during the gathers: every rank throws, none waits, and the
// next consolidation (the fault was one completion) gives the model again.
TEST_P(ConsolidatedChunks, AFailedReadOnOneRankIsAnErrorOnEveryRank) {
  if (!GetParam().nvme) GTEST_SKIP() << "resident shards do not fail to read";
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  // One buffer, so that the gathers read the first sub-group again: with more buffers every
  // sub-group of a small shard stays in them after the first consolidation and is not read.
  Config config = placement_config(GetParam());
  config.zero_optimization.offload_optimizer.buffer_count = 1;
  Engine engine = make_engine(config, make_adamw());
  register_toy(engine, tensors);
  const std::vector<float> whole = engine.consolidated_parameters();
  const int faulty = 0;  // the last rank's shard may be padding that is never read
  if (engine.rank() == faulty) {
    detail::EngineInternals::state(engine).optimizer().inject_swap_fault(
        0, {detail::IoFaultKind::kEio, 1, 1});
  }
  try {
    engine.visit_consolidated_parameters([](const ConsolidatedChunk&) {}, 8);
    ADD_FAILURE() << "a failed read of rank " << faulty << "'s master was consolidated";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), ::testing::HasSubstr("optimizer_master.swp"));
  }
  EXPECT_EQ(engine.consolidated_parameters(), whole);
}

INSTANTIATE_TEST_SUITE_P(StagesAndSwapFiles, ConsolidatedChunks,
                         ::testing::Values(Placement{0, false}, Placement{1, false},
                                           Placement{2, false}, Placement{3, false},
                                           Placement{2, true}, Placement{3, true}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) +
                                  (info.param.nvme ? "_nvme" : "");
                         });

}  // namespace
}  // namespace zeroshard::testing
