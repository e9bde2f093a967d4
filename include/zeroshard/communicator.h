// The collective-communication interface the engine talks to, with one implementation per
// transport (MPI for CPU ranks, NCCL for GPU ranks), and its per-collective traffic counters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/export.h"

/// NCCL's communicator (nccl.h: typedef struct ncclComm* ncclComm_t), declared here so that this
/// header needs no nccl.h.
struct ncclComm;

namespace zeroshard {

namespace detail {
class CollectiveTracker;  // sequence numbers, flight recorder and failure state (src/)
}  // namespace detail

/// Which collective a counter or an error refers to.
enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kAllToAll };
inline constexpr int kCollectiveCount = 6;
ZEROSHARD_API const char* to_string(Collective collective) noexcept;

/// Elements and bytes this rank has sent, per collective, under the convention stated in
/// docs/architecture.md: an all-reduce of n elements counts 2n (its reduce-scatter and
/// all-gather halves), a reduce-scatter of n input elements counts n, an all-gather producing n
/// output elements counts n, a broadcast of n counts n, a barrier counts a call and no elements,
/// an all-to-all counts the elements it sends to the other ranks (not its own block).
/// Ring factors (N-1)/N are not applied, so the counts do not depend on the algorithm the
/// transport picks.
struct ZEROSHARD_API TrafficCounters {
  std::int64_t elements[kCollectiveCount] = {};
  std::int64_t bytes[kCollectiveCount] = {};
  std::int64_t calls[kCollectiveCount] = {};

  std::int64_t total_elements() const noexcept;
  std::int64_t total_bytes() const noexcept;
};

/// Collectives of one kind and message size (elements x element bytes) timed from their start to
/// the completion a wait() or test() saw (comms_logger).
struct CollectiveTiming {
  Collective op = Collective::kBarrier;
  std::int64_t message_bytes = 0;
  std::int64_t calls = 0;
  double seconds = 0.0;
};

/// Which collectives Communicator::set_timing() times, and whether each is logged as it ends.
struct TimingOptions {
  bool enabled = false;
  bool kinds[kCollectiveCount] = {true, true, true, true, true, true};
  bool log_each = false;    ///< log every timed collective as it completes
  bool log_detail = false;  ///< those lines also name its sequence number and dtype
};

/// Completion of an asynchronous collective. Move-only; destroying a pending request, or assigning
/// over it, waits for it, so a buffer never outlives the transfer that reads or writes it. Errors
/// met by that implicit wait are logged (zeroshard/log.h), since a destructor cannot throw.
///
/// When wait() or test() throws a transport error the request stays pending: wait() may be called
/// again. A timeout is final for the whole communicator: from then on every wait() or test() of
/// any of its requests, and every new collective, throws TimeoutError at once, pointing at the
/// first timeout, so that several requests in flight fail within one timeout, not one each.
/// Destroying a failed request abandons the transfer instead of waiting again, so an error never
/// turns into a hang; the transport may then still touch the buffers, so treat the communicator
/// as broken and end the job.
class ZEROSHARD_API Request {
 public:
  class ZEROSHARD_API Impl {
   public:
    virtual ~Impl() = default;
    /// Blocks until done; throws CommError/TimeoutError naming the rank and collective.
    virtual void wait() = 0;
    /// True once the transfer has completed (drives progress where the transport needs it).
    virtual bool test() = 0;
  };

  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  /// Blocks until the collective has finished. A no-op on an empty or completed request.
  void wait();
  /// Non-blocking completion check; true for an empty or completed request.
  bool test();
  bool pending() const noexcept { return impl_ != nullptr; }

 private:
  friend class Communicator;  // attaches the tracker to the requests it numbers

  // A request numbered `seq` by `tracker`, which records its completion and failure.
  ZEROSHARD_LOCAL Request(std::unique_ptr<Impl> impl,
                          std::shared_ptr<detail::CollectiveTracker> tracker, std::int64_t seq);

