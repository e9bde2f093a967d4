// Every instruction-set path of the CPU update rules against the scalar reference, bit for bit,
// on sizes that are not multiples of any vector width, and on a shard large enough to be split
// over threads; and the fused call (16-bit gradient, gradient factor, 16-bit copy, the gradient
// cleared as it is read) against the same work done in three passes; the gradient scan's lanes on
// every path, and its sum the same on any number of threads.
#include "kernels/cpu/cpu_optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "precision/half_conversion.h"
#include "zeroshard/dtype.h"
#include "zeroshard/error.h"

namespace zeroshard::detail::cpu_optimizer {
namespace {

struct Shard {
  std::vector<float> param;
  std::vector<float> grad;
  std::vector<std::vector<float>> states;
  std::vector<float*> state_pointers;

  // Values from a multiplicative hash: cheap for a million elements, varied in sign and scale.
  Shard(std::int64_t n, int state_count, std::uint32_t seed) {
    const auto value = [seed](std::int64_t i, std::uint32_t stream, float scale) {
      const std::uint32_t h =
          (static_cast<std::uint32_t>(i) + seed * 7919u + stream * 104729u) * 2654435761u;
      return scale * (static_cast<float>(h >> 8) / 8388608.0f - 1.0f);
    };
    for (std::int64_t i = 0; i < n; ++i) {
      param.push_back(value(i, 0, 1.0f));
      grad.push_back(value(i, 1, 1e-2f));
    }
    // Grads of exactly zero exercise Lion's sign(0) and Adagrad's first step.
    if (n > 3) grad[3] = 0.0f;
    for (int s = 0; s < state_count; ++s) {
      std::vector<float> state(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        // Non-negative: second moments and sums must be.
        state[i] = s == 0 ? 1e-3f + value(i, 2, 1e-3f) : 1e-4f + value(i, 3 + s, 1e-4f);
      }
      states.push_back(std::move(state));
    }
    for (auto& state : states) state_pointers.push_back(state.data());
  }

