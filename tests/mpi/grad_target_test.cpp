// Parameter::grad_target(): a backward that writes its gradients instead of adding them into
// zeroed buffers trains bit for bit as one that adds, at every stage, precision, handover and
// accumulation window; the first fetch in a micro-step (slots) or window (whole gradients) says
// whether to write, a gradient never fetched counts as zero, the padding between gradients stays
// out of the sums, and whole gradients are zeroed at the step again as soon as one gradient is
// fetched by raw_grad().
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mpi/toy_model.h"

namespace zeroshard::testing {
namespace {

// Handed over without being fetched in every other micro-step: a parameter the step did not use.
constexpr std::size_t kSometimesUnused = 6;  // "c.bias"
// Added under Fetch::kAllButOneWritten: fetched by raw_grad() in every micro-step from slots;
// from whole gradients, whose address stays put, fetched once and added to through that address
// ever after, as a model that keeps the pointer does.
constexpr std::size_t kAlwaysAdded = 4;  // "b.bias"

enum class Fetch {
  kAdded,             ///< raw_grad() for every gradient
  kWritten,           ///< grad_target() for every gradient
  kAllButOneWritten,  ///< grad_target() but for kAlwaysAdded
  /// grad_target(), but raw_grad() for kAlwaysAdded in odd windows: with whole gradients, the
  /// window after an all-written one is left unzeroed, where raw_grad() must zero the place.
  kOneAddedInOddWindows,
};
// Fetched a second time after it was written, as a backward that adds a second use of it does.
constexpr std::size_t kFetchedTwice = 0;  // "a.weight"

struct Case {
  int stage = 0;
  DType dtype = DType::kFloat32;
  int accumulation = 1;
  GradHandover handover = GradHandover::kPerParameter;
};

std::string describe(const Case& c) {
  return "stage " + std::to_string(c.stage) + " " + to_string(c.dtype) + " accumulation " +
         std::to_string(c.accumulation) +
         (c.handover == GradHandover::kAtEnd ? " handover at end" : " handover per parameter");
}

Config case_config(const Case& c) {
  Config config = toy_config(c.stage);
  // Clipping makes the norm, and so every element of the sums padding included, reach the
  // parameters.
  config.gradient_clipping = 0.5;
  config.gradient_accumulation_steps = c.accumulation;
  config.fp16.enabled = c.dtype == DType::kFloat16;
  config.fp16.initial_scale_power = 4;
  config.bf16.enabled = c.dtype == DType::kBFloat16;
  return config;
}

bool slots_in_use(const Case& c) {
  return c.stage >= 2 && c.handover == GradHandover::kPerParameter;
}

// What grad_target() says at the first fetch of a micro-step: write into a slot; write into whole
// gradients at the first micro-step of a window when the last window wrote every gradient.
bool expected_accumulate(const Case& c, Fetch fetch, int step, int micro_in_window) {
  if (slots_in_use(c)) return false;
  if (fetch == Fetch::kAllButOneWritten || step == 0 || micro_in_window > 0) return true;
  return fetch == Fetch::kOneAddedInOddWindows && step % 2 == 0;
}

struct Trained {
  std::vector<float> parameters;
  std::vector<double> norms;
};

// Trains the toy model for `steps` windows, fetching each gradient as `fetch` says; after
// grad_target() the backward writes or adds as it is told.
Trained train(const Case& c, Fetch fetch, int steps) {
  AdamWOptions adamw;
  adamw.lr = 1e-2;
  Engine engine = make_engine(case_config(c), make_adamw(adamw));
  engine.set_grad_handover(c.handover);
  const std::vector<ToyTensor> tensors = uneven_toy_tensors();
  const std::vector<Parameter> handles = register_toy(engine, tensors);
  const DType dtype = engine.model_dtype();
  Trained run;
  void* kept_address = nullptr;
  std::int64_t micro = 0;
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < c.accumulation; ++m, ++micro) {
      const auto scale = static_cast<float>(engine.loss_scale());
      const bool unused_now = micro % 2 == 1;
      toy_backward(
          engine, tensors, handles,
          [&](std::size_t k) {
            if (k == kSometimesUnused && unused_now) return;
            const std::int64_t n = tensors[k].numel;
            const std::size_t bytes = n * size_of(dtype);
            const std::vector<char> raw_param = to_host(engine, handles[k].raw_data(), bytes);
            std::vector<float> w(n);
            detail::convert_to_float(raw_param.data(), dtype, w.data(), n);
            const bool writes =
                fetch == Fetch::kWritten ||
                (fetch == Fetch::kAllButOneWritten && k != kAlwaysAdded) ||
                (fetch == Fetch::kOneAddedInOddWindows && (k != kAlwaysAdded || step % 2 == 0));
            GradTarget target{kept_address, true};
            if (writes) {
              target = handles[k].grad_target();
            } else if (kept_address == nullptr || slots_in_use(c) || k != kAlwaysAdded) {
              target.data = handles[k].raw_grad();
              if (fetch == Fetch::kAllButOneWritten) kept_address = target.data;
            }
            if (writes) {
              EXPECT_EQ(target.accumulate, expected_accumulate(c, fetch, step, m))
                  << describe(c) << ", first fetch of " << tensors[k].name << " at step " << step
                  << ", micro-step " << m;
            }
            std::vector<float> g(n, 0.0f);
            std::vector<char> raw_grad(bytes);
            if (target.accumulate) {
              raw_grad = to_host(engine, target.data, bytes);
              detail::convert_to_float(raw_grad.data(), dtype, g.data(), n);
            }
            for (std::int64_t i = 0; i < n; ++i) {
              g[i] += scale * toy_gradient(w[i], static_cast<int>(k), i, engine.rank(), micro);
            }
            detail::convert_from_float(g.data(), raw_grad.data(), dtype, n);
            from_host(engine, target.data, raw_grad.data(), bytes);
            if (writes && k == kFetchedTwice) {
              const GradTarget again = handles[k].grad_target();
              EXPECT_TRUE(again.accumulate) << describe(c) << ": second fetch in a micro-step";
              EXPECT_EQ(again.data, target.data) << describe(c);
            }
          },
          c.handover == GradHandover::kPerParameter);
      if (c.handover == GradHandover::kAtEnd) engine.all_grads_ready();
      engine.step();
    }
    run.norms.push_back(engine.global_grad_norm());
  }
  run.parameters = engine.consolidated_parameters();
  return run;
}

