// On a GPU the model's kernels run on torch's current stream, which a program may change (a
// c10::cuda::CUDAStreamGuard around its loop, a side stream for one phase): the engine's own work
// follows it; the engine orders its work on the new stream after what it left on the old one.
#if defined(ZEROSHARD_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include "torch/optimizer_state.h"

namespace zeroshard::torch::detail {

void follow_current_stream(Engine& engine) {
  if (!engine.device().is_cuda()) return;
#if defined(ZEROSHARD_TORCH_CUDA)
  engine.set_compute_stream(
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(engine.device().index))
          .stream());
#else
  throw UsageError("zeroshard::torch: the model is on " + engine.device().to_string() +
                   " but this zeroshard::torch was built against a libtorch without CUDA; build "
                   "it against a CUDA libtorch (the PyPI torch wheel's)");
#endif
}

}  // namespace zeroshard::torch::detail