  RuleArrays arrays() {
    return {.param = param.data(), .grad = grad.data(), .states = state_pointers.data()};
  }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One rule: its state count and a call that runs it on a path.
struct RuleCase {
  std::string name;
  int state_count;
  std::function<void(Isa, const RuleArrays&, std::int64_t)> run;
};

std::vector<RuleCase> rule_cases() {
  const AdamScalars adam_scalars{.weight_factor = 1.0f - 1e-3f * 0.1f,
                                 .l2 = 0.0f,
                                 .beta1 = 0.9f,
                                 .one_minus_beta1 = 0.1f,
                                 .beta2 = 0.999f,
                                 .one_minus_beta2 = 1.0f - 0.999f,
                                 .step_size = 1e-3f / (1.0f - 0.9f * 0.9f * 0.9f),
                                 .inv_bias_correction2_sqrt = 1.0f / 0.0547f,
                                 .eps = 1e-8f};
  AdamScalars adam_l2 = adam_scalars;
  adam_l2.weight_factor = 1.0f;
  adam_l2.l2 = 0.01f;
  const SgdScalars sgd_scalars{
      .neg_lr = -0.1f, .weight_decay = 0.01f, .keep = 0.9f, .take = 0.9f, .momentum = 0.9f};
  const LionScalars lion_scalars{.weight_factor = 1.0f - 1e-4f * 0.1f,
                                 .lr = 1e-4f,
                                 .beta1 = 0.9f,
                                 .one_minus_beta1 = 0.1f,
                                 .beta2 = 0.99f,
                                 .one_minus_beta2 = 0.01f};
  const AdagradScalars adagrad_scalars{
      .neg_clr = -0.01f / 1.02f, .weight_decay = 0.01f, .sum_start = 0.1f, .eps = 1e-10f};
  return {
      {"adamw", 2,
       [=](Isa i, const RuleArrays& a, std::int64_t n) { adam(i, a, n, adam_scalars, false); }},
      {"adamw_amsgrad", 3,
       [=](Isa i, const RuleArrays& a, std::int64_t n) { adam(i, a, n, adam_scalars, true); }},
      {"adam_l2", 2,
       [=](Isa i, const RuleArrays& a, std::int64_t n) { adam(i, a, n, adam_l2, false); }},
      {"sgd", 0,
       [=](Isa i, const RuleArrays& a, std::int64_t n) {
         sgd(i, a, n, sgd_scalars, SgdKind::kPlain);
       }},
      {"sgd_momentum", 1,
       [=](Isa i, const RuleArrays& a, std::int64_t n) {
         sgd(i, a, n, sgd_scalars, SgdKind::kMomentum);
       }},
      {"sgd_nesterov", 1,
       [=](Isa i, const RuleArrays& a, std::int64_t n) {
         sgd(i, a, n, sgd_scalars, SgdKind::kNesterov);
       }},
      {"lion", 1, [=](Isa i, const RuleArrays& a, std::int64_t n) { lion(i, a, n, lion_scalars); }},
      {"adagrad", 1,
       [=](Isa i, const RuleArrays& a, std::int64_t n) { adagrad(i, a, n, adagrad_scalars); }},
  };
}

class CpuOptimizerPaths : public ::testing::TestWithParam<Isa> {};

TEST_P(CpuOptimizerPaths, EqualTheScalarReferenceBitForBitForEveryRule) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  // 1 and 15 stay inside one vector; 17 and 1001 leave remainders for 8 and 16 lanes; 2^20 + 5
  // is split into tiles over the OpenMP team.
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{15}, std::int64_t{17}, std::int64_t{1001},
                         (std::int64_t{1} << 20) + 5}) {
    for (const RuleCase& rule : rule_cases()) {
      Shard reference(n, rule.state_count, 7);
      Shard candidate(n, rule.state_count, 7);
      for (int step = 0; step < 3; ++step) {
        rule.run(Isa::kScalar, reference.arrays(), n);
        rule.run(isa, candidate.arrays(), n);
      }
      EXPECT_TRUE(bitwise_equal(candidate.param, reference.param))
          << rule.name << " on " << to_string(isa) << ", n = " << n << ": parameters differ";
      for (int s = 0; s < rule.state_count; ++s) {
        EXPECT_TRUE(bitwise_equal(candidate.states[s], reference.states[s]))
            << rule.name << " on " << to_string(isa) << ", n = " << n << ": state " << s
            << " differs";
      }
      EXPECT_FALSE(bitwise_equal(candidate.param, Shard(n, rule.state_count, 7).param))
          << rule.name << ": the update changed nothing";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CpuOptimizerPaths,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST_P(CpuOptimizerPaths, SquareSumsEqualTheScalarLanesBitForBitInOneCallOrSeveral) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{15}, std::int64_t{17}, std::int64_t{1001},
                         (std::int64_t{1} << 20) + 5}) {
    const Shard shard(n, 0, 11);
    const std::vector<float>& values = shard.grad;
    double reference[kSquareLanes] = {};
    add_square_sums(Isa::kScalar, values.data(), n, reference);
    // Each lane is its elements' squares added in element order, as written out here.
    for (int lane = 0; lane < kSquareLanes; ++lane) {
      double want = 0.0;
      for (std::int64_t i = lane; i < n; i += kSquareLanes) {
        const double v = values[static_cast<std::size_t>(i)];
        want += v * v;
      }
      EXPECT_EQ(std::bit_cast<std::uint64_t>(reference[lane]), std::bit_cast<std::uint64_t>(want))
          << "scalar lane " << lane << ", n = " << n;
    }
    double whole[kSquareLanes] = {};
    add_square_sums(isa, values.data(), n, whole);
    // Split at multiples of 16, as a scan of 16-bit values in blocks calls it.
    double pieces[kSquareLanes] = {};
    for (std::int64_t done = 0; done < n; done += 1024) {
      add_square_sums(isa, values.data() + done, std::min<std::int64_t>(1024, n - done), pieces);
    }
    for (int lane = 0; lane < kSquareLanes; ++lane) {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(whole[lane]),
                std::bit_cast<std::uint64_t>(reference[lane]))
          << to_string(isa) << " lane " << lane << ", n = " << n;
      EXPECT_EQ(std::bit_cast<std::uint64_t>(pieces[lane]),
                std::bit_cast<std::uint64_t>(reference[lane]))
          << to_string(isa) << " in pieces, lane " << lane << ", n = " << n;
    }
  }
}

