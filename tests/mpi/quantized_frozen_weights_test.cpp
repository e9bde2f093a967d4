// zero_quantized_nontrainable_weights: frozen parameters are kept as int8 blocks and a gathered
// module shows them decoded; training that reads them stays close to the unquantized run, the
// memory report and the estimate shrink alike, reads outside a gather and non-finite values are
// refused by name, the key is refused below stage 3, and checkpoints keep the decoded values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "kernels/cpu/block_quantizer.h"  // quantize_blocks, dequantize_blocks: the CPU reference
#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

using detail::QuantBits;

Config frozen_config(bool quantized, DType dtype, int stage = 3) {
  Config config = toy_config(stage);
  config.zero_optimization.quantized_nontrainable_weights = quantized;
  config.bf16.enabled = dtype == DType::kBFloat16;
  return config;
}

// A module of frozen parameters only ("frozen", three blocks, the last one short) and a frozen
// parameter in a module with trainable ones ("b.mask").
std::vector<ToyTensor> frozen_toy_tensors() {
  return {{"a.weight", 91}, {"a.bias", 7},  {"frozen.table", 600, false},
          {"b.weight", 77}, {"b.bias", 11}, {"b.mask", 40, false},
          {"c.weight", 33}, {"c.bias", 3}};
}

const char* name_of(DType dtype) { return dtype == DType::kBFloat16 ? "bf16" : "fp32"; }

// The model-type values register_toy() gives tensor k, and what the int8 blocks make of them.
struct Expected {
  std::vector<char> stored;
  std::vector<char> decoded;
};

Expected expected_values(int k, std::int64_t numel, DType dtype) {
  const std::size_t dsize = size_of(dtype);
  std::vector<float> values(numel);
  for (std::int64_t i = 0; i < numel; ++i) values[i] = initial_value(k, i);
  Expected e{std::vector<char>(numel * dsize), std::vector<char>(numel * dsize)};
  detail::convert_from_float(values.data(), e.stored.data(), dtype, numel);
  std::vector<char> encoded(detail::quantized_bytes(numel, QuantBits::kInt8));
  EXPECT_EQ(
      detail::quantize_blocks(e.stored.data(), dtype, numel, QuantBits::kInt8, encoded.data()), 0);
  detail::dequantize_blocks(encoded.data(), QuantBits::kInt8, numel, e.decoded.data(), dtype);
  return e;
}

std::vector<char> gathered_bytes(Engine& engine, const Parameter& p) {
  auto guard = engine.gathered(p.module());
  return to_host(engine, p.raw_data(), p.numel() * size_of(p.dtype()));
}

class QuantizedFrozenWeights : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizedFrozenWeights, GatheredValuesAreTheStoredOnesQuantizedAndDequantized) {
  const DType dtype = GetParam();
  Engine engine = make_engine(frozen_config(true, dtype), decayed_adamw());
  const auto tensors = frozen_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].trainable) continue;
    const Expected e = expected_values(static_cast<int>(k), tensors[k].numel, dtype);
    const std::vector<char> seen = gathered_bytes(engine, handles[k]);
    EXPECT_EQ(std::memcmp(seen.data(), e.decoded.data(), seen.size()), 0) << tensors[k].name;
    EXPECT_NE(std::memcmp(seen.data(), e.stored.data(), seen.size()), 0)
        << tensors[k].name << ": the gathered values are the unquantized ones";
    if (engine.rank() == 0) {
      std::vector<float> stored(tensors[k].numel);
      std::vector<float> decoded(tensors[k].numel);
      detail::convert_to_float(e.stored.data(), dtype, stored.data(), tensors[k].numel);
      detail::convert_to_float(seen.data(), dtype, decoded.data(), tensors[k].numel);
      double largest = 0.0;
      for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(decoded[i]) - stored[i]));
      }
      std::printf("frozen %s %s: largest |decoded - stored| %.6g (values within [-0.5, 0.5])\n",
                  name_of(dtype), tensors[k].name.c_str(), largest);
    }
  }
}

// One micro-step of the toy model in which every trainable gradient also reads the frozen table
// (as an embedding feeds the layers after it), each element 0.5 * table[i mod 600], rounded to
// 2^-10 like the toy's gradients so that sums over ranks stay exact.
void micro_step_reading_the_table(Engine& engine, const std::vector<ToyTensor>& tensors,
                                  const std::vector<Parameter>& handles, std::int64_t step) {
  const Parameter& table = handles[2];
  toy_micro_step_any_precision(engine, tensors, handles, step, [&](std::size_t) {
    const DType dtype = engine.model_dtype();
    std::vector<float> t(table.numel());
    auto guard = engine.gathered(table.module());
    const std::vector<char> raw = to_host(engine, table.raw_data(), t.size() * size_of(dtype));
    detail::convert_to_float(raw.data(), dtype, t.data(), table.numel());
    return std::function<float(std::int64_t)>([t = std::move(t)](std::int64_t i) {
      return quantise(0.5 * t[static_cast<std::size_t>(i) % t.size()]);
    });
  });
}