  // Checks the communicator has not timed out, runs `step`, and records its outcome.
  template <class Step>
  bool track(Step step);

  std::unique_ptr<Impl> impl_;
  // Set when wait() or test() threw: destruction then abandons the transfer instead of waiting.
  bool failed_ = false;
  std::shared_ptr<detail::CollectiveTracker> tracker_;  // null for an untracked request
  std::int64_t seq_ = 0;
};

/// Reduction applied by all_reduce and reduce_scatter.
enum class ReduceOp { kSum, kMax };

/// Collectives over the data-parallel ranks. Every rank must issue the same collectives in the
/// same order; buffers are host pointers for the MPI backend and device pointers for NCCL.
/// Counts may differ per rank where a vector of counts is given (shards need not be equal).
///
/// Every collective gets a sequence number (1, 2, ... per communicator) and an entry in a flight
/// recorder, a ring of the last ZEROSHARD_FLIGHT_RECORDER_SIZE (default 256) collectives. A
/// timeout names the collective by number and says what the transport knows of the other ranks;
/// with ZEROSHARD_TRACE_DIR set, a timeout or abort() writes the ring of every communicator of the
/// process to DIR/rank-R[.comm-N].json, which the zeroshard-trace tool reads
/// (docs/troubleshooting.md).
class ZEROSHARD_API Communicator {
 public:
  virtual ~Communicator();
  Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// The world this process was started in: MPI under mpirun/srun (detected from the launcher's
  /// environment), a world of one otherwise. Each call returns a new communicator over a
  /// duplicated MPI communicator, so independent engines never mix their messages.
  static std::unique_ptr<Communicator> from_environment();
  /// A communicator for buffers on `device`: from_environment() for the CPU. For a GPU: NCCL when
  /// each rank has a GPU of its own (or the world is one rank), bootstrapped through MPI under an
  /// MPI launcher and through RANK, WORLD_SIZE, LOCAL_RANK and ZEROSHARD_RDZV_FILE otherwise;
  /// MPI with host staging ("mpi+staging") when ranks share a GPU, which NCCL refuses.
  /// ZEROSHARD_COMM_BACKEND=nccl or mpi overrides the choice.
  static std::unique_ptr<Communicator> from_environment(const Device& device);

  /// MPI over the program's own communicator `comm` (an MPI_Comm), duplicated so that the
  /// engine's messages never match the program's: the data-parallel group of a run that also
  /// splits its ranks for tensor or pipeline parallelism (MPI_Comm_split). Collective over
  /// `comm`. Defined in zeroshard/communicator_mpi.h, the one public header that includes
  /// <mpi.h>; a program that does not call it needs no MPI headers.
  template <typename MpiComm>
  static std::unique_ptr<Communicator> from_mpi(MpiComm comm);
  /// from_mpi's implementation, for `comm` given as its Fortran handle (MPI_Comm_c2f): an integer
  /// in every MPI, so that the library's symbols do not depend on how an MPI defines MPI_Comm.
  static std::unique_ptr<Communicator> from_mpi_handle(int fortran_handle);
  /// NCCL over the program's own communicator `comm` (an ncclComm_t), on the current CUDA device:
  /// a new communicator split from it with every rank in the same order (ncclCommSplit), so that
  /// the engine's collectives are never mixed with the program's. Collective over `comm`; the
  /// program keeps and destroys `comm`. Throws UsageError in a build without CUDA.
  static std::unique_ptr<Communicator> from_nccl(ncclComm* comm);
  /// A data-parallel group split from the program's NCCL communicator `parent`: the ranks that
  /// pass the same `color` (>= 0) form one communicator, ranked by `key` (ncclCommSplit).
  /// Collective over `parent`.
  static std::unique_ptr<Communicator> from_nccl(ncclComm* parent, int color, int key);

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// "mpi", "nccl", "mpi+staging" or "self".
  virtual std::string backend() const = 0;
  /// Where the buffers passed to the collectives live: host memory (MPI, self) or the memory of
  /// the rank's GPU (NCCL, and MPI with host staging).
  virtual DeviceType buffer_device() const noexcept { return DeviceType::kCpu; }
  /// For GPU buffers: each later collective waits for the work queued on this stream (a
  /// cudaStream_t; null is the legacy default stream) before it reads its buffers.
  virtual void set_compute_stream(void* /*stream*/) noexcept {}

