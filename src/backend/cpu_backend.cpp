// The host implementation of ComputeBackend: plain loops the compiler vectorises, the update rule
// called in the engine's thread, and 16-bit values widened through small stack buffers so that no
// operation needs working memory of its own.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "backend/compute_backend.h"
#include "kernels/cpu/block_quantizer.h"
#include "kernels/cpu/cpu_optimizer.h"
#include "memory/host_first_touch.h"  // zero_host, copy_host
#include "precision/half_conversion.h"
#include "util/check.h"
#include "util/cpu_team.h"
#include "zeroshard/quantity.h"

#if ZEROSHARD_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace zeroshard::detail {
namespace {

// Elements of 16-bit data widened at once: two such fp32 blocks stay well inside L1.
constexpr std::int64_t kBlock = 1024;
// A rank's fp32 working chunk for 16-bit gradients: 256 KiB, an L2-sized tile.
constexpr std::int64_t kWorkingChunk = std::int64_t{1} << 16;

const char* at(const void* data, DType dtype, std::int64_t index) {
  return static_cast<const char*>(data) + index * static_cast<std::int64_t>(size_of(dtype));
}
char* at(void* data, DType dtype, std::int64_t index) {
  return static_cast<char*>(data) + index * static_cast<std::int64_t>(size_of(dtype));
}

/// The host copies as soon as it is asked, so a copy is always finished.
class FinishedCopy final : public CopyEvent {
 public:
  void wait() override {}
  bool finished() override { return true; }
  void order_compute_after() override {}
};

class CpuBackend final : public ComputeBackend {
 public:
  CpuBackend(const UpdateRule& rule, int team)
      : rule_(rule), builtin_(dynamic_cast<const BuiltinRule*>(&rule)), team_(team) {}

  Device device() const noexcept override { return Device::cpu(); }
  MemoryResource& memory() noexcept override { return host_memory(); }
  MemoryResource& pinned_host_memory() noexcept override { return host_memory(); }
  void* stream() const noexcept override { return nullptr; }
  void set_stream(void* stream) override {
    ZEROSHARD_CHECK_USAGE(stream == nullptr,
                          "set_compute_stream: the engine computes on the CPU, which has no "
                          "streams; construct it with a CUDA Device to use one");
  }
  void detach_stream() noexcept override {}
  std::int64_t working_chunk_elements(std::int64_t owned) const noexcept override {
    return std::max<std::int64_t>(2, std::min(owned, kWorkingChunk));
  }
  bool fuses_tensors() const noexcept override { return false; }
  std::optional<DeviceMemoryUse> device_memory() const override {
    const char* rehearsed = std::getenv("ZEROSHARD_DEVICE_MEMORY");
    if (rehearsed == nullptr || *rehearsed == '\0') return std::nullopt;
    return DeviceMemoryUse{.total = parse_bytes(rehearsed, "ZEROSHARD_DEVICE_MEMORY")};
  }

  void zero(void* data, std::size_t bytes) override {
    const CpuTeamScope team(team_);
    zero_host(data, bytes);
  }
  void copy(void* destination, const void* source, std::size_t bytes) override {
    const CpuTeamScope team(team_);
    copy_host(destination, source, bytes);
  }
  void copy_to_host(void* host, const void* source, std::size_t bytes) override {
    copy(host, source, bytes);
  }
  void copy_from_host(void* destination, const void* host, std::size_t bytes) override {
    copy(destination, host, bytes);
  }
  std::unique_ptr<CopyEvent> make_copy_event() override { return std::make_unique<FinishedCopy>(); }
  void copy_to_host_async(void* host, const void* source, std::size_t bytes, CopyEvent&) override {
    copy(host, source, bytes);
  }
  void copy_from_host_async(void* destination, const void* host, std::size_t bytes,
                            CopyEvent&) override {
    copy(destination, host, bytes);
  }

  void widen(const void* in, DType from, float* out, std::int64_t count,
             float multiplier) override {
    if (from != DType::kFloat32) convert_to_float(in, from, out, count);
    const float* source = from == DType::kFloat32 ? static_cast<const float*>(in) : out;
    if (multiplier == 1.0f) {
      if (source != out) std::memmove(out, source, count * sizeof(float));
      return;
    }
#pragma omp simd
    for (std::int64_t i = 0; i < count; ++i) out[i] = source[i] * multiplier;
  }

  void narrow(const float* in, void* out, DType to, std::int64_t count) override {
    convert_from_float(in, out, to, count);
  }

