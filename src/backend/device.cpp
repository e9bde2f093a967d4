// Device selection and host <-> device copies for callers outside the engine.
#include "zeroshard/device.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "util/check.h"

#if ZEROSHARD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/device_selection.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace zeroshard {

bool cuda_built() noexcept {
#if ZEROSHARD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available() noexcept {
#if ZEROSHARD_WITH_CUDA
  return cuda::cuda_device_available();
#else
  return false;
#endif
}

std::string cuda_unavailable_reason() {
#if ZEROSHARD_WITH_CUDA
  return cuda::cuda_unavailable_reason();
#else
  return "zeroshard was built without CUDA (configure with -DZEROSHARD_CUDA=ON)";
#endif
}

Device Device::cuda(int index) {
  ZEROSHARD_CHECK_USAGE(cuda_available(), "Device::cuda(" << index << "): no CUDA device: "
                                                          << cuda_unavailable_reason());
#if ZEROSHARD_WITH_CUDA
  int count = 0;
  ZEROSHARD_CUDA_CHECK(cudaGetDeviceCount(&count));
  ZEROSHARD_CHECK_USAGE(index >= 0 && index < count, "Device::cuda("
                                                         << index << "): this machine has " << count
                                                         << " CUDA device(s)");
#endif
  return {DeviceType::kCuda, index};
}

Device Device::from_environment() {
  const char* forced = std::getenv("ZEROSHARD_DEVICE");
  const std::string_view choice = forced ? forced : "";
  ZEROSHARD_CHECK_USAGE(choice.empty() || choice == "cpu" || choice == "cuda",
                        "ZEROSHARD_DEVICE='" << choice << "': expected cpu or cuda");
  if (choice == "cpu") return cpu();
  if (!cuda_available()) {
    ZEROSHARD_CHECK_USAGE(choice != "cuda", "ZEROSHARD_DEVICE=cuda but no GPU is usable: "
                                                << cuda_unavailable_reason());
    return cpu();
  }
#if ZEROSHARD_WITH_CUDA
  return {DeviceType::kCuda, cuda::select_device_for_local_rank()};
#else
  return cpu();
#endif
}

std::string Device::to_string() const {
  return is_cuda() ? "cuda:" + std::to_string(index) : "cpu";
}

void copy_to_host(const Device& device, void* host, const void* source, std::size_t bytes,
                  [[maybe_unused]] void* stream) {
  if (bytes == 0) return;
  if (!device.is_cuda()) {
    std::memcpy(host, source, bytes);
    return;
  }
#if ZEROSHARD_WITH_CUDA
  ZEROSHARD_CUDA_CHECK(cudaSetDevice(device.index));
  ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  ZEROSHARD_CUDA_CHECK(cudaMemcpy(host, source, bytes, cudaMemcpyDeviceToHost));
#endif
}

void copy_from_host(const Device& device, void* destination, const void* host, std::size_t bytes,
                    [[maybe_unused]] void* stream) {
  if (bytes == 0) return;
  if (!device.is_cuda()) {
    std::memcpy(destination, host, bytes);
    return;
  }
#if ZEROSHARD_WITH_CUDA
  ZEROSHARD_CUDA_CHECK(cudaSetDevice(device.index));
  ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  ZEROSHARD_CUDA_CHECK(cudaMemcpy(destination, host, bytes, cudaMemcpyHostToDevice));
#endif
}

}  // namespace zeroshard
