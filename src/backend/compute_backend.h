// The memory and arithmetic the engine needs, on the processor its buffers live on: the host
// (cpu_backend.cpp) or one CUDA GPU (cuda/cuda_backend.cpp). Buckets, shards, gathers and the
// overflow logic are written once, over this interface, so the CPU tests exercise the same engine
// code that runs on the GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/cpu/cpu_optimizer.h"      // SquareSums
#include "layout/quantized_block_format.h"  // QuantBits
#include "memory/memory_tracker.h"
#include "optim/builtin_rule.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/optimizer.h"

namespace zeroshard::detail {

/// What the global-norm pass learns about gradients scanned into it, one range or several in
/// turn: the sum of squares of the values as stored (before any unscaling), and whether some
/// element is inf or NaN. Host ranges sum as one range would (cpu_optimizer::SquareSums); a
/// device's range adds its own total.
struct GradientScan {
  cpu_optimizer::SquareSums host;
  double device_sum = 0.0;
  bool device_nonfinite = false;
  double sum_of_squares() const { return host.total() + device_sum; }
  bool nonfinite() const { return device_nonfinite || !std::isfinite(sum_of_squares()); }
};

/// The end of a copy queued on a backend's copy stream (copy_to_host_async, copy_from_host_async).
/// Reusable: each copy given it replaces the one it marks. It must not outlive its backend.
class CopyEvent {
 public:
  virtual ~CopyEvent() = default;
  /// Blocks the host until the marked copy has finished; returns at once when none is marked.
  virtual void wait() = 0;
  /// True once the marked copy has finished, or when none is marked; the host does not block.
  virtual bool finished() = 0;
  /// Makes work queued later on the compute stream wait, on the device, for the marked copy; the
  /// host does not block.
  virtual void order_compute_after() = 0;
};

/// A device's memory as its driver counts it.
struct DeviceMemoryUse {
  std::int64_t total = 0;
  /// Bytes allocated by anything: this engine, other libraries' caches, other processes.
  std::int64_t in_use = 0;
};

/// Every pointer passed in is memory of this backend (from memory()), unless the name says host.
/// Work is queued on stream() in call order; only the calls that return a host value (scan) or
/// fill host memory (copy_to_host) wait for it.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  virtual Device device() const noexcept = 0;
  virtual MemoryResource& memory() noexcept = 0;
  /// Page-locked host memory the device copies to and from without bouncing (cudaHostAlloc);
  /// ordinary host memory on the CPU.
  virtual MemoryResource& pinned_host_memory() noexcept = 0;
  /// The stream the engine's work and the model's compute are ordered on (a cudaStream_t; null is
  /// the legacy default stream and the only value on the CPU).
  virtual void* stream() const noexcept = 0;
  virtual void set_stream(void* stream) = 0;
  /// Waits for all work on the device, whatever stream it was queued on, then returns to the
  /// legacy default stream without touching the one set before: the engine calls it first when
  /// it is destroyed, because a model commonly destroys its stream before the engine, and freeing
  /// a buffer in stream order on a destroyed stream is undefined behaviour.
  virtual void detach_stream() noexcept = 0;
  /// How many fp32 elements the working buffer that 16-bit gradients are widened in should hold,
  /// for a rank that updates `owned` elements: small on the CPU (cache), large on a GPU (fewer
  /// launches).
  virtual std::int64_t working_chunk_elements(std::int64_t owned) const noexcept = 0;
  /// Whether one apply_rule call may span several tensors of the flat buffer (the GPU's fused
  /// element-wise kernels), so that a step is one launch per run of equal hyper-parameters.
  virtual bool fuses_tensors() const noexcept = 0;
  /// The device's memory now. CPU ranks have no device limit, so none, unless
  /// ZEROSHARD_DEVICE_MEMORY (bytes, e.g. "2GiB") rehearses one, with nothing known in use: a
  /// GPU's offload_optimizer.ratio "auto" can then be tried on CPU ranks.
  virtual std::optional<DeviceMemoryUse> device_memory() const = 0;

  virtual void zero(void* data, std::size_t bytes) = 0;
  /// The ranges must not overlap (cudaMemcpy's rule).
  virtual void copy(void* destination, const void* source, std::size_t bytes) = 0;
  /// Blocking copies between host memory and this backend's memory.
  virtual void copy_to_host(void* host, const void* source, std::size_t bytes) = 0;
  virtual void copy_from_host(void* destination, const void* host, std::size_t bytes) = 0;
  /// Copies between pinned_host_memory() and this backend's memory on a copy stream of their own,
  /// so that they overlap the compute stream's work. Each starts after the work queued on the
  /// compute stream so far (which may write its source or still read its destination) and marks
  /// its end in `done`; until then its source must not change nor its destination be read or
  /// freed. `done` must come from this backend's make_copy_event(). On the CPU they are plain
  /// copies, finished on return.
  virtual std::unique_ptr<CopyEvent> make_copy_event() = 0;
  virtual void copy_to_host_async(void* host, const void* source, std::size_t bytes,
                                  CopyEvent& done) = 0;
  virtual void copy_from_host_async(void* destination, const void* host, std::size_t bytes,
                                    CopyEvent& done) = 0;