// Training for kSteps steps with the table quantized moves the fp32 master away from the
// unquantized run's by at most kBound, and by something.
TEST_P(QuantizedFrozenWeights, TrainingStaysCloseToTheUnquantizedRun) {
  const DType dtype = GetParam();
  constexpr int kSteps = 6;
  // Each decoded table value is within max|block| / 254 < 0.002 of the stored one, so a gradient
  // term 0.5 * table moves by at most 0.001, one or two units of 2^-10 after rounding; AdamW's
  // normalised update of size lr = 0.01 then moves by about lr * 2^-9 relative to gradients of
  // order 1 per step, 1.2e-4 over six steps. The bound allows about 8 times that (runs at 1-4
  // ranks measure 1.3e-6 to 2.4e-5 in fp32, 1.8e-5 to 5.7e-5 in bf16).
  constexpr double kBound = 1e-3;
  const MasterDifference difference =
      largest_master_difference([dtype](bool quantized) { return frozen_config(quantized, dtype); },
                                micro_step_reading_the_table, frozen_toy_tensors(), kSteps);
  const double largest = difference.largest;
  const int rank = difference.rank;
  EXPECT_LE(largest, kBound);
  EXPECT_GT(largest, 0.0) << "trained bit for bit as without the key: nothing was quantized";
  if (rank == 0) {
    std::printf("frozen %s: largest |master - unquantized master| after %d steps: %.6g\n",
                name_of(dtype), kSteps, largest);
  }
}

TEST_P(QuantizedFrozenWeights, ReadingAFrozenParameterOutsideAGatherIsAUsageError) {
  Engine engine = make_engine(frozen_config(true, GetParam()), decayed_adamw());
  const auto tensors = frozen_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  for (const int k : {2, 5}) {
    try {
      (void)handles[k].raw_data();
      FAIL() << tensors[k].name << " was readable outside a gather";
    } catch (const UsageError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("'" + tensors[k].name + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("zero_quantized_nontrainable_weights"), std::string::npos) << what;
    }
  }
  // Readable while gathered, and not after the release.
  {
    auto guard = engine.gathered(handles[2].module());
    EXPECT_NO_THROW((void)handles[2].raw_data());
  }
  EXPECT_THROW((void)handles[2].raw_data(), UsageError);
}

// The frozen bytes under parameters shrink from 4 per element to the int8 encoding, as the
// estimate says; a gathered module adds its decoded copy until it is released.
TEST(QuantizedFrozenWeightsMemory, ReportShrinksToTheEncodingAndMatchesTheEstimate) {
  constexpr std::int64_t kFrozen = 3000;
  const std::vector<ToyTensor> tensors = {{"a.weight", 4000}, {"frozen.table", kFrozen, false}};
  std::int64_t reported[2] = {};
  std::int64_t estimated[2] = {};
  for (const bool quantized : {false, true}) {
    const Config config = frozen_config(quantized, DType::kFloat32);
    Engine engine = make_engine(config, decayed_adamw());
    const auto handles = register_toy(engine, tensors);
    const MemoryLocation where = engine_memory(engine);
    reported[quantized] = engine.memory_report().at(MemoryCategory::kParameters, where).current;
    EstimateInput in = estimate_input_from_config(config, 0, engine.world_size());
    in.tensors = {4000};
    in.frozen_params = kFrozen;
    const MemoryEstimate estimate_now = estimate(in);
    estimated[quantized] = estimate_now.at(MemoryCategory::kParameters);
    if (!quantized) continue;
    {
      auto guard = engine.gathered(handles[1].module());
      EXPECT_EQ(engine.memory_report().at(MemoryCategory::kParameters, where).current,
                reported[1] + kFrozen * 4)
          << "the decoded copy while gathered";
    }
    EXPECT_EQ(engine.memory_report().at(MemoryCategory::kParameters, where).current, reported[1])
        << "the decoded copy is freed at release";
    in.quantized_nontrainable_weights = false;
    EXPECT_EQ(estimate_now.transient_device_bytes - estimate(in).transient_device_bytes,
              kFrozen * 4);
  }
  const std::int64_t encoding = (detail::quantized_bytes(kFrozen, QuantBits::kInt8) + 3) / 4 * 4;
  EXPECT_EQ(reported[0] - reported[1], kFrozen * 4 - encoding);
  EXPECT_EQ(estimated[0] - estimated[1], reported[0] - reported[1]);
  EXPECT_EQ(estimated[1], reported[1]);
  std::printf("frozen table of %lld fp32: %lld bytes, %lld as int8 blocks (%.4fx)\n",
              static_cast<long long>(kFrozen), static_cast<long long>(kFrozen * 4),
              static_cast<long long>(encoding), static_cast<double>(encoding) / (kFrozen * 4));
}

