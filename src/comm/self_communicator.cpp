// The world of one: every collective is a local copy or a no-op, but is still checked and counted
// under the same traffic convention as the MPI backend, so a single-rank run reports the same
// numbers as `mpirun -np 1`.
#include "comm/self_communicator.h"

#include <cstring>
#include <memory>

#include "comm/collective_checks.h"
#include "util/check.h"

namespace zeroshard::detail {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string backend() const override { return "self"; }

  Request start_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp) override {
    check_buffer(Collective::kAllReduce, data, count);
    count_traffic(Collective::kAllReduce, 2 * count, dtype);
    return Request{};
  }

  Request start_reduce_scatter(const void* input, void* output,
                               std::span<const std::int64_t> counts, DType dtype,
                               ReduceOp) override {
    const std::int64_t total = checked_total(Collective::kReduceScatter, counts, size());
    check_buffer(Collective::kReduceScatter, input, total);
    check_buffer(Collective::kReduceScatter, output, total);
    const auto bytes = total * static_cast<std::int64_t>(size_of(dtype));
    const bool in_place = check_in_place(input, bytes, 0, output, bytes);
    if (total > 0 && !in_place) std::memcpy(output, input, static_cast<std::size_t>(bytes));
    count_traffic(Collective::kReduceScatter, total, dtype);
    return Request{};
  }

  Request start_all_gather(void* data, std::span<const std::int64_t> counts, DType dtype) override {
    const std::int64_t total = checked_total(Collective::kAllGather, counts, size());
    check_buffer(Collective::kAllGather, data, total);
    count_traffic(Collective::kAllGather, total, dtype);
    return Request{};
  }

  Request start_broadcast(void* data, std::int64_t count, DType dtype, int root) override {
    check_buffer(Collective::kBroadcast, data, count);
    check_root(root, size());
    count_traffic(Collective::kBroadcast, count, dtype);
    return Request{};
  }

  Request start_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                           void* output, std::span<const std::int64_t> recv_counts,
                           DType dtype) override {
    check_all_to_all(input, send_counts, output, recv_counts, dtype, 0, size());
    ZEROSHARD_CHECK_USAGE(send_counts[0] == recv_counts[0],
                          "all-to-all: rank 0 sends " << send_counts[0] << " elements to itself "
                                                      << "but expects " << recv_counts[0]);
    if (send_counts[0] > 0) {
      std::memcpy(output, input, static_cast<std::size_t>(send_counts[0]) * size_of(dtype));
    }
    count_traffic(Collective::kAllToAll, 0, dtype);
    return Request{};
  }

  std::unique_ptr<Communicator> make_split(int, int) override {
    return std::make_unique<SelfCommunicator>();
  }

  void run_barrier() override { count_traffic(Collective::kBarrier, 0, DType::kFloat32); }
  [[noreturn]] void end_job(int error_code) noexcept override { std::_Exit(error_code); }
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() {
  return std::make_unique<SelfCommunicator>();
}

}  // namespace zeroshard::detail
