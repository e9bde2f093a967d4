// The adapter on a GPU (label gpu; skipped where zeroshard or libtorch has no usable GPU): a CUDA
// model trains at stages 0-3 as torch::optim trains it on the same GPU, and the engine's work runs
// on torch's current stream, also one the program switches to after building the optimizer.
#include <gtest/gtest.h>

#if defined(ZEROSHARD_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#endif

#include <cstdio>

#include "torch_training.h"

namespace {

using namespace torch_testing;

// Not measured on a GPU yet (none has been lent since these tests were written): the CPU's
// kRoundingBound with room for cuBLAS's and the fused update's own summation orders. The tests
// print the measured difference, for scripts/gpu-check.sh's report.
constexpr float kGpuRoundingBound = 1e-5f;

class TorchCuda : public ::testing::Test {
 protected:
  // tests/run_gpu_test.sh reports a program whose cases skipped with "no usable CUDA device" as
  // skipped by ctest.
  void SetUp() override {
    if (!zeroshard::cuda_available()) {
      GTEST_SKIP() << "no usable CUDA device for zeroshard: "
                   << zeroshard::cuda_unavailable_reason();
    }
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no usable CUDA device for libtorch (a CPU-only libtorch, such as Debian's)";
    }
  }
};

TEST_F(TorchCuda, ACudaModelTrainsAsTorchOptimTrainsItOnTheSameGpu) {
  const zeroshard::Device device = zeroshard::Device::from_environment();
  ASSERT_TRUE(device.is_cuda());
  const std::vector<float> reference = train_torch("adamw", 10, {}, {}, torch_device(device));
  for (int stage = 0; stage <= 3; ++stage) {
    const TrainingRun run = train_zero({.stage = stage, .cuda = true});
    const float difference = max_difference(run.parameters, reference);
    std::printf("stage %d on %s: largest difference from torch::optim::AdamW %.3g\n", stage,
                device.to_string().c_str(), static_cast<double>(difference));
    EXPECT_LE(difference, kGpuRoundingBound) << "stage " << stage;
    EXPECT_LT(run.losses.back(), run.losses.front()) << "stage " << stage;
  }
}

TEST_F(TorchCuda, MixedPrecisionTrainsOnTheGpu) {
  // fp16 from a loss scale of 2^8 rather than DeepSpeed's 2^16, so that few if any of the 10
  // steps go to overflow skips.
  for (const char* precision : {R"(, "bf16": {"enabled": true})",
                                R"(, "fp16": {"enabled": true, "initial_scale_power": 8})"}) {
    for (int stage : {1, 3}) {
      const TrainingRun run = train_zero({.stage = stage, .extra = precision, .cuda = true});
      EXPECT_LT(run.losses.back(), run.losses.front()) << "stage " << stage << precision;
    }
  }
}

#if defined(ZEROSHARD_TORCH_CUDA)
TEST_F(TorchCuda, TheEnginesWorkRunsOnTorchsCurrentStream) {
  for (int stage : {1, 3}) {
    const TrainingRun on_default = train_zero({.stage = stage, .cuda = true});
    // A stream of torch's pool, which does not wait for the legacy default stream nor it for
    // this one, made current once the optimizer is built; before each forward a kernel spins on
    // it for about 10 ms, so that the model's gradients come late: an engine still queueing on
    // the default stream would reduce and update with gradients not yet written.
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    bool followed = true;
    const TrainingRun on_side = train_zero(
        {.stage = stage, .before_forward = [] { at::cuda::sleep(20'000'000); }, .cuda = true},
        [&](TinyNet&, zeroshard::torch::Optimizer&) { c10::cuda::setCurrentCUDAStream(side); },
        [&](TinyNet&, zeroshard::torch::Optimizer& optimizer) {
          followed = optimizer.engine().compute_stream() == side.stream();
          c10::cuda::setCurrentCUDAStream(c10::cuda::getDefaultCUDAStream(side.device_index()));
        });
    EXPECT_TRUE(followed) << "stage " << stage << ": the engine did not take torch's stream";
    const float difference = max_difference(on_side.parameters, on_default.parameters);
    std::printf("stage %d: a side stream against the default one: largest difference %.3g\n", stage,
                static_cast<double>(difference));
    EXPECT_LE(difference, kGpuRoundingBound) << "stage " << stage;
  }
}
#endif

}  // namespace
