// The communicator for GPU buffers: NCCL where every rank has a GPU of its own, MPI with host
// staging where ranks share one (NCCL refuses two ranks on one device). Every rank must reach
// the same choice, so it is made from what all ranks report, not from each rank's own view.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <array>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "comm/cuda/cuda_staging.h"
#include "comm/cuda/gpu_communicator_factory.h"
#include "comm/cuda/nccl_communicator.h"
#include "comm/host_staged_communicator.h"
#include "comm/mpi_communicator.h"
#include "kernels/cuda/cuda_check.h"
#include "util/check.h"

namespace zeroshard::detail {
namespace {

std::string host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "unknown-host";
  return name.data();
}

/// Empty when every host has at least as many GPUs as ranks; otherwise names the first host
/// that does not ("<host>: 4 ranks, 1 GPU"). Collective over `world`.
std::string shared_gpu_host(Communicator& world) {
  int devices = 0;
  ZEROSHARD_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const std::vector<std::string> reports =
      world.all_gather_text(host_name() + "\n" + std::to_string(devices));
  std::map<std::string, std::pair<int, int>> ranks_and_gpus;
  for (const std::string& report : reports) {
    const std::size_t split = report.rfind('\n');
    auto& [ranks, gpus] = ranks_and_gpus[report.substr(0, split)];
    ranks += 1;
    gpus = std::stoi(report.substr(split + 1));
  }
  for (const auto& [host, counts] : ranks_and_gpus) {
    if (counts.first > counts.second) {
      std::ostringstream os;
      os << host << ": " << counts.first << " ranks, " << counts.second << " GPU"
         << (counts.second == 1 ? "" : "s");
      return os.str();
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<Communicator> make_gpu_communicator(const Device& device, GpuTransport transport,
                                                    bool launched_by_mpi) {
  if (!launched_by_mpi) {
    ZEROSHARD_CHECK_USAGE(transport != GpuTransport::kMpiStaging,
                          "ZEROSHARD_COMM_BACKEND=mpi needs an MPI launcher (mpirun or srun); "
                          "without one, ranks meet through NCCL (RANK, WORLD_SIZE, "
                          "ZEROSHARD_RDZV_FILE)");
    return cuda::make_nccl_communicator_from_environment(device.index);
  }
  std::unique_ptr<Communicator> mpi =
      make_mpi_communicator({.timeout = collective_timeout_from_environment(),
                             .reduce_scatter = reduce_scatter_algorithm_from_environment()});
  if (transport == GpuTransport::kMpiStaging) {
    return std::make_unique<HostStagedCommunicator>(std::move(mpi),
                                                    cuda::make_cuda_staging_copier(device.index));
  }
  const std::string shared = mpi->size() > 1 ? shared_gpu_host(*mpi) : std::string();
  if (!shared.empty()) {
    ZEROSHARD_CHECK_USAGE(transport == GpuTransport::kAuto,
                          "ZEROSHARD_COMM_BACKEND=nccl, but ranks share a GPU ("
                              << shared
                              << "), which NCCL refuses; start at most one rank per GPU or unset "
                                 "it to communicate through MPI with host staging");
    return std::make_unique<HostStagedCommunicator>(std::move(mpi),
                                                    cuda::make_cuda_staging_copier(device.index));
  }
  // The MPI communicator only carries NCCL's unique id; 2-byte elements move it bit for bit.
  static_assert(sizeof(ncclUniqueId) % 2 == 0);
  return cuda::make_nccl_communicator(
      device.index, mpi->rank(), mpi->size(), [&mpi](void* bytes, std::size_t count) {
        mpi->broadcast(bytes, static_cast<std::int64_t>(count / 2), DType::kFloat16, 0);
      });
}

std::unique_ptr<Communicator> make_split_nccl_communicator(ncclComm* parent, int color,
                                                           std::optional<int> key) {
  int rank = 0;
  if (!key) {
    ZEROSHARD_CHECK_USAGE(parent != nullptr, "Communicator::from_nccl: got a null ncclComm_t");
    ZEROSHARD_NCCL_CHECK(ncclCommUserRank(parent, &rank));
  }
  return cuda::split_nccl_communicator(parent, color, key.value_or(rank));
}

}  // namespace zeroshard::detail
