// The engine's memory and arithmetic on one GPU. Every operation is queued on the compute stream
// and returns at once, except those that hand a value to the host (scan, copy_to_host), so the
// engine's step runs as a stream of kernels the model's own work is ordered with; the async host
// copies run on a copy stream beside it.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "memory/host_first_touch.h"  // zero_host
#include "optim/builtin_rule.h"
#include "optim/rule_checks.h"
#include "util/check.h"

namespace zeroshard::cuda {
namespace {

using detail::GradientScan;
using detail::MemoryTracker;
using detail::TrackedBuffer;

// Elements widened at once for 16-bit gradients: 128 MiB of fp32, enough that a step is a few
// launches per tensor group, small next to the model states of any model that needs a GPU.
constexpr std::int64_t kWorkingChunk = std::int64_t{1} << 25;

/// Device memory from CUDA's stream-ordered allocator, zero-filled on the backend's stream so
/// that the fill is ordered before any later work on it (and, through the communicators' events,
/// before any collective). Freeing is ordered on that stream too: unlike cudaFree it does not
/// wait for the whole device, so releasing a stage-3 gather does not stall the prefetches in
/// flight, and the pool hands the bytes to the next gather of the same size. Devices without
/// memory pools fall back to cudaMalloc and cudaFree.
class DeviceMemory final : public detail::MemoryResource {
 public:
  DeviceMemory(int device, const cudaStream_t& stream) : device_(device), stream_(stream) {
    const DeviceGuard guard(device);
    int supported = 0;
    ZEROSHARD_CUDA_CHECK(
        cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
    stream_ordered_ = supported != 0;
  }

  MemoryLocation location() const noexcept override { return MemoryLocation::kDevice; }

  void* allocate(std::size_t bytes, MemoryCategory category) override {
    const DeviceGuard guard(device_);
    void* data = nullptr;
    const cudaError_t error =
        stream_ordered_ ? cudaMallocAsync(&data, bytes, stream_) : cudaMalloc(&data, bytes);
    if (error != cudaSuccess) {
      throw_allocation_error(stream_ordered_ ? "cudaMallocAsync" : "cudaMalloc", bytes,
                             to_string(category), error);
    }
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_));
    return data;
  }

  void deallocate(void* data) noexcept override {
    const DeviceGuard guard(device_);
    if (stream_ordered_) {
      ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFreeAsync(data, stream_));
    } else {
      ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFree(data));
    }
  }

 private:
  int device_;
  const cudaStream_t& stream_;
  bool stream_ordered_ = false;
};

/// Page-locked host memory (cudaHostAlloc), zero-filled: where offloaded buffers live, so that
/// copies to and from the device run at full bus speed without a bounce through pageable pages.
class PinnedHostMemory final : public detail::MemoryResource {
 public:
  explicit PinnedHostMemory(int device) : device_(device) {}
  MemoryLocation location() const noexcept override { return MemoryLocation::kHost; }
  void* allocate(std::size_t bytes, MemoryCategory category) override {
    const DeviceGuard guard(device_);
    void* data = nullptr;
    const cudaError_t error = cudaHostAlloc(&data, bytes, cudaHostAllocDefault);
    if (error != cudaSuccess) {
      throw_allocation_error("cudaHostAlloc", bytes, to_string(category), error);
    }
    // cudaHostAlloc has placed the pages already; the fill at least runs on every core.
    detail::zero_host(data, bytes);
    return data;
  }
  void deallocate(void* data) noexcept override {
    ZEROSHARD_CUDA_CHECK_NOTHROW(cudaFreeHost(data));
  }

 private:
  int device_;
};

/// A copy's end on the copy stream. It reads the compute stream through the backend's member, so
/// it follows set_stream() and detach_stream().
class StreamCopyEvent final : public detail::CopyEvent {
 public:
  StreamCopyEvent(int device, const cudaStream_t& compute_stream)
      : device_(device), compute_stream_(compute_stream), event_(make_event(device)) {}

