// Every instruction-set path of the CPU update rules against the scalar reference, bit for bit,
// on sizes that are not multiples of any vector width, and on a shard large enough to be split
// over threads.
#include "cpu_optimizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

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
