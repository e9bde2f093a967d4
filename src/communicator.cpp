// The transport-independent half of the communicator: requests, traffic counters, collective
// names, and the choice of backend from the launcher's environment.
#include "zeroshard/communicator.h"

#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

#include "check.h"
#include "config_values.h"
#include "gpu_communicator_factory.h"
#include "log.h"
#include "mpi_communicator.h"
#include "self_communicator.h"
#include "text_gather.h"

namespace zeroshard {
namespace {

// The implicit wait of a destructor or a move assignment: it cannot throw, so errors go to
// the log. A request that already failed is not waited on again (the Impl's destructor abandons
// it), so an error never becomes a hang.
void finish_quietly(std::unique_ptr<Request::Impl> impl, bool failed) noexcept {
  if (!impl || failed) return;
  try {
    impl->wait();
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

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish_quietly(std::move(impl_), failed_);
    impl_ = std::move(other.impl_);
    failed_ = std::exchange(other.failed_, false);
  }
  return *this;
}

Request::~Request() { finish_quietly(std::move(impl_), failed_); }

void Request::wait() {
  if (!impl_) return;
  try {
    impl_->wait();
  } catch (...) {
    failed_ = true;
    throw;
  }
  impl_.reset();
  failed_ = false;
}

bool Request::test() {
  if (!impl_) return true;
  bool done = false;
  try {
    done = impl_->test();
  } catch (...) {
    failed_ = true;
    throw;
  }
  if (done) {
    impl_.reset();
    failed_ = false;
  }
  return done;
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
    communicator =
        detail::make_mpi_communicator({.timeout = detail::collective_timeout_from_environment()});
  } else {
    communicator = detail::make_self_communicator();
  }
  detail::set_rank_for_messages(communicator->rank());
  return communicator;
}

std::vector<std::string> Communicator::all_gather_text(const std::string& text) {
  return detail::gather_text(text, rank(), size(),
                             [this](void* data, std::span<const std::int64_t> counts, DType dtype) {
                               all_gather(data, counts, dtype);
                             });
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
