// The CUDA compute backend against the CPU one: the same calls on the same data give the same
// results (bit for bit where both round once in fp32, within 1e-6 relative for the update rules),
// its memory is zero-filled device memory the tracker counts, and a user's rule is refused.
#include <gtest/gtest.h>

#if ZEROSHARD_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/compute_backend.h"
#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_selection.h"
#include "memory/memory_tracker.h"
#include "zeroshard/error.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

using detail::ComputeBackend;
using detail::MemoryTracker;
using detail::TrackedBuffer;

class MyRule final : public UpdateRule {
 public:
  std::string name() const override { return "my_rule"; }
  int state_count() const override { return 0; }
  double default_lr() const override { return 0.1; }
  double default_weight_decay() const override { return 0.0; }
  void apply(const ShardSlice&, const StepContext&) const override {}
};

TEST(CudaBackendRule, AUsersOwnRuleIsRefusedWithItsName) {
  MemoryTracker tracker;
  const MyRule rule;
  try {
    detail::make_compute_backend(Device{DeviceType::kCuda, 0}, rule, tracker);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("'my_rule'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("Device::cpu()"), std::string::npos) << error.what();
  }
}

std::vector<float> random_floats(std::size_t count, unsigned seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

// One CPU and one CUDA backend over the same rule, and helpers that put the same bytes in both.
class CudaBackend : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
    }
    rule_ = make_adamw({.weight_decay = 0.1});
    cpu_ = detail::make_cpu_backend(*rule_);
    gpu_ = detail::make_compute_backend(Device::cuda(0), *rule_, tracker_);
  }

  // `values` stored as `dtype` in a host buffer and in a device buffer.
  struct Pair {
    TrackedBuffer host;
    TrackedBuffer device;
  };
  Pair both(const std::vector<float>& values, DType dtype) {
    const std::size_t bytes = values.size() * size_of(dtype);
    Pair pair{TrackedBuffer(tracker_, MemoryCategory::kGradients, bytes),
              TrackedBuffer(tracker_, MemoryCategory::kGradients, bytes, gpu_->memory())};
    cpu_->narrow(values.data(), pair.host.data(), dtype, static_cast<std::int64_t>(values.size()));
    gpu_->copy_from_host(pair.device.data(), pair.host.data(), bytes);
    return pair;
  }
  // The device buffer's bytes equal the host buffer's.
  void expect_same_bytes(const Pair& pair, const std::string& what) {
    std::vector<char> downloaded(pair.host.bytes());
    gpu_->copy_to_host(downloaded.data(), pair.device.data(), downloaded.size());
    EXPECT_EQ(std::memcmp(downloaded.data(), pair.host.data(), downloaded.size()), 0) << what;
  }

  static constexpr std::int64_t kCount = 4099;  // not a multiple of the vector width
  MemoryTracker tracker_;
  std::unique_ptr<UpdateRule> rule_;
  std::unique_ptr<ComputeBackend> cpu_;
  std::unique_ptr<ComputeBackend> gpu_;
};

TEST_P(CudaBackend, MemoryIsZeroFilledAndCountedOnTheDevice) {
  const std::int64_t before =
      tracker_.current(MemoryCategory::kOptimizerStates, MemoryLocation::kDevice);
  {
    TrackedBuffer buffer(tracker_, MemoryCategory::kOptimizerStates, 1 << 20, gpu_->memory());
    EXPECT_EQ(tracker_.current(MemoryCategory::kOptimizerStates, MemoryLocation::kDevice),
              before + (1 << 20));
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
    std::vector<unsigned char> host(1 << 20, 0xff);
    gpu_->copy_to_host(host.data(), buffer.data(), host.size());
    EXPECT_EQ(std::count(host.begin(), host.end(), 0), static_cast<long>(host.size()));
  }
  EXPECT_EQ(tracker_.current(MemoryCategory::kOptimizerStates, MemoryLocation::kDevice), before);
}