TEST(QuantizedFrozenWeightsConfig, NonFiniteFrozenValuesAreRefusedNamingTheParameter) {
  for (const DType dtype : {DType::kFloat32, DType::kFloat16}) {
    Config config = frozen_config(true, DType::kFloat32);
    config.fp16.enabled = dtype == DType::kFloat16;
    Engine engine = make_engine(config, decayed_adamw());
    const auto tensors = frozen_toy_tensors();
    const auto handles = register_toy(engine, tensors);
    const std::vector<char> before = gathered_bytes(engine, handles[2]);
    std::vector<float> values(tensors[2].numel, 0.25f);
    // NaN in fp32; under fp16 a finite fp32 value past fp16's range, which rounds to inf.
    values[300] = dtype == DType::kFloat16 ? 1e6f : std::nanf("");
    try {
      handles[2].copy_from(values);
      FAIL() << "a non-finite frozen value was stored";
    } catch (const UsageError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("'frozen.table'"), std::string::npos) << what;
      EXPECT_NE(what.find("element 300"), std::string::npos) << what;
    }
    EXPECT_EQ(gathered_bytes(engine, handles[2]), before) << "the refused values were stored";
  }
}

TEST(QuantizedFrozenWeightsConfig, StageTwoIsRefusedByName) {
  try {
    Engine engine = make_engine(frozen_config(true, DType::kFloat32, 2), decayed_adamw());
    FAIL() << "stage 2 with zero_quantized_nontrainable_weights was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.zero_quantized_nontrainable_weights");
  }
}

// With qwZ too, the trainable parameters travel as int8 blocks and the frozen ones stay int8 blocks
// in memory; neither changes the other's values.
TEST(QuantizedFrozenWeightsConfig, ComposesWithQuantizedWeightGathers) {
  Config config = frozen_config(true, DType::kFloat32);
  config.zero_optimization.quantized_weights = true;
  Engine engine = make_engine(config, decayed_adamw());
  const auto tensors = frozen_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  for (int step = 0; step < 2; ++step) {
    micro_step_reading_the_table(engine, tensors, handles, step);
    EXPECT_TRUE(engine.step().updated);
  }
  for (const int k : {2, 5}) {
    const Expected e = expected_values(k, tensors[k].numel, DType::kFloat32);
    EXPECT_EQ(gathered_bytes(engine, handles[k]), e.decoded) << tensors[k].name;
  }
}

// The same folder name on every rank, new for each run.
std::string shared_dir(Engine& engine, const std::string& name) {
  const std::vector<std::string> pids =
      engine.communicator().all_gather_text(std::to_string(::getpid()));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("zeroshard-frozen-" + name + "-np" + std::to_string(engine.world_size()) + "-" + pids[0]);
  engine.communicator().barrier();
  if (engine.rank() == 0) std::filesystem::remove_all(dir);
  engine.communicator().barrier();
  return dir.string();
}

// A checkpoint holds the decoded values: loaded with the key they are encoded again (what the
// gather shows is those values quantized and dequantized), without it they are read as saved.
TEST_P(QuantizedFrozenWeights, CheckpointsKeepTheDecodedValues) {
  const DType dtype = GetParam();
  const auto tensors = frozen_toy_tensors();
  Engine saved = make_engine(frozen_config(true, dtype), decayed_adamw());
  const auto saved_handles = register_toy(saved, tensors);
  toy_micro_step_any_precision(saved, tensors, saved_handles, 0);
  saved.step();
  const std::string dir = shared_dir(saved, name_of(dtype));
  saved.save_checkpoint(dir, "t");
  for (const bool quantized : {true, false}) {
    Engine loaded = make_engine(frozen_config(quantized, dtype), decayed_adamw());
    const auto handles = register_toy(loaded, tensors);
    loaded.load_checkpoint(dir, "t");
    for (const int k : {2, 5}) {
      const std::vector<char> before = gathered_bytes(saved, saved_handles[k]);
      std::vector<char> want = before;
      if (quantized) {
        std::vector<char> encoded(detail::quantized_bytes(tensors[k].numel, QuantBits::kInt8));
        ASSERT_EQ(detail::quantize_blocks(before.data(), dtype, tensors[k].numel, QuantBits::kInt8,
                                          encoded.data()),
                  0);
        detail::dequantize_blocks(encoded.data(), QuantBits::kInt8, tensors[k].numel, want.data(),
                                  dtype);
      }
      EXPECT_EQ(gathered_bytes(loaded, handles[k]), want)
          << tensors[k].name << (quantized ? " (key on)" : " (key off)");
      if (quantized && loaded.rank() == 0) {
        std::printf("frozen %s %s: decoded again after a checkpoint %s\n", name_of(dtype),
                    tensors[k].name.c_str(),
                    want == before ? "unchanged (encoding is idempotent here)" : "changed");
      }
    }
    EXPECT_EQ(loaded.consolidated_parameters(), saved.consolidated_parameters());
  }
  saved.communicator().barrier();
  if (saved.rank() == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, QuantizedFrozenWeights,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace
}  // namespace zeroshard::testing
