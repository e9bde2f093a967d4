// The engine's life on a GPU around the model's stream: a model commonly owns its stream and
// destroys it before the engine, and the engine must then free its buffers without that stream.
#include <gtest/gtest.h>

#if ZEROSHARD_WITH_CUDA

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_selection.h"
#include "zeroshard/zeroshard.h"

namespace zeroshard {
namespace {

TEST(CudaEngine, OutlivesTheComputeStreamOfAModelDestroyedFirst) {
  if (!cuda::cuda_device_available()) {
    GTEST_SKIP() << "no usable CUDA device: " << cuda::cuda_unavailable_reason();
  }
  Config config;
  config.train_micro_batch_size_per_gpu = 1;
  config.gradient_clipping = 0.0;
  config.steps_per_print = 0;
  config.zero_optimization.stage = 3;
  config.zero_optimization.param_persistence_threshold = 0;
  const Device device = Device::cuda(0);
  auto engine = std::make_unique<Engine>(config, device, Communicator::from_environment(device),
                                         make_sgd({.lr = 0.5}));
  constexpr int kCount = 1000;
  const Parameter weight = engine->register_parameter("w", {kCount});
  weight.copy_from(std::vector<float>(kCount, 2.0f));
  {
    const cuda::CudaStream model_stream;
    engine->set_compute_stream(model_stream.get());
    {
      auto gathered = engine->gathered(weight.module());
      const std::vector<float> ones(kCount, 1.0f);
      copy_from_host(device, weight.grad(), ones.data(), kCount * sizeof(float),
                     model_stream.get());
      engine->grad_ready(weight);
    }
    ASSERT_TRUE(engine->step().updated);
    EXPECT_EQ(engine->consolidated_parameters(), std::vector<float>(kCount, 1.5f));
    // A stage-3 gather is freed on the compute stream, in its order; it is still queued when the
    // stream goes away here.
    auto gathered = engine->gathered(weight.module());
  }
  engine.reset();  // frees every device buffer after the model's stream is destroyed
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace zeroshard

#else

TEST(CudaEngine, NeedsTheCudaBackend) {
  GTEST_SKIP() << "zeroshard was built without CUDA (ZEROSHARD_CUDA=OFF or no nvcc found)";
}

#endif