// --- The fused call against three passes ------------------------------------------------------

// `values` stored as `dtype`, rounded to nearest even.
std::vector<unsigned char> stored_as(const std::vector<float>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * size_of(dtype));
  convert_from_float_portable(values.data(), bytes.data(), dtype,
                              static_cast<std::int64_t>(values.size()));
  return bytes;
}

// The index of the first element whose bits differ, or -1: memcmp on the bit patterns, so a NaN
// equals a NaN only with the same sign and payload.
std::int64_t first_difference(const void* a, const void* b, std::int64_t n, std::size_t size) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  if (std::memcmp(x, y, static_cast<std::size_t>(n) * size) == 0) return -1;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::memcmp(x + i * size, y + i * size, size) != 0) return i;
  }
  return -1;
}

// A gradient with the values a conversion or the factor can get wrong: a signalling NaN with a
// payload, infinities, an fp16 subnormal, a value that overflows fp16, a bf16 rounding tie.
std::vector<float> awkward_gradient(const Shard& shard) {
  std::vector<float> grad = shard.grad;
  const float specials[] = {std::bit_cast<float>(0x7FA00001u),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            3e-6f,
                            -70000.0f,
                            std::bit_cast<float>(0x3C018000u)};
  // Spread over the shard so that more than one lane and chunk holds one.
  for (std::size_t k = 0; k < std::size(specials); ++k) {
    const std::size_t at = 5 + k * 997;
    if (at < grad.size()) grad[at] = specials[k];
  }
  return grad;
}

struct Storage {
  DType grad_dtype;
  std::optional<DType> copy_dtype;
  float factor;
  bool clear = false;  ///< the call zeroes the gradient as it reads it (grad_to_clear)
};

std::string describe(const RuleCase& rule, Isa isa, std::int64_t n, const Storage& io) {
  return rule.name + " on " + to_string(isa) + ", n = " + std::to_string(n) + ", grad " +
         to_string(io.grad_dtype) + ", copy " +
         (io.copy_dtype ? to_string(*io.copy_dtype) : "none") + ", factor " +
         std::to_string(io.factor) + (io.clear ? ", clearing the gradient" : "");
}

// Two steps of `rule` on `isa` in one fused call each, against two steps of the scalar path in
// three passes: widen the stored gradient and multiply it by the factor, the fp32 update, convert
// the weights. Parameters, states and the copy must agree bit for bit; the fused call's gradient
// is all zero afterwards when it clears it, and untouched otherwise.
void expect_fused_equals_three_passes(const RuleCase& rule, Isa isa, std::int64_t n,
                                      const Storage& io) {
  const std::string what = describe(rule, isa, n, io);
  Shard reference(n, rule.state_count, 11);
  Shard fused(n, rule.state_count, 11);
  const std::vector<unsigned char> stored_grad =
      stored_as(awkward_gradient(reference), io.grad_dtype);
  const DType copy_dtype = io.copy_dtype.value_or(DType::kFloat32);
  const std::size_t copy_size = size_of(copy_dtype);
  std::vector<unsigned char> reference_copy(static_cast<std::size_t>(n) * copy_size);
  // Filled with a value no conversion writes for these weights, so an element left unwritten
  // shows.
  std::vector<unsigned char> fused_copy(reference_copy.size(), 0xA5);
  std::vector<float> widened(static_cast<std::size_t>(n));
  for (int step = 0; step < 2; ++step) {
    convert_to_float_portable(stored_grad.data(), io.grad_dtype, widened.data(), n);
    for (float& g : widened) g = g * io.factor;
    rule.run(Isa::kScalar,
             {.param = reference.param.data(),
              .grad = widened.data(),
              .states = reference.state_pointers.data()},
             n);
    if (io.copy_dtype) {
      convert_from_float_portable(reference.param.data(), reference_copy.data(), copy_dtype, n);
    }
    std::vector<unsigned char> fused_grad = stored_grad;
    rule.run(isa,
             {.param = fused.param.data(),
              .grad = fused_grad.data(),
              .states = fused.state_pointers.data(),
              .grad_dtype = io.grad_dtype,
              .grad_factor = io.factor,
              .param_copy = io.copy_dtype ? fused_copy.data() : nullptr,
              .param_copy_dtype = copy_dtype,
              .grad_to_clear = io.clear ? fused_grad.data() : nullptr},
             n);
    EXPECT_EQ(fused_grad,
              io.clear ? std::vector<unsigned char>(stored_grad.size(), 0) : stored_grad)
        << what << (io.clear ? ": the gradient was not cleared" : ": the gradient was written");
  }
  EXPECT_EQ(first_difference(fused.param.data(), reference.param.data(), n, sizeof(float)), -1)
      << what << ": parameters differ from this element on";
  for (int s = 0; s < rule.state_count; ++s) {
    EXPECT_EQ(
        first_difference(fused.states[s].data(), reference.states[s].data(), n, sizeof(float)), -1)
        << what << ": state " << s << " differs from this element on";
  }
  if (io.copy_dtype) {
    EXPECT_EQ(first_difference(fused_copy.data(), reference_copy.data(), n, copy_size), -1)
        << what << ": the parameter copy differs from this element on";
  } else {
    EXPECT_EQ(fused_copy, std::vector<unsigned char>(fused_copy.size(), 0xA5))
        << what << ": wrote a copy nobody asked for";
  }
  EXPECT_NE(first_difference(fused.param.data(), Shard(n, rule.state_count, 11).param.data(), n,
                             sizeof(float)),
            -1)
      << what << ": the update changed nothing";
}