  void scale(void* data, DType dtype, std::int64_t count, float factor) override {
    if (dtype == DType::kFloat32) {
      float* d = static_cast<float*>(data);
#pragma omp simd
      for (std::int64_t i = 0; i < count; ++i) d[i] *= factor;
      return;
    }
    float block[kBlock];
    for (std::int64_t done = 0; done < count; done += kBlock) {
      const std::int64_t n = std::min(kBlock, count - done);
      convert_to_float(at(data, dtype, done), dtype, block, n);
      for (std::int64_t i = 0; i < n; ++i) block[i] *= factor;
      convert_from_float(block, at(data, dtype, done), dtype, n);
    }
  }

  void accumulate(void* destination, DType destination_dtype, const void* source,
                  DType source_dtype, std::int64_t count) override {
    if (destination_dtype == DType::kFloat32 && source_dtype == DType::kFloat32) {
      float* d = static_cast<float*>(destination);
      const float* s = static_cast<const float*>(source);
#pragma omp simd
      for (std::int64_t i = 0; i < count; ++i) d[i] += s[i];
      return;
    }
    float sum[kBlock];
    float addend[kBlock];
    for (std::int64_t done = 0; done < count; done += kBlock) {
      const std::int64_t n = std::min(kBlock, count - done);
      convert_to_float(at(destination, destination_dtype, done), destination_dtype, sum, n);
      convert_to_float(at(source, source_dtype, done), source_dtype, addend, n);
      for (std::int64_t i = 0; i < n; ++i) sum[i] += addend[i];
      convert_from_float(sum, at(destination, destination_dtype, done), destination_dtype, n);
    }
  }

  void scan(const void* data, DType dtype, std::int64_t count, GradientScan& scan) override {
    // In tiles over the OpenMP team, summed in a fixed order: stage 0 must find stages 1-3's
    // norm bit for bit, whatever the thread count.
    const CpuTeamScope team(team_);
    cpu_optimizer::add_sum_of_squares(cpu_optimizer::active_isa(), data, dtype, count, scan.host);
  }

  void apply_rule(const ShardSlice& slice, const FusedStepIo& io, const StepContext& context,
                  std::span<float> scratch) override {
    const CpuTeamScope team(team_);
    if (builtin_ != nullptr) {
      builtin_->apply_fused(slice, io, context);
      return;
    }
    // A user's rule reads fp32 gradients with the factor applied: widened a chunk at a time.
    if (io.grad_dtype == DType::kFloat32 && io.grad_factor == 1.0f) {
      ShardSlice whole = slice;
      whole.grad = static_cast<const float*>(io.grad);
      rule_.apply(whole, context);
    } else {
      float block[kBlock];
      const std::span<float> buffer = scratch.empty() ? std::span<float>(block) : scratch;
      apply_in_widened_chunks(
          slice, io, buffer,
          [this](const void* in, DType from, float* out, std::int64_t n, float factor) {
            widen(in, from, out, n, factor);
          },
          [&](const ShardSlice& part) { rule_.apply(part, context); });
    }
    if (io.param_copy != nullptr)
      narrow(slice.param, io.param_copy, io.param_copy_dtype, slice.size);
    if (io.grad_to_clear != nullptr) zero(io.grad_to_clear, slice.size * size_of(io.grad_dtype));
  }

  void quantize_blocks(const void* in, DType dtype, std::int64_t count, QuantBits bits, void* out,
                       int* nonfinite_blocks) override {
    *nonfinite_blocks += static_cast<int>(detail::quantize_blocks(in, dtype, count, bits, out));
  }

  void dequantize_blocks(const void* in, QuantBits bits, std::int64_t count, void* out,
                         DType dtype) override {
    detail::dequantize_blocks(in, bits, count, out, dtype);
  }

  void synchronize() override {}

 private:
  const UpdateRule& rule_;
  const BuiltinRule* builtin_;  ///< null for a user's own rule
  int team_;                    ///< threads of its parallel loops; 0: OpenMP's default
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cpu_backend(const UpdateRule& rule, int team) {
  return std::make_unique<CpuBackend>(rule, team);
}

std::unique_ptr<ComputeBackend> make_compute_backend(const Device& device, const UpdateRule& rule,
                                                     [[maybe_unused]] MemoryTracker& tracker) {
  if (!device.is_cuda()) return make_cpu_backend(rule);
#if ZEROSHARD_WITH_CUDA
  return cuda::make_cuda_backend(device, rule, tracker);
#else
  throw UsageError("device " + device.to_string() + ": " + cuda_unavailable_reason());
#endif
}

}  // namespace zeroshard::detail
