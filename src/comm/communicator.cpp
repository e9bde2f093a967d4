// The transport-independent half of the communicator: requests, traffic counters, collective
// names, and the choice of backend from the launcher's environment.
#include "zeroshard/communicator.h"

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "comm/collective_tracker.h"
#include "comm/cuda/gpu_communicator_factory.h"
#include "comm/mpi_communicator.h"
#include "comm/rank_counts.h"
#include "comm/self_communicator.h"
#include "comm/text_gather.h"
#include "util/check.h"
#include "util/log.h"
#include "util/text.h"
#include "zeroshard/communicator_mpi.h"

namespace zeroshard {
namespace {

// The implicit wait of a destructor or a move assignment: it cannot throw, so errors go to
// the log. A request that already failed, or whose communicator timed out, is not waited on (the
// Impl's destructor abandons it), so an error never becomes a hang, nor one timeout several.
void finish_quietly(std::unique_ptr<Request::Impl> impl, bool failed,
                    const std::shared_ptr<detail::CollectiveTracker>& tracker,
                    std::int64_t seq) noexcept {
  if (!impl || failed || (tracker && tracker->timed_out())) return;
  try {
    impl->wait();
    if (tracker) tracker->complete(seq);
  } catch (const std::exception& error) {
    ZEROSHARD_LOG(kError, "error while waiting for a dropped request: " << error.what());
  }
}

bool launched_by_mpi_launcher() {
  const auto is_set = [](const char* name) { return std::getenv(name) != nullptr; };
  return is_set("OMPI_COMM_WORLD_SIZE") || is_set("PMI_SIZE") || is_set("PMIX_RANK") ||
         (is_set("SLURM_NTASKS") && is_set("SLURM_PROCID"));
}

}  // namespace

const char* to_string(Collective collective) noexcept {
  switch (collective) {
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kAllToAll:
      return "all-to-all";
  }
  return "unknown collective";
}

std::int64_t TrafficCounters::total_elements() const noexcept {
  std::int64_t total = 0;
  for (std::int64_t value : elements) total += value;
  return total;
}

std::int64_t TrafficCounters::total_bytes() const noexcept {
  std::int64_t total = 0;
  for (std::int64_t value : bytes) total += value;
  return total;
}

Request::Request(std::unique_ptr<Impl> impl, std::shared_ptr<detail::CollectiveTracker> tracker,
                 std::int64_t seq)
    : impl_(std::move(impl)), tracker_(std::move(tracker)), seq_(seq) {}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish_quietly(std::move(impl_), failed_, tracker_, seq_);
    impl_ = std::move(other.impl_);
    failed_ = std::exchange(other.failed_, false);
    tracker_ = std::move(other.tracker_);
    seq_ = other.seq_;
  }
  return *this;
}

Request::~Request() { finish_quietly(std::move(impl_), failed_, tracker_, seq_); }

template <class Step>
bool Request::track(Step step) {
  bool done = false;
  try {
    if (tracker_) tracker_->check_usable(seq_);
    done = step();
  } catch (const TimeoutError& error) {
    failed_ = true;
    // The first timeout of a communicator is diagnosed; later ones already point at it.
    if (!tracker_ || tracker_->timed_out()) throw;
    throw TimeoutError(tracker_->diagnose_timeout(seq_, error.what()));
  } catch (...) {
    failed_ = true;
    if (tracker_) tracker_->fail(seq_);
    throw;
  }
  if (done) {
    if (tracker_) tracker_->complete(seq_);
    impl_.reset();
    failed_ = false;
  }
  return done;
}

void Request::wait() {
  if (!impl_) return;
  track([this] {
    impl_->wait();
    return true;
  });
}

bool Request::test() {
  if (!impl_) return true;
  return track([this] { return impl_->test(); });
}

Communicator::Communicator() : tracker_(std::make_shared<detail::CollectiveTracker>()) {}

Communicator::~Communicator() = default;

void Communicator::forward_tracking_to_inner() noexcept { tracker_.reset(); }

void Communicator::set_timing(const TimingOptions& options) {
  if (tracker_) tracker_->set_timing(options);
}

std::vector<CollectiveTiming> Communicator::timings() const {
  return tracker_ ? tracker_->timings() : std::vector<CollectiveTiming>{};
}

template <class Start>
Request Communicator::tracked(Collective collective, std::int64_t count, std::optional<DType> dtype,
                              Start start) {
  if (!tracker_) return start();
  if (!tracker_->identified()) tracker_->identify(rank(), size(), backend());
  const std::int64_t seq = tracker_->begin(collective, count, dtype);
  Request request;
  try {
    request = start();
  } catch (const TimeoutError& error) {
    if (tracker_->timed_out()) throw;
    throw TimeoutError(tracker_->diagnose_timeout(seq, error.what()));
  } catch (...) {
    tracker_->fail(seq);
    throw;
  }
  if (!request.pending()) {
    tracker_->complete(seq);
    return request;
  }
  return Request(std::move(request.impl_), tracker_, seq);
}