class CpuOptimizerFusedPaths : public ::testing::TestWithParam<Isa> {};

TEST_P(CpuOptimizerFusedPaths, EqualWideningScalingUpdatingAndConvertingInThreePasses) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  const std::optional<DType> copies[] = {std::nullopt, DType::kFloat16, DType::kBFloat16,
                                         DType::kFloat32};
  // 1, 7 and 33 leave remainders for 8 and 16 lanes; 2049 and 4100 end one element and a few
  // past a whole number of conversion chunks.
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{33}, std::int64_t{2049},
                         std::int64_t{4100}}) {
    for (const RuleCase& rule : rule_cases()) {
      for (DType grad_dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        for (const std::optional<DType>& copy : copies) {
          for (float factor : {1.0f, 0.37f}) {
            for (bool clear : {false, true}) {
              expect_fused_equals_three_passes(rule, isa, n, {grad_dtype, copy, factor, clear});
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuOptimizerFusedPaths, EqualThreePassesOnAShardSplitOverThreads) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  // Past the threading threshold (2^20), ending inside a tile and inside a chunk. Each rule takes
  // one of the gradient types, so that all three cross the threads without 24 runs of a million.
  const std::int64_t n = (std::int64_t{1} << 20) + 2053;
  const DType grad_dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const std::vector<RuleCase> rules = rule_cases();
  for (std::size_t r = 0; r < rules.size(); ++r) {
    const DType grad_dtype = grad_dtypes[r % 3];
    const DType copy = grad_dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
    expect_fused_equals_three_passes(rules[r], isa, n, {grad_dtype, copy, 0.37f, r % 2 == 0});
  }
}

// Adam with no step (step_size 0, no decay) writes the copy of weights it leaves unchanged, so the
// copy is the conversion alone of the weights it returns: every path must give
// half_conversion.cpp's bits for weights sampled across all float bit patterns (an odd stride, so
// every exponent and many mantissas), plus the edges of each type's rounding: ties, the last finite
// value, the subnormal range and its boundary, infinities, NaNs with payloads, signed zeros.
TEST_P(CpuOptimizerFusedPaths, FusedCopiesAreHalfConversionsOfEveryKindOfWeight) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  std::vector<float> weights;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 65537) {
    weights.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  }
  for (std::uint32_t edge :
       {0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x7F7FFFFFu, 0x7F800000u, 0x7F800001u,
        0x7FC00000u, 0x7FA01234u, 0x38800000u, 0x387FFFFFu, 0x387FF000u, 0x33800000u, 0x33000000u,
        0x33000001u, 0x33C00000u, 0x34200000u, 0x00000001u, 0x80000000u, 0x00000000u, 0x3F808000u,
        0x3F818000u, 0x3F807FFFu, 0x3F800FFFu, 0x3F801000u, 0x3F803000u}) {
    weights.push_back(std::bit_cast<float>(edge));
    weights.push_back(std::bit_cast<float>(edge | 0x80000000u));
  }
  const auto n = static_cast<std::int64_t>(weights.size());
  const std::vector<float> grad(weights.size(), 0.0f);
  const AdamScalars no_step{.weight_factor = 1.0f,
                            .l2 = 0.0f,
                            .beta1 = 0.9f,
                            .one_minus_beta1 = 0.1f,
                            .beta2 = 0.999f,
                            .one_minus_beta2 = 1.0f - 0.999f,
                            .step_size = 0.0f,
                            .inv_bias_correction2_sqrt = 1.0f,
                            .eps = 1e-8f};
  for (DType copy_dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> param = weights;
    std::vector<float> exp_avg(weights.size(), 0.0f);
    std::vector<float> exp_avg_sq(weights.size(), 0.0f);
    float* states[] = {exp_avg.data(), exp_avg_sq.data()};
    std::vector<std::uint16_t> copy(weights.size(), 0xA5A5);
    adam(isa,
         {.param = param.data(),
          .grad = grad.data(),
          .states = states,
          .param_copy = copy.data(),
          .param_copy_dtype = copy_dtype},
         n, no_step, false);
    // The weights as the update left them: the same bits but for infinities, which 0 * inf in
    // the decay term turns into NaN.
    std::vector<std::uint16_t> expected(weights.size());
    convert_from_float_portable(param.data(), expected.data(), copy_dtype, n);
    const std::int64_t at = first_difference(copy.data(), expected.data(), n, 2);
    EXPECT_EQ(at, -1) << to_string(copy_dtype) << " copy on " << to_string(isa)
                      << ": weight bits 0x" << std::hex
                      << (at < 0 ? 0u : std::bit_cast<std::uint32_t>(weights[at])) << " gave 0x"
                      << (at < 0 ? 0 : copy[at]) << ", expected 0x" << (at < 0 ? 0 : expected[at]);
  }
}

// Every 16-bit pattern as a gradient, read by Adam with beta1 0: the first moment is then
// 0 * m + 1 * g of the widened gradient, which the test computes from half_conversion.cpp's
// widening with the same two operations (they turn -0 into +0 and quiet a NaN alike).
TEST_P(CpuOptimizerFusedPaths, FusedGradientsAreHalfConversionsOfEveryPattern) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  constexpr std::int64_t n = 65536;
  std::vector<std::uint16_t> patterns(n);
  for (std::int64_t i = 0; i < n; ++i) patterns[i] = static_cast<std::uint16_t>(i);
  const AdamScalars first_moment_is_the_gradient{.weight_factor = 1.0f,
                                                 .l2 = 0.0f,
                                                 .beta1 = 0.0f,
                                                 .one_minus_beta1 = 1.0f,
                                                 .beta2 = 0.999f,
                                                 .one_minus_beta2 = 1.0f - 0.999f,
                                                 .step_size = 1e-3f,
                                                 .inv_bias_correction2_sqrt = 1.0f,
                                                 .eps = 1e-8f};
  for (DType grad_dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<float> param(n, 0.5f);
    std::vector<float> exp_avg(n, 0.25f);
    std::vector<float> exp_avg_sq(n, 0.0f);
    float* states[] = {exp_avg.data(), exp_avg_sq.data()};
    std::vector<std::uint16_t> copy(n);
    std::vector<std::uint16_t> grad = patterns;
    adam(isa,
         {.param = param.data(),
          .grad = grad.data(),
          .states = states,
          .grad_dtype = grad_dtype,
          .param_copy = copy.data(),
          .param_copy_dtype = grad_dtype},
         n, first_moment_is_the_gradient, false);
    std::vector<float> widened(n);
    convert_to_float_portable(patterns.data(), grad_dtype, widened.data(), n);
    std::vector<float> expected(n);
    for (std::int64_t i = 0; i < n; ++i) expected[i] = 0.0f * 0.25f + 1.0f * widened[i];
    const std::int64_t at = first_difference(exp_avg.data(), expected.data(), n, sizeof(float));
    EXPECT_EQ(at, -1) << to_string(grad_dtype) << " gradient on " << to_string(isa)
                      << ": pattern 0x" << std::hex << at;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CpuOptimizerFusedPaths,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// --- The gradient norm's scan over threads ---------------------------------------------------

// Sets the OpenMP team's size for one scope and restores it after.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreads() { omp_set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// The scan of `values` stored as `dtype` on 1 to 4 threads (3 and 4 oversubscribe a 2-core
// machine): the bits of each against the first's, which `expect` then checks.
void expect_scan_independent_of_threads(Isa isa, const std::vector<float>& values, DType dtype,
                                        const std::function<void(double)>& expect) {
  const std::vector<unsigned char> stored = stored_as(values, dtype);
  const auto n = static_cast<std::int64_t>(values.size());
  std::optional<double> first;
  for (int threads = 1; threads <= 4; ++threads) {
    const ScopedThreads scope(threads);
    const double sum = sum_of_squares(isa, stored.data(), dtype, n);
    if (!first) {
      first = sum;
      expect(sum);
    }
    EXPECT_EQ(std::bit_cast<std::uint64_t>(sum), std::bit_cast<std::uint64_t>(*first))
        << to_string(isa) << ", " << to_string(dtype) << ", " << threads << " threads";
  }
}

class CpuOptimizerScanPaths : public ::testing::TestWithParam<Isa> {};

TEST_P(CpuOptimizerScanPaths, GivesTheSameBitsOnAnyThreadCountAndPathAndMatchesDouble) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  // Past the threading threshold (2^20), ending inside a tile and off a multiple of 16.
  const std::int64_t n = (std::int64_t{1} << 20) + 2053;
  const Shard shard(n, 0, 5);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    // The values as the scan sees them, widened, squared and added in element order in double.
    const std::vector<unsigned char> stored = stored_as(shard.grad, dtype);
    std::vector<float> widened(shard.grad.size());
    convert_to_float_portable(stored.data(), dtype, widened.data(), n);
    double want = 0.0;
    for (float value : widened) want += static_cast<double>(value) * value;
    const double scalar = sum_of_squares(Isa::kScalar, stored.data(), dtype, n);
    expect_scan_independent_of_threads(isa, shard.grad, dtype, [&](double sum) {
      // Two sums of a million positive terms in double differ by a few ulps per thousand terms.
      EXPECT_NEAR(sum, want, want * 1e-12) << to_string(isa) << ", " << to_string(dtype);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(sum), std::bit_cast<std::uint64_t>(scalar))
          << to_string(isa) << " against the scalar path, " << to_string(dtype);
    });
  }
}