  /// In place: `data` (count elements) becomes the element-wise reduction over all ranks.
  Request all_reduce_async(void* data, std::int64_t count, DType dtype, ReduceOp op);

  /// `input` holds sum(counts) elements laid out rank after rank; this rank receives the reduction
  /// of its slice (counts[rank] elements) in `output`. `output` is either that slice of `input`
  /// itself (in place: no receive buffer, and the rest of `input` is left as it was) or does not
  /// overlap `input`; each rank may choose for itself.
  Request reduce_scatter_async(const void* input, void* output,
                               std::span<const std::int64_t> counts, DType dtype, ReduceOp op);

  /// In place: `data` holds sum(counts) elements laid out rank after rank; this rank's slice
  /// (counts[rank] elements at offset sum(counts[0..rank))) is already filled and every other
  /// rank's slice is filled on completion.
  Request all_gather_async(void* data, std::span<const std::int64_t> counts, DType dtype);

  Request broadcast_async(void* data, std::int64_t count, DType dtype, int root);

  /// `input` holds, rank after rank, send_counts[r] elements for rank r; `output` receives, rank
  /// after rank, recv_counts[r] elements from rank r. What this rank sends to r must be what r
  /// expects from it (its recv_counts[this rank]). The buffers must not overlap.
  Request all_to_all_async(const void* input, std::span<const std::int64_t> send_counts,
                           void* output, std::span<const std::int64_t> recv_counts, DType dtype);

  void barrier();

  /// Collective: the ranks passing the same `color` (>= 0) form a new communicator of the same
  /// transport, ranked by `key` and then by rank here; for groups inside a data-parallel world,
  /// such as the ranks of one host.
  std::unique_ptr<Communicator> split(int color, int key);

  /// Ends every rank's process with `error_code` (MPI_Abort under MPI): for a rank that fails
  /// alone, so that the others do not wait for it in their next collective for ever. Writes the
  /// flight recorder of every communicator of the process first when ZEROSHARD_TRACE_DIR is set.
  [[noreturn]] void abort(int error_code) noexcept;

  /// Collective: every rank's `text`, in rank order, on every rank (reports, diagnostics).
  std::vector<std::string> all_gather_text(const std::string& text);