TEST_P(CudaBackend, WidenNarrowScaleAndAccumulateMatchTheCpuBitForBit) {
  const DType dtype = GetParam();
  const std::vector<float> values = random_floats(kCount, 1, 50.0f);
  Pair data = both(values, dtype);
  Pair widened = both(std::vector<float>(kCount), DType::kFloat32);
  cpu_->widen(data.host.data(), dtype, widened.host.as<float>(), kCount, 0.25f);
  gpu_->widen(data.device.data(), dtype, widened.device.as<float>(), kCount, 0.25f);
  expect_same_bytes(widened, "widen");

  Pair narrowed = both(std::vector<float>(kCount), dtype);
  cpu_->narrow(widened.host.as<float>(), narrowed.host.data(), dtype, kCount);
  gpu_->narrow(widened.device.as<float>(), narrowed.device.data(), dtype, kCount);
  expect_same_bytes(narrowed, "narrow");

  cpu_->scale(data.host.data(), dtype, kCount, 0.37f);
  gpu_->scale(data.device.data(), dtype, kCount, 0.37f);
  expect_same_bytes(data, "scale");

  for (DType source_dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const Pair addend = both(random_floats(kCount, 2, 50.0f), source_dtype);
    cpu_->accumulate(data.host.data(), dtype, addend.host.data(), source_dtype, kCount);
    gpu_->accumulate(data.device.data(), dtype, addend.device.data(), source_dtype, kCount);
    expect_same_bytes(data, std::string("accumulate from ") + to_string(source_dtype));
  }
}

TEST_P(CudaBackend, ScanMatchesTheCpuAndFindsNonfiniteValues) {
  const DType dtype = GetParam();
  std::vector<float> values = random_floats(kCount, 3, 4.0f);
  const Pair clean = both(values, dtype);
  const auto scan = [](detail::ComputeBackend& backend, const void* data, DType type) {
    detail::GradientScan result;
    backend.scan(data, type, kCount, result);
    return result;
  };
  const detail::GradientScan want = scan(*cpu_, clean.host.data(), dtype);
  const detail::GradientScan got = scan(*gpu_, clean.device.data(), dtype);
  EXPECT_FALSE(got.nonfinite());
  EXPECT_NEAR(got.sum_of_squares(), want.sum_of_squares(), 1e-9 * want.sum_of_squares());

  values[kCount - 2] = std::numeric_limits<float>::quiet_NaN();
  const Pair dirty = both(values, dtype);
  EXPECT_TRUE(scan(*gpu_, dirty.device.data(), dtype).nonfinite());
  // The flag is cleared between scans.
  EXPECT_FALSE(scan(*gpu_, clean.device.data(), dtype).nonfinite());
}

INSTANTIATE_TEST_SUITE_P(Types, CudaBackend,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(to_string(info.param));
                         });

// Each built-in rule, run as a fused kernel over two tensors at once, against the CPU rule run
// tensor by tensor.
TEST(CudaBackendRules, EveryBuiltinRuleMatchesTheCpuRuleAcrossSteps) {
  if (!cuda::cuda_device_available()) {
    GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
  }
  std::vector<std::unique_ptr<UpdateRule>> rules;
  rules.push_back(make_adamw({.weight_decay = 0.1, .amsgrad = true}));
  rules.push_back(make_adam({.weight_decay = 0.01}));
  rules.push_back(make_sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}));
  rules.push_back(make_sgd({.lr = 0.1}));
  rules.push_back(make_lion({.weight_decay = 0.1}));
  rules.push_back(make_adagrad({.lr_decay = 0.01, .initial_accumulator_value = 0.1}));
  constexpr std::int64_t kFirst = 1001;
  constexpr std::int64_t kCount = kFirst + 2050;
  for (const auto& rule : rules) {
    MemoryTracker tracker;
    const auto cpu = detail::make_cpu_backend(*rule);
    const auto gpu = detail::make_compute_backend(Device::cuda(0), *rule, tracker);
    const int states = rule->state_count();
    std::vector<float> param = random_floats(kCount, 4);
    std::vector<std::vector<float>> state(static_cast<std::size_t>(states),
                                          std::vector<float>(kCount, 0.0f));
    const std::size_t bytes = kCount * sizeof(float);
    TrackedBuffer d_param(tracker, MemoryCategory::kParameters, bytes, gpu->memory());
    TrackedBuffer d_grad(tracker, MemoryCategory::kGradients, bytes, gpu->memory());
    std::vector<TrackedBuffer> d_state;
    std::vector<float*> d_state_pointers;
    for (int s = 0; s < states; ++s) {
      d_state.emplace_back(tracker, MemoryCategory::kOptimizerStates, bytes, gpu->memory());
      d_state_pointers.push_back(d_state.back().as<float>());
    }
    gpu->copy_from_host(d_param.data(), param.data(), bytes);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> grad = random_floats(kCount, 10 + static_cast<unsigned>(step));
      gpu->copy_from_host(d_grad.data(), grad.data(), bytes);
      StepContext context{.step = step,
                          .lr = rule->default_lr(),
                          .weight_decay = rule->default_weight_decay(),
                          .momentum = std::nullopt};
      gpu->apply_rule({.param_name = "both",
                       .param_numel = kCount,
                       .size = kCount,
                       .param = d_param.as<float>(),
                       .states = d_state_pointers},
                      {.grad = d_grad.data()}, context, {});
      for (auto [lo, hi] : {std::pair<std::int64_t, std::int64_t>{0, kFirst}, {kFirst, kCount}}) {
        std::vector<float*> pointers;
        for (auto& s : state) pointers.push_back(s.data() + lo);
        cpu->apply_rule({.param_name = "one",
                         .param_numel = hi - lo,
                         .size = hi - lo,
                         .param = param.data() + lo,
                         .states = pointers},
                        {.grad = grad.data() + lo}, context, {});
      }
    }
    std::vector<float> got(kCount);
    gpu->copy_to_host(got.data(), d_param.data(), bytes);
    int reported = 0;
    for (std::int64_t i = 0; i < kCount && reported < 5; ++i) {
      if (std::abs(got[i] - param[i]) <= 1e-6f * std::max(std::abs(param[i]), 1e-2f)) continue;
      ADD_FAILURE() << rule->name() << " param[" << i << "]: gpu " << got[i] << ", cpu "
                    << param[i];
      ++reported;
    }
  }
}