TEST_P(CpuOptimizerScanPaths, KeepsEachSixteenBitLaneAsItsElementsSquaresInElementOrder) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  // The vector paths hold 16-bit lanes in another order than the fp32 ones (the AVX-512 path's
  // bf16 lanes 4-7 after 8-11); a total can round alike with two lanes swapped, a lane cannot.
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{15}, std::int64_t{16}, std::int64_t{17},
                         std::int64_t{33}, std::int64_t{1001}, std::int64_t{65535}}) {
    const Shard shard(n, 0, 17);
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      const std::vector<unsigned char> stored = stored_as(shard.grad, dtype);
      std::vector<float> widened(shard.grad.size());
      convert_to_float_portable(stored.data(), dtype, widened.data(), n);
      SquareSums sums;  // fewer than a tile's elements: they stay in its lanes
      add_sum_of_squares(isa, stored.data(), dtype, n, sums);
      for (int lane = 0; lane < kSquareLanes; ++lane) {
        double want = 0.0;
        for (std::int64_t i = lane; i < n; i += kSquareLanes) {
          const double v = widened[static_cast<std::size_t>(i)];
          want += v * v;
        }
        EXPECT_EQ(std::bit_cast<std::uint64_t>(sums.lanes[lane]),
                  std::bit_cast<std::uint64_t>(want))
            << to_string(isa) << ", " << to_string(dtype) << ", lane " << lane << ", n = " << n;
      }
    }
  }
}

