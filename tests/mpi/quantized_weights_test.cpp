// qwZ (zero_quantized_weights): stage 3's gathers carry each rank's piece as int8 blocks and every
// rank reads the same dequantized values; training stays close to the unquantized run, the
// gathers' bytes meet issue #29's targets, and the key is refused below stage 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/block_quantizer.h"  // quantize_blocks, dequantize_blocks: the CPU reference
#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

using detail::QuantBits;

Config quantized_config(bool quantized, DType dtype) {
  Config config = toy_config(3);
  // Every tensor is gathered (none is persistent), so every value the model reads went through
  // the quantizer.
  config.zero_optimization.param_persistence_threshold = 0;
  config.zero_optimization.quantized_weights = quantized;
  config.bf16.enabled = dtype == DType::kBFloat16;
  return config;
}

// The modules of a model, each as the flat range [begin, end) its parameters span.
struct ModuleSpan {
  ModuleId id;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

std::vector<ModuleSpan> module_spans(const Engine& engine, const std::vector<Parameter>& handles) {
  std::vector<ModuleSpan> spans;
  for (const Parameter& p : handles) {
    if (!p.trainable()) continue;
    const std::int64_t lo = engine.flat_offset(p);
    const std::int64_t hi = lo + p.numel();
    if (spans.empty() || spans.back().id != p.module()) {
      spans.push_back({p.module(), lo, hi});
    } else {
      spans.back().end = std::max(spans.back().end, hi);
    }
  }
  return spans;
}

class QuantizedWeights : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizedWeights, GatheredValuesAreEachRanksPieceQuantizedAndDequantized) {
  const DType dtype = GetParam();
  Engine engine = make_engine(quantized_config(true, dtype), decayed_adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  const auto dsize = static_cast<std::int64_t>(size_of(dtype));
  const std::int64_t world = engine.world_size();
  const std::int64_t shard = engine.padded_numel() / world;
  // The flat buffer in the model's type as every rank's shard holds it: the initial values at
  // their offsets, zeros in the padding.
  std::vector<char> flat(engine.padded_numel() * dsize, 0);
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    std::vector<float> values(tensors[k].numel);
    for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
      values[i] = initial_value(static_cast<int>(k), i);
    }
    detail::convert_from_float(values.data(), flat.data() + engine.flat_offset(handles[k]) * dsize,
                               dtype, tensors[k].numel);
  }
  // What qwZ must show: each rank's piece of a module's range encoded on its own (its blocks
  // start where the piece starts) and decoded. The expectation is the same on every rank, so
  // matching it bit for bit on each rank is every rank seeing the same bytes.
  std::vector<char> expected = flat;
  for (const ModuleSpan& span : module_spans(engine, handles)) {
    for (std::int64_t r = 0; r < world; ++r) {
      const std::int64_t lo = std::max(span.begin, r * shard);
      const std::int64_t hi = std::min(span.end, (r + 1) * shard);
      if (hi <= lo) continue;
      std::vector<char> encoded(detail::quantized_bytes(hi - lo, QuantBits::kInt8));
      ASSERT_EQ(detail::quantize_blocks(flat.data() + lo * dsize, dtype, hi - lo, QuantBits::kInt8,
                                        encoded.data()),
                0);
      detail::dequantize_blocks(encoded.data(), QuantBits::kInt8, hi - lo,
                                expected.data() + lo * dsize, dtype);
    }
  }
  if (engine.rank() == 0) {
    std::vector<float> stored(flat.size() / dsize);
    std::vector<float> decoded(stored.size());
    detail::convert_to_float(flat.data(), dtype, stored.data(), stored.size());
    detail::convert_to_float(expected.data(), dtype, decoded.data(), decoded.size());
    double largest = 0.0;
    for (std::size_t i = 0; i < stored.size(); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(decoded[i]) - stored[i]));
    }
    std::printf("qwZ %s: largest |gathered - stored| weight: %.6g (weights within [-0.5, 0.5])\n",
                dtype == DType::kBFloat16 ? "bf16" : "fp32", largest);
  }
  bool quantization_changed_a_value = false;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    auto guard = engine.gathered(handles[k].module());
    const std::size_t bytes = tensors[k].numel * dsize;
    const std::vector<char> seen = to_host(engine, handles[k].raw_data(), bytes);
    const char* want = expected.data() + engine.flat_offset(handles[k]) * dsize;
    EXPECT_EQ(std::memcmp(seen.data(), want, bytes), 0) << tensors[k].name;
    const char* original = flat.data() + engine.flat_offset(handles[k]) * dsize;
    quantization_changed_a_value |= std::memcmp(seen.data(), original, bytes) != 0;
  }
  EXPECT_TRUE(quantization_changed_a_value) << "the gathered values are the unquantized ones";
}

// Training for kSteps steps with qwZ moves the fp32 master away from the unquantized run's by at
// most kBound, and by something: the model reads quantized weights, so its gradients differ.
TEST_P(QuantizedWeights, TrainingStaysCloseToTheUnquantizedRun) {
  const DType dtype = GetParam();
  constexpr int kSteps = 6;
  // Each decoded weight is within max|block| / 254 of the stored one (under 0.002 for the toy's
  // weights of magnitude <= 0.5), so the gradients 0.75 w + data, rounded to 2^-10, differ by
  // about 2^-10 where they differ at all; AdamW's normalised update of size lr = 0.01 then moves
  // by about lr * 2^-10 relative to gradients of order 1 per step, 6e-5 over six steps. The bound
  // allows 16 times that (runs at 1-4 ranks measure 0.7-5.1e-5).
  constexpr double kBound = 1e-3;
  const MasterDifference difference = largest_master_difference(
      [dtype](bool quantized) { return quantized_config(quantized, dtype); },
      [](Engine& engine, const std::vector<ToyTensor>& tensors,
         const std::vector<Parameter>& handles,
         std::int64_t step) { toy_micro_step_any_precision(engine, tensors, handles, step); },
      uneven_toy_tensors(), kSteps);
  const double largest = difference.largest;
  const int rank = difference.rank;
  EXPECT_LE(largest, kBound);
  EXPECT_GT(largest, 0.0) << "qwZ trained bit for bit as without it: nothing was quantized";
  if (rank == 0) {
    std::printf("qwZ %s: largest |master - unquantized master| after %d steps: %.6g\n",
                dtype == DType::kBFloat16 ? "bf16" : "fp32", kSteps, largest);
  }
}

