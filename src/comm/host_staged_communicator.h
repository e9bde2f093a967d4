// Collectives on device buffers through a host transport: each collective copies its input into
// host memory, runs the host communicator's collective there and copies the result back. This is
// how GPU ranks that share one GPU communicate, since NCCL refuses two ranks on one device.
#pragma once

#include <cstddef>
#include <memory>

#include "memory/memory_tracker.h"
#include "zeroshard/communicator.h"

namespace zeroshard::detail {

/// Host memory a StagingCopier copies to and from (page-locked, for a GPU), freed on destruction.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual void* data() const noexcept = 0;
  virtual std::size_t bytes() const noexcept = 0;
};

/// A copy in flight.
class StagingCopy {
 public:
  virtual ~StagingCopy() = default;
  /// True once the bytes have arrived; never blocks.
  virtual bool done() = 0;
  virtual void wait() = 0;
};

/// Moves bytes between the device memory the communicator's callers use and staging buffers.
class StagingCopier {
 public:
  virtual ~StagingCopier() = default;
  virtual std::unique_ptr<StagingBuffer> allocate(std::size_t bytes) = 0;
  /// Makes every later copy wait for the work queued on the compute stream so far: the input may
  /// still be being computed, and the output may still be being allocated or zeroed.
  virtual void follow_compute() = 0;
  virtual std::unique_ptr<StagingCopy> to_host(void* host, const void* device,
                                               std::size_t bytes) = 0;
  virtual std::unique_ptr<StagingCopy> to_device(void* device, const void* host,
                                                 std::size_t bytes) = 0;
  /// The stream copies to the host wait for (a cudaStream_t; null is the legacy default stream).
  virtual void set_compute_stream(void* stream) noexcept = 0;
  /// A copier of the same kind, on the same device, for a communicator split from this one.
  virtual std::unique_ptr<StagingCopier> another() const = 0;
};

/// Communicator over device buffers (backend "mpi+staging"): every collective stages through a
/// buffer of a pool that keeps its buffers for reuse, so a training loop allocates staging memory
/// only in its first step. The host collectives start in the order they were called, as the
/// transport requires, each as soon as its copy in (and every earlier one's) has finished; any
/// test() or wait() of a pending request moves them along. Traffic is counted as the host
/// communicator counts it.
class HostStagedCommunicator final : public Communicator {
 public:
  /// What the communicator and its pending requests share; defined in the .cpp.
  struct Core;

  HostStagedCommunicator(std::unique_ptr<Communicator> host_communicator,
                         std::unique_ptr<StagingCopier> copier);
  ~HostStagedCommunicator() override;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string backend() const override;
  DeviceType buffer_device() const noexcept override { return DeviceType::kCuda; }
  void set_compute_stream(void* stream) noexcept override;
  /// The host communicator numbers and times the collectives this one forwards.
  void set_timing(const TimingOptions& options) override;
  std::vector<CollectiveTiming> timings() const override;

  /// Bytes of host memory the staging pool holds (in use or kept for reuse).
  std::size_t staging_bytes() const noexcept;
  /// Counts the staging pool, now and as it grows, as host communication memory in `tracker`,
  /// which must outlive this communicator and its requests.
  void charge_staging_to(MemoryTracker& tracker);

 protected:
  /// Host memory goes to the host communicator as it is: nothing to stage.
  void all_gather_host(void* data, std::span<const std::int64_t> counts, DType dtype) override;
  Request start_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override;
  Request start_reduce_scatter(const void* input, void* output,
                               std::span<const std::int64_t> counts, DType dtype,
                               ReduceOp op) override;
  Request start_all_gather(void* data, std::span<const std::int64_t> counts, DType dtype) override;
  Request start_broadcast(void* data, std::int64_t count, DType dtype, int root) override;
  Request start_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                           void* output, std::span<const std::int64_t> recv_counts,
                           DType dtype) override;
  /// The host communicator split, staged through a copier of the same kind.
  std::unique_ptr<Communicator> make_split(int color, int key) override;
  void run_barrier() override;
  [[noreturn]] void end_job(int error_code) noexcept override;

 private:
  std::shared_ptr<Core> core_;
  int rank_;
  int size_;
};

}  // namespace zeroshard::detail