TEST_P(CpuOptimizerScanPaths, RangesAddedInTurnSumAsOneRange) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  // Past the threading threshold, so whole tiles run threaded between the cuts; cuts inside a
  // tile, on a tile's edge, and ranges shorter than a tile.
  const std::int64_t n = (std::int64_t{1} << 20) + (std::int64_t{3} << 16) + 2053;
  const std::vector<std::int64_t> cuts = {0,      48,        (1 << 16) - 16, 1 << 16,
                                          70'000, 1'200'000, n - 32,         n};
  const Shard shard(n, 0, 13);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::vector<unsigned char> stored = stored_as(shard.grad, dtype);
    const double whole = sum_of_squares(isa, stored.data(), dtype, n);
    SquareSums sums;
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
      add_sum_of_squares(isa, stored.data() + cuts[c] * size_of(dtype), dtype,
                         cuts[c + 1] - cuts[c], sums);
    }
    EXPECT_EQ(std::bit_cast<std::uint64_t>(sums.total()), std::bit_cast<std::uint64_t>(whole))
        << to_string(isa) << ", " << to_string(dtype);
  }
}

TEST_P(CpuOptimizerScanPaths, TileSumsTakenApartAddAsTheScanAddsThem) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  // The engine takes some tiles' sums as their gradients land and scans the rest at the step: a
  // range scanned with a tile left unfinished, then tiles added from tile_square_sums(), whole
  // tiles scanned again, and a tail, sums as the one range does. 20 tiles pass the threading
  // threshold.
  constexpr std::int64_t kTile = kSquareTile;
  const std::int64_t n = 20 * kTile + 5 * kTile + 777;
  const Shard shard(n, 0, 21);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const std::vector<unsigned char> stored = stored_as(shard.grad, dtype);
    const auto at = [&](std::int64_t i) { return stored.data() + i * size_of(dtype); };
    const double whole = sum_of_squares(isa, stored.data(), dtype, n);
    std::vector<double> tiles(20);
    tile_square_sums(isa, at(kTile), dtype, 20, tiles.data());
    for (std::int64_t t = 0; t < 20; ++t) {
      const double alone = sum_of_squares(isa, at((1 + t) * kTile), dtype, kTile);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(tiles[static_cast<std::size_t>(t)]),
                std::bit_cast<std::uint64_t>(alone))
          << to_string(isa) << ", " << to_string(dtype) << ", tile " << t;
    }
    SquareSums sums;
    add_sum_of_squares(isa, at(0), dtype, 1000, sums);
    add_sum_of_squares(isa, at(1000), dtype, kTile - 1000, sums);
    sums.add_tiles(tiles);
    add_sum_of_squares(isa, at(21 * kTile), dtype, 4 * kTile, sums);
    add_sum_of_squares(isa, at(25 * kTile), dtype, n - 25 * kTile, sums);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(sums.total()), std::bit_cast<std::uint64_t>(whole))
        << to_string(isa) << ", " << to_string(dtype);
  }
}