TEST(CudaBackendRules, WorkFollowsTheStreamTheModelSets) {
  if (!cuda::cuda_device_available()) {
    GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
  }
  MemoryTracker tracker;
  const auto rule = make_sgd({.lr = 0.5});
  const auto gpu = detail::make_compute_backend(Device::cuda(0), *rule, tracker);
  const cuda::CudaStream stream;
  gpu->set_stream(stream.get());
  EXPECT_EQ(gpu->stream(), static_cast<void*>(stream.get()));
  TrackedBuffer data(tracker, MemoryCategory::kGradients, 1000 * sizeof(float), gpu->memory());
  const std::vector<float> ones(1000, 1.0f);
  gpu->copy_from_host(data.data(), ones.data(), ones.size() * sizeof(float));
  gpu->scale(data.data(), DType::kFloat32, 1000, 3.0f);
  gpu->synchronize();
  std::vector<float> got(1000);
  gpu->copy_to_host(got.data(), data.data(), got.size() * sizeof(float));
  EXPECT_EQ(got, std::vector<float>(1000, 3.0f));
}

// The async copies run on the backend's copy stream: a copy sees what the compute stream's work
// queued before it wrote, and compute work ordered after a copy's event sees what it wrote.
TEST(CudaBackendRules, AsyncCopiesAreOrderedWithTheComputeStreamByEvents) {
  if (!cuda::cuda_device_available()) {
    GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
  }
  MemoryTracker tracker;
  const auto rule = make_sgd({.lr = 0.5});
  const auto gpu = detail::make_compute_backend(Device::cuda(0), *rule, tracker);
  const cuda::CudaStream stream;
  gpu->set_stream(stream.get());
  constexpr std::int64_t kCount = 1 << 20;
  constexpr std::size_t kBytes = kCount * sizeof(float);
  TrackedBuffer data(tracker, MemoryCategory::kGradients, kBytes, gpu->memory());
  TrackedBuffer pinned(tracker, MemoryCategory::kCommunication, kBytes, gpu->pinned_host_memory());
  const std::vector<float> ones(kCount, 1.0f);
  gpu->copy_from_host(data.data(), ones.data(), kBytes);
  const std::unique_ptr<detail::CopyEvent> done = gpu->make_copy_event();
  done->wait();  // nothing marked yet: returns at once
  gpu->scale(data.data(), DType::kFloat32, kCount, 3.0f);
  gpu->copy_to_host_async(pinned.data(), data.data(), kBytes, *done);
  done->wait();
  const float* host = pinned.as<float>();
  EXPECT_EQ(std::vector<float>(host, host + kCount), std::vector<float>(kCount, 3.0f));
  std::fill(pinned.as<float>(), pinned.as<float>() + kCount, 5.0f);
  gpu->copy_from_host_async(data.data(), pinned.data(), kBytes, *done);
  done->order_compute_after();
  gpu->scale(data.data(), DType::kFloat32, kCount, 2.0f);
  std::vector<float> got(kCount);
  gpu->copy_to_host(got.data(), data.data(), kBytes);
  EXPECT_EQ(got, std::vector<float>(kCount, 10.0f));
}

}  // namespace
}  // namespace zeroshard

#else

TEST(CudaBackend, NeedsTheCudaBackend) {
  GTEST_SKIP() << "zeroshard was built without CUDA (ZEROSHARD_CUDA=OFF or no nvcc found)";
}

#endif