Request Communicator::all_reduce_async(void* data, std::int64_t count, DType dtype, ReduceOp op) {
  return tracked(Collective::kAllReduce, count, dtype,
                 [&] { return start_all_reduce(data, count, dtype, op); });
}

Request Communicator::reduce_scatter_async(const void* input, void* output,
                                           std::span<const std::int64_t> counts, DType dtype,
                                           ReduceOp op) {
  return tracked(Collective::kReduceScatter, detail::total_of(counts), dtype,
                 [&] { return start_reduce_scatter(input, output, counts, dtype, op); });
}

Request Communicator::all_gather_async(void* data, std::span<const std::int64_t> counts,
                                       DType dtype) {
  return tracked(Collective::kAllGather, detail::total_of(counts), dtype,
                 [&] { return start_all_gather(data, counts, dtype); });
}

Request Communicator::broadcast_async(void* data, std::int64_t count, DType dtype, int root) {
  return tracked(Collective::kBroadcast, count, dtype,
                 [&] { return start_broadcast(data, count, dtype, root); });
}

Request Communicator::all_to_all_async(const void* input, std::span<const std::int64_t> send_counts,
                                       void* output, std::span<const std::int64_t> recv_counts,
                                       DType dtype) {
  return tracked(Collective::kAllToAll, detail::total_of(send_counts), dtype,
                 [&] { return start_all_to_all(input, send_counts, output, recv_counts, dtype); });
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  ZEROSHARD_CHECK_USAGE(color >= 0, "Communicator::split: got color "
                                        << color << " on rank " << rank() << ", expected >= 0");
  return make_split(color, key);
}

Request Communicator::start_all_to_all(const void*, std::span<const std::int64_t>, void*,
                                       std::span<const std::int64_t>, DType) {
  throw UsageError("the '" + backend() + "' communicator has no all-to-all (rank " +
                   std::to_string(rank()) + "); zero_quantized_gradients needs one");
}

std::unique_ptr<Communicator> Communicator::make_split(int, int) {
  throw UsageError("the '" + backend() + "' communicator cannot be split (rank " +
                   std::to_string(rank()) +
                   "); zero_hpz_partition_size and zero_quantized_gradients need node groups");
}

// A barrier is a collective that completes before it returns: an empty request.
void Communicator::barrier() {
  tracked(Collective::kBarrier, 0, std::nullopt, [&] {
    run_barrier();
    return Request();
  });
}

void Communicator::abort(int error_code) noexcept {
  // Every communicator of the process: the engine's records may be what explains the program's
  // reason to abort.
  detail::CollectiveTracker::dump_all(nullptr, "abort(" + std::to_string(error_code) +
                                                   ") called on rank " + std::to_string(rank()));
  end_job(error_code);
  // end_job ends the process; the compiler cannot see that through the virtual call.
  std::_Exit(error_code);
}

void Communicator::count_traffic(Collective collective, std::int64_t elements,
                                 DType dtype) noexcept {
  const auto index = static_cast<std::size_t>(collective);
  traffic_.elements[index] += elements;
  traffic_.bytes[index] += elements * static_cast<std::int64_t>(size_of(dtype));
  traffic_.calls[index] += 1;
}

std::unique_ptr<Communicator> Communicator::from_environment() {
  std::unique_ptr<Communicator> communicator;
  if (launched_by_mpi_launcher()) {
    communicator = detail::make_mpi_communicator(
        {.timeout = detail::collective_timeout_from_environment(),
         .reduce_scatter = detail::reduce_scatter_algorithm_from_environment()});
  } else {
    communicator = detail::make_self_communicator();
  }
  detail::set_rank_for_messages(communicator->rank());
  return communicator;
}

namespace {

// The typed overloads' contract: the span holds exactly the elements the collective reads or
// writes, since an MPI or NCCL call would otherwise run past its end.
void check_span(Collective collective, const char* which, std::size_t got, std::int64_t expected) {
  if (static_cast<std::int64_t>(got) != expected) {
    throw UsageError(std::string(to_string(collective)) + ": " + which + " holds " +
                     std::to_string(got) + " elements, but the counts need " +
                     std::to_string(expected));
  }
}

template <class T>
constexpr DType kDTypeOf = std::is_same_v<T, double> ? DType::kFloat64 : DType::kFloat32;

template <class T>
Request typed_all_reduce(Communicator& c, std::span<T> data, ReduceOp op) {
  return c.all_reduce_async(data.data(), static_cast<std::int64_t>(data.size()), kDTypeOf<T>, op);
}

template <class T>
Request typed_reduce_scatter(Communicator& c, std::span<const T> input, std::span<T> output,
                             std::span<const std::int64_t> counts, ReduceOp op) {
  ZEROSHARD_CHECK_USAGE(
      static_cast<int>(counts.size()) == c.size(),
      "reduce-scatter: got " << counts.size() << " counts for " << c.size() << " ranks");
  check_span(Collective::kReduceScatter, "input", input.size(), detail::total_of(counts));
  check_span(Collective::kReduceScatter, "output", output.size(),
             counts[static_cast<std::size_t>(c.rank())]);
  return c.reduce_scatter_async(input.data(), output.data(), counts, kDTypeOf<T>, op);
}

template <class T>
Request typed_all_gather(Communicator& c, std::span<T> data, std::span<const std::int64_t> counts) {
  ZEROSHARD_CHECK_USAGE(
      static_cast<int>(counts.size()) == c.size(),
      "all-gather: got " << counts.size() << " counts for " << c.size() << " ranks");
  check_span(Collective::kAllGather, "data", data.size(), detail::total_of(counts));
  return c.all_gather_async(data.data(), counts, kDTypeOf<T>);
}

template <class T>
Request typed_broadcast(Communicator& c, std::span<T> data, int root) {
  return c.broadcast_async(data.data(), static_cast<std::int64_t>(data.size()), kDTypeOf<T>, root);
}

}  // namespace