TEST_P(CpuOptimizerScanPaths, FindsANonFiniteValueInAnyTileOnAnyThreadCount) {
  const Isa isa = GetParam();
  if (!supported(isa)) GTEST_SKIP() << "this CPU has no " << to_string(isa) << " path";
  const std::int64_t n = (std::int64_t{1} << 20) + 2053;
  const Shard shard(n, 0, 9);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // In a middle tile, in the last (partial) tile, and a NaN beside an infinity.
  for (const auto& [at, value] :
       {std::pair{std::int64_t{9} * 65536 + 77, inf}, std::pair{n - 1, -inf},
        std::pair{std::int64_t{12} * 65536, nan}}) {
    std::vector<float> values = shard.grad;
    values[static_cast<std::size_t>(at)] = value;
    if (value != value) values[3] = inf;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      expect_scan_independent_of_threads(isa, values, dtype, [&](double sum) {
        EXPECT_FALSE(std::isfinite(sum)) << to_string(isa) << ", " << to_string(dtype) << ", "
                                         << value << " at " << at << ": " << sum;
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CpuOptimizerScanPaths,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(CpuOptimizerIsa, TheActivePathIsOneThisCpuSupports) {
  EXPECT_TRUE(supported(active_isa())) << to_string(active_isa());
}

TEST(CpuOptimizerIsa, AnUnsupportedPathIsAUsageErrorNotACrash) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (supported(isa)) continue;
    Shard shard(16, 2, 1);
    EXPECT_THROW(adam(isa, shard.arrays(), 16, {}, false), UsageError) << to_string(isa);
  }
}

}  // namespace
}  // namespace zeroshard::detail::cpu_optimizer