  void wait() override {
    const DeviceGuard guard(device_);
    event_.synchronize();
  }
  bool finished() override {
    const DeviceGuard guard(device_);
    return event_.query();
  }
  void order_compute_after() override {
    const DeviceGuard guard(device_);
    event_.make_wait(compute_stream_);
  }
  void record(cudaStream_t copy_stream) { event_.record(copy_stream); }

 private:
  static CudaEvent make_event(int device) {
    const DeviceGuard guard(device);
    return CudaEvent();
  }

  int device_;
  const cudaStream_t& compute_stream_;
  CudaEvent event_;
};

class CudaBackend final : public detail::ComputeBackend {
 public:
  CudaBackend(const Device& device, const UpdateRule& rule, detail::BuiltinRuleOptions options,
              MemoryTracker& tracker)
      : device_(device),
        rule_(rule),
        options_(std::move(options)),
        tracker_(tracker),
        memory_(device.index, stream_),
        pinned_(device.index),
        scalars_(sizeof(double) + sizeof(int)),
        scan_result_(tracker, MemoryCategory::kCommunication, sizeof(double) + sizeof(int),
                     memory_) {}

  // The backend's own buffers are freed after this body, on the stream detached to.
  ~CudaBackend() override { detach_stream(); }

  Device device() const noexcept override { return device_; }
  detail::MemoryResource& memory() noexcept override { return memory_; }
  detail::MemoryResource& pinned_host_memory() noexcept override { return pinned_; }
  void* stream() const noexcept override { return stream_; }
  // What the engine queued on the stream it leaves comes before what it queues on the new one.
  void set_stream(void* stream) override {
    const auto next = static_cast<cudaStream_t>(stream);
    if (next == stream_) return;
    const DeviceGuard guard(device_.index);
    CudaEvent left;
    left.record(stream_);
    left.make_wait(next);
    stream_ = next;
  }
  void detach_stream() noexcept override {
    const DeviceGuard guard(device_.index);
    ZEROSHARD_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
    stream_ = nullptr;
  }
  std::int64_t working_chunk_elements(std::int64_t owned) const noexcept override {
    return std::max<std::int64_t>(2, std::min(owned, kWorkingChunk));
  }
  bool fuses_tensors() const noexcept override { return true; }
  std::optional<detail::DeviceMemoryUse> device_memory() const override {
    const DeviceGuard guard(device_.index);
    std::size_t free = 0;
    std::size_t total = 0;
    ZEROSHARD_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return detail::DeviceMemoryUse{.total = static_cast<std::int64_t>(total),
                                   .in_use = static_cast<std::int64_t>(total - free)};
  }