void expect_same_bits(const Trained& run, const Trained& expected, const std::string& what) {
  // Bits, not values: a NaN would compare unequal to itself.
  ASSERT_EQ(run.parameters.size(), expected.parameters.size()) << what;
  EXPECT_EQ(0, std::memcmp(run.parameters.data(), expected.parameters.data(),
                           expected.parameters.size() * sizeof(float)))
      << what;
  EXPECT_EQ(run.norms, expected.norms) << what;
}

// Written gradients give the bits of added ones in every case. Stage 0 with gradients added is
// also a reference of its own: its one whole buffer has no slots, and its sums and norms are
// stages 1-3's bit for bit wherever every stage adds in the same order (one micro-step per
// window, or fp32 sums of the toy's exact gradients; 16-bit windows of several micro-steps are
// rounded once per micro-step at stages 2-3 and once per window at stages 0-1).
TEST(GradTarget, WrittenGradientsTrainBitForBitAsAddedOnes) {
  constexpr int kSteps = 4;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int accumulation : {1, 2}) {
      const Trained stage0 = train({0, dtype, accumulation}, Fetch::kAdded, kSteps);
      EXPECT_GT(stage0.norms.back(), 0.5) << "clipping must act";
      const bool stage0_is_reference = accumulation == 1 || dtype == DType::kFloat32;
      std::vector<Case> cases;
      for (int stage = 0; stage <= 3; ++stage) {
        cases.push_back({stage, dtype, accumulation, GradHandover::kPerParameter});
      }
      cases.push_back({2, dtype, accumulation, GradHandover::kAtEnd});
      for (const Case& c : cases) {
        const Trained added = train(c, Fetch::kAdded, kSteps);
        expect_same_bits(train(c, Fetch::kWritten, kSteps), added,
                         describe(c) + ": written against added");
        expect_same_bits(train(c, Fetch::kAllButOneWritten, kSteps), added,
                         describe(c) + ": all but one written against added");
        expect_same_bits(train(c, Fetch::kOneAddedInOddWindows, kSteps), added,
                         describe(c) + ": one added in odd windows against added");
        if (stage0_is_reference) {
          expect_same_bits(added, stage0, describe(c) + ": added against stage 0");
        }
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard::testing