Request Communicator::all_reduce_async(std::span<float> data, ReduceOp op) {
  return typed_all_reduce(*this, data, op);
}
Request Communicator::all_reduce_async(std::span<double> data, ReduceOp op) {
  return typed_all_reduce(*this, data, op);
}

Request Communicator::reduce_scatter_async(std::span<const float> input, std::span<float> output,
                                           std::span<const std::int64_t> counts, ReduceOp op) {
  return typed_reduce_scatter(*this, input, output, counts, op);
}
Request Communicator::reduce_scatter_async(std::span<const double> input, std::span<double> output,
                                           std::span<const std::int64_t> counts, ReduceOp op) {
  return typed_reduce_scatter(*this, input, output, counts, op);
}

Request Communicator::all_gather_async(std::span<float> data,
                                       std::span<const std::int64_t> counts) {
  return typed_all_gather(*this, data, counts);
}
Request Communicator::all_gather_async(std::span<double> data,
                                       std::span<const std::int64_t> counts) {
  return typed_all_gather(*this, data, counts);
}

Request Communicator::broadcast_async(std::span<float> data, int root) {
  return typed_broadcast(*this, data, root);
}
Request Communicator::broadcast_async(std::span<double> data, int root) {
  return typed_broadcast(*this, data, root);
}

std::unique_ptr<Communicator> Communicator::from_nccl(ncclComm* comm) {
#if ZEROSHARD_WITH_CUDA
  return detail::make_split_nccl_communicator(comm, 0, std::nullopt);
#else
  (void)comm;
  throw UsageError("Communicator::from_nccl: zeroshard was built without CUDA");
#endif
}

std::unique_ptr<Communicator> Communicator::from_nccl(ncclComm* parent, int color, int key) {
#if ZEROSHARD_WITH_CUDA
  return detail::make_split_nccl_communicator(parent, color, key);
#else
  (void)parent;
  (void)color;
  (void)key;
  throw UsageError("Communicator::from_nccl: zeroshard was built without CUDA");
#endif
}

std::unique_ptr<Communicator> Communicator::from_mpi_handle(int fortran_handle) {
  return detail::make_mpi_communicator(
      {.timeout = detail::collective_timeout_from_environment(),
       .reduce_scatter = detail::reduce_scatter_algorithm_from_environment()},
      fortran_handle);
}

std::vector<std::string> Communicator::all_gather_text(const std::string& text) {
  return detail::gather_text(text, rank(), size(),
                             [this](void* data, std::span<const std::int64_t> counts, DType dtype) {
                               all_gather_host(data, counts, dtype);
                             });
}

void Communicator::all_gather_host(void* data, std::span<const std::int64_t> counts, DType dtype) {
  all_gather(data, counts, dtype);
}

}  // namespace zeroshard

namespace zeroshard {

namespace detail {

GpuTransport gpu_transport_from_environment() {
  const char* value = std::getenv("ZEROSHARD_COMM_BACKEND");
  if (value == nullptr || *value == '\0') return GpuTransport::kAuto;
  const std::string name = ascii_lower(value);
  if (name == "nccl") return GpuTransport::kNccl;
  if (name == "mpi") return GpuTransport::kMpiStaging;
  throw UsageError("ZEROSHARD_COMM_BACKEND='" + std::string(value) +
                   "': expected nccl or mpi (MPI with host staging), or unset to let zeroshard "
                   "choose");
}

}  // namespace detail

std::unique_ptr<Communicator> Communicator::from_environment(const Device& device) {
  const detail::GpuTransport transport = detail::gpu_transport_from_environment();
  if (!device.is_cuda()) {
    ZEROSHARD_CHECK_USAGE(transport != detail::GpuTransport::kNccl,
                          "ZEROSHARD_COMM_BACKEND=nccl moves GPU buffers, but the device is "
                              << device.to_string()
                              << "; unset it or construct the engine on a CUDA device");
    return from_environment();
  }
#if ZEROSHARD_WITH_CUDA
  std::unique_ptr<Communicator> communicator =
      detail::make_gpu_communicator(device, transport, launched_by_mpi_launcher());
  detail::set_rank_for_messages(communicator->rank());
  return communicator;
#else
  throw UsageError("a communicator for " + device.to_string() + ": " + cuda_unavailable_reason());
#endif
}

}  // namespace zeroshard
