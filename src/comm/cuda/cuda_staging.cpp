// Staging copies for the host-staged communicator. Page-locked buffers let cudaMemcpyAsync run
// truly asynchronously at full PCIe bandwidth; the copy stream keeps the copies off the compute
// stream, so the model's kernels go on while a bucket travels.
#include "comm/cuda/cuda_staging.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/cuda_check.h"

namespace zeroshard::cuda {
namespace {

class PinnedStagingBuffer final : public detail::StagingBuffer {
 public:
  explicit PinnedStagingBuffer(std::size_t bytes) : buffer_(bytes, "host staging buffer") {}
  void* data() const noexcept override { return buffer_.data(); }
  std::size_t bytes() const noexcept override { return buffer_.bytes(); }

 private:
  PinnedHostBuffer buffer_;
};

class EventCopy final : public detail::StagingCopy {
 public:
  explicit EventCopy(cudaStream_t stream) { done_.record(stream); }
  bool done() override { return done_.query(); }
  void wait() override { done_.synchronize(); }

 private:
  CudaEvent done_;
};

class CudaStagingCopier final : public detail::StagingCopier {
 public:
  explicit CudaStagingCopier(int device) : device_(device), copy_stream_(stream_on(device)) {}

  std::unique_ptr<detail::StagingBuffer> allocate(std::size_t bytes) override {
    const DeviceGuard guard(device_);
    return std::make_unique<PinnedStagingBuffer>(bytes);
  }

  void follow_compute() override {
    const DeviceGuard guard(device_);
    CudaEvent computed;
    computed.record(compute_stream_);
    computed.make_wait(copy_stream_.get());
  }

  std::unique_ptr<detail::StagingCopy> to_host(void* host, const void* device,
                                               std::size_t bytes) override {
    const DeviceGuard guard(device_);
    ZEROSHARD_CUDA_CHECK(
        cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, copy_stream_.get()));
    return std::make_unique<EventCopy>(copy_stream_.get());
  }

  std::unique_ptr<detail::StagingCopy> to_device(void* device, const void* host,
                                                 std::size_t bytes) override {
    const DeviceGuard guard(device_);
    ZEROSHARD_CUDA_CHECK(
        cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, copy_stream_.get()));
    return std::make_unique<EventCopy>(copy_stream_.get());
  }

  void set_compute_stream(void* stream) noexcept override {
    compute_stream_ = stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream);
  }

  std::unique_ptr<detail::StagingCopier> another() const override {
    return std::make_unique<CudaStagingCopier>(device_);
  }

 private:
  static CudaStream stream_on(int device) {
    const DeviceGuard guard(device);
    return CudaStream();
  }

  int device_;
  CudaStream copy_stream_;
  cudaStream_t compute_stream_ = cudaStreamLegacy;
};

}  // namespace

std::unique_ptr<detail::StagingCopier> make_cuda_staging_copier(int device) {
  return std::make_unique<CudaStagingCopier>(device);
}

}  // namespace zeroshard::cuda
