// On a GPU the model's kernels run on torch's current stream, which a program may change (a
// c10::cuda::CUDAStreamGuard around its loop, a side stream for one phase): the engine's own work
// follows it, after what the engine queued on the stream it leaves.
#if defined(ZEROSHARD_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "torch/optimizer_state.h"

namespace zeroshard::torch::detail {

void follow_current_stream(Engine& engine) {
  if (!engine.device().is_cuda()) return;
#if defined(ZEROSHARD_TORCH_CUDA)
  const auto index = static_cast<c10::DeviceIndex>(engine.device().index);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index);
  void* left = engine.compute_stream();
  if (current.stream() == left) return;
  // The engine's last work on the stream it leaves (an update, a gather into the model's
  // tensors) comes before the model's next kernels on the new one.
  const c10::cuda::CUDAStream previous =
      left == nullptr ? c10::cuda::getDefaultCUDAStream(index)
                      : c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(left), index);
  at::cuda::CUDAEvent engine_done;
  engine_done.record(previous);
  engine_done.block(current);
  engine.set_compute_stream(current.stream());
#else
  throw UsageError("zeroshard::torch: the model is on " + engine.device().to_string() +
                   " but this zeroshard::torch was built against a libtorch without CUDA; build "
                   "it against a CUDA libtorch (the PyPI torch wheel's)");
#endif
}

}  // namespace zeroshard::torch::detail