  /// out[i] = float(in[i]) * multiplier. In place (in == out) only when `from` is fp32.
  virtual void widen(const void* in, DType from, float* out, std::int64_t count,
                     float multiplier) = 0;
  /// out[i] = in[i] rounded to nearest even in `to` (a copy for fp32). No overlap.
  virtual void narrow(const float* in, void* out, DType to, std::int64_t count) = 0;
  /// data[i] *= factor, computed in fp32 and rounded once into `dtype`.
  virtual void scale(void* data, DType dtype, std::int64_t count, float factor) = 0;
  /// destination[i] += source[i], computed in fp32 and rounded once into destination's type.
  virtual void accumulate(void* destination, DType destination_dtype, const void* source,
                          DType source_dtype, std::int64_t count) = 0;
  /// Encodes `count` elements of `dtype` at `in` into quantized_bytes(count, bits) bytes at `out`
  /// (4-byte aligned), the format of comm/quantized_block_format.h, and adds the number of blocks
  /// holding inf or NaN (encoded as zeros) to the int at `nonfinite_blocks`, never clearing it.
  virtual void quantize_blocks(const void* in, DType dtype, std::int64_t count, QuantBits bits,
                               void* out, int* nonfinite_blocks) = 0;
  /// Decodes `count` elements encoded by quantize_blocks at `in` into `out` of `dtype`.
  virtual void dequantize_blocks(const void* in, QuantBits bits, std::int64_t count, void* out,
                                 DType dtype) = 0;
  /// Adds the sum of squares (in double) and the inf/NaN check of `count` elements to `scan`;
  /// waits.
  virtual void scan(const void* data, DType dtype, std::int64_t count, GradientScan& scan) = 0;
  /// Runs the engine's update rule on one slice (slice.grad unused): reads the gradient as `io`
  /// says (its type, times io.grad_factor), updates the master weights and states in place and
  /// writes io.param_copy, every pointer in this memory. `scratch` (fp32, this memory, possibly
  /// empty) is where a rule that reads only fp32 gets its gradients widened, a chunk at a time;
  /// without scratch such a backend scales an fp32 gradient in place (the step consumes it).
  virtual void apply_rule(const ShardSlice& slice, const FusedStepIo& io,
                          const StepContext& context, std::span<float> scratch) = 0;
  /// Blocks the host until everything queued so far has finished.
  virtual void synchronize() = 0;
};

/// How a rule that reads only fp32 gradients takes any: `apply` runs on consecutive parts of
/// `slice` of at most buffer.size() elements, each after `widen(gradient, dtype, buffer, count,
/// factor)` has put that part's gradient, times io.grad_factor, into `buffer`.
template <class Widen, class Apply>
void apply_in_widened_chunks(const ShardSlice& slice, const FusedStepIo& io,
                             std::span<float> buffer, Widen&& widen, Apply&& apply) {
  const auto chunk = static_cast<std::int64_t>(buffer.size());
  const auto element = static_cast<std::int64_t>(size_of(io.grad_dtype));
  std::vector<float*> states(slice.states.size());
  for (std::int64_t done = 0; done < slice.size; done += chunk) {
    const std::int64_t n = std::min(chunk, slice.size - done);
    widen(static_cast<const char*>(io.grad) + done * element, io.grad_dtype, buffer.data(), n,
          io.grad_factor);
    for (std::size_t s = 0; s < states.size(); ++s) states[s] = slice.states[s] + done;
    ShardSlice part = slice;
    part.offset_in_param += done;
    part.size = n;
    part.param += done;
    part.grad = buffer.data();
    part.states = states;
    apply(part);
  }
}

/// The host backend: `rule` runs as given, in the calling thread; the built-in rules, the scan and
/// zeroing split large ranges over `team` OpenMP threads (0: OpenMP's default team).
std::unique_ptr<ComputeBackend> make_cpu_backend(const UpdateRule& rule, int team = 0);

/// The backend for `device`. For a CUDA device `rule` must be one of the built-in rules (it runs
/// as a fused kernel); a user's own rule gets UsageError naming it. Working memory the backend
/// needs beyond the engine's buffers is charged to `tracker` under communication.
std::unique_ptr<ComputeBackend> make_compute_backend(const Device& device, const UpdateRule& rule,
                                                     MemoryTracker& tracker);

}  // namespace zeroshard::detail