// The bytes of stage 3's gathers for one forward pass: int8 codes and one fp32 scale per 256
// elements, 0.254x of fp32 (0.508x of bf16) for large pieces; issue #29 asks <= 0.27x (0.53x).
TEST_P(QuantizedWeights, ForwardGathersSendAQuarterOfTheBytes) {
  const DType dtype = GetParam();
  // Pieces of thousands of elements: the scales and the padding to 4 bytes stay a small share.
  const std::vector<ToyTensor> tensors = {{"a.weight", 24576}, {"a.bias", 96},
                                          {"b.weight", 16384}, {"b.bias", 64},
                                          {"c.weight", 8192},  {"c.bias", 32}};
  std::int64_t gathered_bytes[2] = {};
  int rank = 0;
  for (const bool quantized : {false, true}) {
    Engine engine = make_engine(quantized_config(quantized, dtype), decayed_adamw());
    rank = engine.rank();
    const auto handles = register_toy(engine, tensors);
    engine.communicator().reset_traffic();
    std::vector<ModuleId> order;
    for (const Parameter& p : handles) {
      if (order.empty() || order.back() != p.module()) order.push_back(p.module());
    }
    for (ModuleId m : order) {
      auto guard = engine.gathered(m);
    }
    const TrafficCounters& t = engine.communicator().traffic();
    gathered_bytes[quantized] = t.bytes[static_cast<int>(Collective::kAllGather)];
  }
  ASSERT_GT(gathered_bytes[0], 0);
  const double ratio = static_cast<double>(gathered_bytes[1]) / gathered_bytes[0];
  if (rank == 0) {
    std::printf("qwZ %s: forward gather bytes %lld (qwZ) / %lld = %.4f\n",
                dtype == DType::kBFloat16 ? "bf16" : "fp32",
                static_cast<long long>(gathered_bytes[1]),
                static_cast<long long>(gathered_bytes[0]), ratio);
  }
  EXPECT_LE(ratio, dtype == DType::kBFloat16 ? 0.53 : 0.27);
}

INSTANTIATE_TEST_SUITE_P(Precisions, QuantizedWeights,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16),
                         [](const auto& info) {
                           return info.param == DType::kBFloat16 ? "bf16" : "fp32";
                         });

// The estimator's transient bytes grow by what the engine's report shows for a gather's encoded
// area: one module, so one gather in flight, whose layout the estimate follows exactly.
TEST(QuantizedWeightsConfig, EstimatedEncodedBytesMatchTheReport) {
  const std::vector<ToyTensor> tensors = {{"a.weight", 4000}};
  std::int64_t peak[2] = {};
  std::int64_t estimated[2] = {};
  for (const bool quantized : {false, true}) {
    const Config config = quantized_config(quantized, DType::kFloat32);
    Engine engine = make_engine(config, decayed_adamw());
    const auto handles = register_toy(engine, tensors);
    { auto guard = engine.gathered(handles[0].module()); }
    peak[quantized] =
        engine.memory_report().at(MemoryCategory::kCommunication, engine_memory(engine)).peak;
    EstimateInput in = estimate_input_from_config(config, 0, engine.world_size());
    in.tensors = {4000};
    estimated[quantized] = estimate(in).transient_device_bytes;
  }
  EXPECT_GT(peak[1] - peak[0], 0);
  EXPECT_EQ(peak[1] - peak[0], estimated[1] - estimated[0]);
}

TEST(QuantizedWeightsConfig, StageTwoIsRefusedByName) {
  Config config = quantized_config(true, DType::kFloat32);
  config.zero_optimization.stage = 2;
  try {
    Engine engine = make_engine(config, decayed_adamw());
    FAIL() << "stage 2 with zero_quantized_weights was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.zero_quantized_weights");
  }
}

TEST(QuantizedWeightsConfig, NonFiniteParametersAreAUsageErrorNamingTheModuleAndRank) {
  Engine engine = make_engine(quantized_config(true, DType::kFloat32), decayed_adamw());
  const auto tensors = uneven_toy_tensors();
  const auto handles = register_toy(engine, tensors);
  std::vector<float> values(tensors[0].numel, std::nanf(""));
  handles[0].copy_from(values);
  // Only the ranks whose shard holds some of the NaN weights can see them; the others gather
  // zeros for those blocks, as the format decodes them.
  const std::int64_t lo = engine.flat_offset(handles[0]);
  const bool holds_nan = lo < engine.shard_end() && lo + tensors[0].numel > engine.shard_begin();
  try {
    engine.gather(handles[0].module());
    EXPECT_FALSE(holds_nan) << "a NaN weight was gathered";
    engine.release(handles[0].module());
  } catch (const UsageError& error) {
    EXPECT_TRUE(holds_nan) << error.what();
    const std::string what = error.what();
    EXPECT_NE(what.find("module 'a'"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(engine.rank())), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zeroshard::testing