  void zero(void* data, std::size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard(device_.index);
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_));
  }

  void copy(void* destination, const void* source, std::size_t bytes) override {
    if (bytes == 0 || destination == source) return;
    const DeviceGuard guard(device_.index);
    ZEROSHARD_CUDA_CHECK(
        cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  void copy_to_host(void* host, const void* source, std::size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard(device_.index);
    ZEROSHARD_CUDA_CHECK(cudaMemcpyAsync(host, source, bytes, cudaMemcpyDeviceToHost, stream_));
    ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_from_host(void* destination, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    const DeviceGuard guard(device_.index);
    ZEROSHARD_CUDA_CHECK(
        cudaMemcpyAsync(destination, host, bytes, cudaMemcpyHostToDevice, stream_));
    // The host buffer may be freed as soon as this returns.
    ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::unique_ptr<detail::CopyEvent> make_copy_event() override {
    return std::make_unique<StreamCopyEvent>(device_.index, stream_);
  }

  void copy_to_host_async(void* host, const void* source, std::size_t bytes,
                          detail::CopyEvent& done) override {
    copy_async(host, source, bytes, cudaMemcpyDeviceToHost, done);
  }

  void copy_from_host_async(void* destination, const void* host, std::size_t bytes,
                            detail::CopyEvent& done) override {
    copy_async(destination, host, bytes, cudaMemcpyHostToDevice, done);
  }

  void widen(const void* in, DType from, float* out, std::int64_t count,
             float multiplier) override {
    const DeviceGuard guard(device_.index);
    kernels::cast_to_float_scaled(in, from, out, count, multiplier, nullptr, stream_);
  }

  void narrow(const float* in, void* out, DType to, std::int64_t count) override {
    const DeviceGuard guard(device_.index);
    kernels::cast_from_float(in, out, to, count, stream_);
  }

  void scale(void* data, DType dtype, std::int64_t count, float factor) override {
    const DeviceGuard guard(device_.index);
    kernels::scale_in_place(data, dtype, count, factor, stream_);
  }

  void accumulate(void* destination, DType destination_dtype, const void* source,
                  DType source_dtype, std::int64_t count) override {
    const DeviceGuard guard(device_.index);
    kernels::accumulate(destination, destination_dtype, source, source_dtype, count, stream_);
  }

  // The launchers check their launch and throw CudaError; the kernels run on the compute stream.
  void quantize_blocks(const void* in, DType dtype, std::int64_t count, detail::QuantBits bits,
                       void* out, int* nonfinite_blocks) override {
    const DeviceGuard guard(device_.index);
    kernels::quantize_blocks(in, dtype, count, bits, out, nonfinite_blocks, stream_);
  }

  void dequantize_blocks(const void* in, detail::QuantBits bits, std::int64_t count, void* out,
                         DType dtype) override {
    const DeviceGuard guard(device_.index);
    kernels::dequantize_blocks(in, bits, count, out, dtype, stream_);
  }

  void scan(const void* data, DType dtype, std::int64_t count, GradientScan& scan) override {
    if (count == 0) return;
    const DeviceGuard guard(device_.index);
    auto* sum = scan_result_.as<double>();
    auto* flag = reinterpret_cast<int*>(sum + 1);
    ZEROSHARD_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream_));
    kernels::check_nonfinite(data, dtype, count, flag, stream_);
    const std::size_t workspace_bytes = kernels::sum_of_squares_workspace_bytes(dtype, count);
    if (workspace_.bytes() < workspace_bytes) {
      workspace_ =
          TrackedBuffer(tracker_, MemoryCategory::kCommunication, workspace_bytes, memory_);
    }
    kernels::sum_of_squares(data, dtype, count, sum, workspace_.data(), workspace_.bytes(),
                            stream_);
    ZEROSHARD_CUDA_CHECK(
        cudaMemcpyAsync(scalars_.data(), sum, scalars_.bytes(), cudaMemcpyDeviceToHost, stream_));
    ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const auto* host_sum = scalars_.as<double>();
    scan.device_sum += *host_sum;
    scan.device_nonfinite =
        scan.device_nonfinite || *reinterpret_cast<const int*>(host_sum + 1) != 0;
  }

  void apply_rule(const ShardSlice& slice, const detail::FusedStepIo& io,
                  const StepContext& context, std::span<float> scratch) override {
    if (slice.size == 0) return;
    const DeviceGuard guard(device_.index);
    if (io.grad_dtype == DType::kFloat32) {
      // The kernels read fp32 gradients: the factor is applied in place, as the step consumes
      // the gradients anyway.
      auto* grad = const_cast<float*>(static_cast<const float*>(io.grad));
      if (io.grad_factor != 1.0f) {
        kernels::scale_in_place(grad, DType::kFloat32, slice.size, io.grad_factor, stream_);
      }
      ShardSlice whole = slice;
      whole.grad = grad;
      run_rule(whole, context);
    } else {
      ZEROSHARD_CHECK_USAGE(!scratch.empty(), "apply_rule: 16-bit gradients need a scratch buffer");
      detail::apply_in_widened_chunks(
          slice, io, scratch,
          [this](const void* in, DType from, float* out, std::int64_t n, float factor) {
            kernels::cast_to_float_scaled(in, from, out, n, factor, nullptr, stream_);
          },
          [&](const ShardSlice& part) { run_rule(part, context); });
    }
    if (io.param_copy != nullptr) {
      kernels::cast_from_float(slice.param, io.param_copy, io.param_copy_dtype, slice.size,
                               stream_);
    }
    if (io.grad_to_clear != nullptr) zero(io.grad_to_clear, slice.size * size_of(io.grad_dtype));
  }

  void synchronize() override {
    const DeviceGuard guard(device_.index);
    ZEROSHARD_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void copy_async(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind,
                  detail::CopyEvent& done) {
    const DeviceGuard guard(device_.index);
    // The copy stream never syncs with the compute stream by itself (it is non-blocking): the
    // copy waits, on the device, for the work queued there so far, which writes its source or
    // still reads its destination. The event is re-recorded at once; the wait keeps the work
    // captured when it was queued.
    compute_done_.record(stream_);
    compute_done_.make_wait(copy_stream_.get());
    if (bytes > 0) {
      ZEROSHARD_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, kind, copy_stream_.get()));
    }
    static_cast<StreamCopyEvent&>(done).record(copy_stream_.get());
  }

  /// The built-in rule's fused kernel over one slice of fp32 gradients.
  void run_rule(const ShardSlice& slice, const StepContext& context) {
    detail::check_apply_arguments(slice, context, rule_.state_count(), rule_.name());
    float* state0 = slice.states.empty() ? nullptr : slice.states[0];
    std::visit(
        [&](const auto& options) {
          using Options = std::decay_t<decltype(options)>;
          if constexpr (std::is_same_v<Options, AdamWOptions>) {
            kernels::adamw_step(slice.param, slice.grad, state0, slice.states[1],
                                options.amsgrad ? slice.states[2] : nullptr, slice.size, options,
                                context, stream_);
          } else if constexpr (std::is_same_v<Options, AdamOptions>) {
            kernels::adam_step(slice.param, slice.grad, state0, slice.states[1],
                               options.amsgrad ? slice.states[2] : nullptr, slice.size, options,
                               context, stream_);
          } else if constexpr (std::is_same_v<Options, SgdOptions>) {
            // The CPU rule refuses a momentum schedule without a buffer; so does the GPU.
            ZEROSHARD_CHECK_USAGE(state0 != nullptr || !context.momentum.has_value(),
                                  "sgd was built with momentum 0 and keeps no momentum buffer, "
                                  "so it cannot follow a momentum schedule; give it a non-zero "
                                  "momentum");
            kernels::sgd_step(slice.param, slice.grad, state0, slice.size, options, context,
                              stream_);
          } else if constexpr (std::is_same_v<Options, LionOptions>) {
            kernels::lion_step(slice.param, slice.grad, state0, slice.size, options, context,
                               stream_);
          } else {
            static_assert(std::is_same_v<Options, AdagradOptions>);
            kernels::adagrad_step(slice.param, slice.grad, state0, slice.size, options, context,
                                  stream_);
          }
        },
        options_);
  }

  Device device_;
  const UpdateRule& rule_;
  detail::BuiltinRuleOptions options_;
  MemoryTracker& tracker_;
  cudaStream_t stream_ = nullptr;
  DeviceMemory memory_;
  PinnedHostMemory pinned_;
  // Made with the device current (make_cuda_backend's guard).
  CudaStream copy_stream_;     // the async host copies, beside the compute stream
  CudaEvent compute_done_;     // the compute stream's work an async copy waits for
  PinnedHostBuffer scalars_;   // where scan's two results land on the host
  TrackedBuffer scan_result_;  // the sum of squares (double) and the non-finite flag (int)
  TrackedBuffer workspace_;    // CUB's scratch for the sum of squares, grown on demand
};

}  // namespace

std::unique_ptr<detail::ComputeBackend> make_cuda_backend(const Device& device,
                                                          const UpdateRule& rule,
                                                          detail::MemoryTracker& tracker) {
  ZEROSHARD_CHECK_USAGE(device.is_cuda(),
                        "make_cuda_backend: " << device.to_string() << " is not a CUDA device");
  std::optional<detail::BuiltinRuleOptions> options = detail::builtin_rule_options(rule);
  ZEROSHARD_CHECK_USAGE(options.has_value(),
                        "update rule '" << rule.name()
                                        << "' is not one of zeroshard's built-in rules (adamw, "
                                           "adam, sgd, lion, adagrad), which are the only ones "
                                           "that run on a GPU; construct the Engine on "
                                           "Device::cpu() to use your own rule");
  const DeviceGuard guard(device.index);
  return std::make_unique<CudaBackend>(device, rule, std::move(*options), tracker);
}

}  // namespace zeroshard::cuda