  /// Blocking conveniences over the asynchronous calls.
  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(data, count, dtype, op).wait();
  }
  void reduce_scatter(const void* input, void* output, std::span<const std::int64_t> counts,
                      DType dtype, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(input, output, counts, dtype, op).wait();
  }
  void all_gather(void* data, std::span<const std::int64_t> counts, DType dtype) {
    all_gather_async(data, counts, dtype).wait();
  }
  void broadcast(void* data, std::int64_t count, DType dtype, int root) {
    broadcast_async(data, count, dtype, root).wait();
  }
  void all_to_all(const void* input, std::span<const std::int64_t> send_counts, void* output,
                  std::span<const std::int64_t> recv_counts, DType dtype) {
    all_to_all_async(input, send_counts, output, recv_counts, dtype).wait();
  }

  /// Typed overloads for fp32 and fp64: the element type gives the DType, so a buffer of another
  /// type does not compile, and the span's size is checked against the counts (UsageError naming
  /// the collective and both sizes). 16-bit buffers use the overloads above.
  Request all_reduce_async(std::span<float> data, ReduceOp op = ReduceOp::kSum);
  Request all_reduce_async(std::span<double> data, ReduceOp op = ReduceOp::kSum);
  void all_reduce(std::span<float> data, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(data, op).wait();
  }
  void all_reduce(std::span<double> data, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(data, op).wait();
  }
  /// `input` holds sum(counts) elements; `output` holds counts[rank()].
  Request reduce_scatter_async(std::span<const float> input, std::span<float> output,
                               std::span<const std::int64_t> counts, ReduceOp op = ReduceOp::kSum);
  Request reduce_scatter_async(std::span<const double> input, std::span<double> output,
                               std::span<const std::int64_t> counts, ReduceOp op = ReduceOp::kSum);
  void reduce_scatter(std::span<const float> input, std::span<float> output,
                      std::span<const std::int64_t> counts, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(input, output, counts, op).wait();
  }
  void reduce_scatter(std::span<const double> input, std::span<double> output,
                      std::span<const std::int64_t> counts, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(input, output, counts, op).wait();
  }
  /// `data` holds sum(counts) elements.
  Request all_gather_async(std::span<float> data, std::span<const std::int64_t> counts);
  Request all_gather_async(std::span<double> data, std::span<const std::int64_t> counts);
  void all_gather(std::span<float> data, std::span<const std::int64_t> counts) {
    all_gather_async(data, counts).wait();
  }
  void all_gather(std::span<double> data, std::span<const std::int64_t> counts) {
    all_gather_async(data, counts).wait();
  }
  Request broadcast_async(std::span<float> data, int root);
  Request broadcast_async(std::span<double> data, int root);
  void broadcast(std::span<float> data, int root) { broadcast_async(data, root).wait(); }
  void broadcast(std::span<double> data, int root) { broadcast_async(data, root).wait(); }

  /// Counters of what this rank has sent since construction or the last reset.
  const TrafficCounters& traffic() const noexcept { return traffic_; }
  void reset_traffic() noexcept { traffic_ = TrafficCounters{}; }

  /// Times the collectives `options` names from now on (or stops). A collective's time runs from
  /// its start to the wait() or test() that sees it complete, so an asynchronous one also counts
  /// the work done before that wait.
  virtual void set_timing(const TimingOptions& options);
  /// What was timed since set_timing(), per kind and message size, in kind then size order.
  virtual std::vector<CollectiveTiming> timings() const;

 protected:
  /// The transport's collectives, called by the public ones above, which number and record them.
  virtual Request start_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) = 0;
  virtual Request start_reduce_scatter(const void* input, void* output,
                                       std::span<const std::int64_t> counts, DType dtype,
                                       ReduceOp op) = 0;
  virtual Request start_all_gather(void* data, std::span<const std::int64_t> counts,
                                   DType dtype) = 0;
  virtual Request start_broadcast(void* data, std::int64_t count, DType dtype, int root) = 0;
  /// All-to-all and split are newer than the other collectives: a transport that lacks them
  /// inherits these defaults, which throw UsageError naming the backend.
  virtual Request start_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                                   void* output, std::span<const std::int64_t> recv_counts,
                                   DType dtype);
  virtual std::unique_ptr<Communicator> make_split(int color, int key);
  virtual void run_barrier() = 0;
  [[noreturn]] virtual void end_job(int error_code) noexcept = 0;

  /// all_gather_text's in-place all-gather of host memory. The default is all_gather(), for
  /// communicators that take host buffers; one whose buffers live on a device overrides it.
  virtual void all_gather_host(void* data, std::span<const std::int64_t> counts, DType dtype);

  /// Implementations call this once per collective they start.
  void count_traffic(Collective collective, std::int64_t elements, DType dtype) noexcept;

  /// Turns numbering and recording off: for a communicator that only forwards to another one,
  /// which numbers the same collectives itself. Call from the constructor.
  void forward_tracking_to_inner() noexcept;
  /// The numbering, recording and failure state of this communicator (null when forwarded).
  const std::shared_ptr<detail::CollectiveTracker>& tracker() const noexcept { return tracker_; }

 private:
  template <class Start>
  Request tracked(Collective collective, std::int64_t count, std::optional<DType> dtype,
                  Start start);

  TrafficCounters traffic_;
  std::shared_ptr<detail::CollectiveTracker> tracker_;
};

}  // namespace zeroshard
