// Each staged collective moves through three phases: the copy of its input to a host buffer, the
// host collective, and the copy of its result back. The phases advance whenever any request is
// tested or waited for, so that the copies and the transfers of several buckets overlap with each
// other and with the model's compute.
#include "comm/host_staged_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "comm/collective_checks.h"
#include "comm/rank_counts.h"
#include "util/check.h"

namespace zeroshard::detail {
namespace {

enum class Phase { kCopyIn, kTransfer, kCopyOut, kDone };

/// Where a result goes: `bytes` bytes from `host_offset` in the staging buffer to `device`.
struct CopyOut {
  void* device = nullptr;
  std::size_t host_offset = 0;
  std::size_t bytes = 0;
};

struct StagedOp {
  std::unique_ptr<StagingBuffer> buffer;
  std::unique_ptr<StagingCopy> copy;  // the copy in or out in flight; null when there is none
  std::function<Request(char* host)> start;
  Request transfer;
  CopyOut out;
  Phase phase = Phase::kCopyIn;

  char* host() const { return static_cast<char*>(buffer->data()); }
};

std::size_t bytes_of(std::int64_t count, DType dtype) {
  return static_cast<std::size_t>(count) * size_of(dtype);
}

}  // namespace

struct HostStagedCommunicator::Core {
  std::unique_ptr<Communicator> host;
  std::unique_ptr<StagingCopier> copier;
  std::vector<std::unique_ptr<StagingBuffer>> free_buffers;
  std::size_t pool_bytes = 0;
  MemoryTracker* tracker = nullptr;
  // Issued but not yet handed to the host communicator, in call order.
  std::deque<std::shared_ptr<StagedOp>> unstarted;

  /// The smallest free buffer that holds `bytes`, or a new one.
  std::unique_ptr<StagingBuffer> take(std::size_t bytes) {
    auto best = free_buffers.end();
    for (auto it = free_buffers.begin(); it != free_buffers.end(); ++it) {
      if ((*it)->bytes() >= bytes &&
          (best == free_buffers.end() || (*it)->bytes() < (*best)->bytes())) {
        best = it;
      }
    }
    if (best != free_buffers.end()) {
      std::unique_ptr<StagingBuffer> buffer = std::move(*best);
      free_buffers.erase(best);
      return buffer;
    }
    std::unique_ptr<StagingBuffer> buffer = copier->allocate(bytes);
    pool_bytes += buffer->bytes();
    charge(static_cast<std::int64_t>(buffer->bytes()));
    return buffer;
  }

  void charge(std::int64_t bytes) {
    if (tracker != nullptr)
      tracker->add(MemoryLocation::kHost, MemoryCategory::kCommunication, bytes);
  }

  // The last pending request has gone (each holds the core), so the pool's bytes, a buffer a
  // failed request leaked included, leave the report together.
  ~Core() {
    if (tracker != nullptr) {
      tracker->remove(MemoryLocation::kHost, MemoryCategory::kCommunication,
                      static_cast<std::int64_t>(pool_bytes));
    }
  }

  /// Starts the host collectives whose copies in have finished, in call order, stopping at the
  /// first that is not ready; with `must_start`, waits for copies until that one has started.
  void start_in_order(const StagedOp* must_start) {
    while (!unstarted.empty()) {
      StagedOp& op = *unstarted.front();
      const bool must = must_start != nullptr && must_start->phase == Phase::kCopyIn;
      if (op.copy && !op.copy->done()) {
        if (!must) return;
        op.copy->wait();
      }
      op.copy.reset();
      op.transfer = op.start(op.host());
      op.phase = Phase::kTransfer;
      unstarted.pop_front();
    }
  }

  void begin_copy_out(StagedOp& op) {
    if (op.out.bytes == 0) return finish(op);
    op.copy = copier->to_device(op.out.device, op.host() + op.out.host_offset, op.out.bytes);
    op.phase = Phase::kCopyOut;
  }

  void finish(StagedOp& op) {
    op.copy.reset();
    free_buffers.push_back(std::move(op.buffer));
    op.phase = Phase::kDone;
  }
};

namespace {

class StagedRequest final : public Request::Impl {
 public:
  StagedRequest(std::shared_ptr<HostStagedCommunicator::Core> core, std::shared_ptr<StagedOp> op)
      : core_(std::move(core)), op_(std::move(op)) {}
  StagedRequest(const StagedRequest&) = delete;
  StagedRequest& operator=(const StagedRequest&) = delete;

  ~StagedRequest() override {
    // Only a request that failed is dropped unfinished (Request waits for the others): the host
    // transport may still write into its buffer, so the buffer is leaked rather than freed.
    if (op_->phase == Phase::kTransfer) static_cast<void>(op_->buffer.release());
  }

  void wait() override {
    core_->start_in_order(op_.get());
    if (op_->phase == Phase::kTransfer) {
      op_->transfer.wait();
      core_->begin_copy_out(*op_);
    }
    if (op_->phase == Phase::kCopyOut) {
      op_->copy->wait();
      core_->finish(*op_);
    }
  }

  bool test() override {
    core_->start_in_order(nullptr);
    if (op_->phase == Phase::kTransfer && op_->transfer.test()) core_->begin_copy_out(*op_);
    if (op_->phase == Phase::kCopyOut && op_->copy->done()) core_->finish(*op_);
    return op_->phase == Phase::kDone;
  }

 private:
  std::shared_ptr<HostStagedCommunicator::Core> core_;
  std::shared_ptr<StagedOp> op_;
};

/// Queues one staged collective: a staging buffer of `staging_bytes`, the copy of `in_bytes` from
/// `in_device` to `in_offset` in it (none when in_bytes is 0), then `start`, then `out`.
Request stage(const std::shared_ptr<HostStagedCommunicator::Core>& core, std::size_t staging_bytes,
              const void* in_device, std::size_t in_offset, std::size_t in_bytes,
              std::function<Request(char* host)> start, CopyOut out) {
  auto op = std::make_shared<StagedOp>();
  op->buffer = core->take(std::max<std::size_t>(staging_bytes, 1));
  core->copier->follow_compute();
  if (in_bytes > 0) op->copy = core->copier->to_host(op->host() + in_offset, in_device, in_bytes);
  op->start = std::move(start);
  op->out = out;
  core->unstarted.push_back(op);
  core->start_in_order(nullptr);
  return Request(std::make_unique<StagedRequest>(core, std::move(op)));
}

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> host_communicator,
                                               std::unique_ptr<StagingCopier> copier)
    : core_(std::make_shared<Core>()) {
  ZEROSHARD_CHECK_USAGE(host_communicator != nullptr && copier != nullptr,
                        "HostStagedCommunicator needs a host communicator and a copier");
  ZEROSHARD_CHECK_USAGE(host_communicator->buffer_device() == DeviceType::kCpu,
                        "HostStagedCommunicator stages through host memory, but the '"
                            << host_communicator->backend()
                            << "' communicator given to it takes device buffers");
  // The host communicator numbers and records the same collectives, and its timeouts carry what
  // its side channel knows of the peers; numbering them twice would only duplicate the dumps.
  forward_tracking_to_inner();
  rank_ = host_communicator->rank();
  size_ = host_communicator->size();
  core_->host = std::move(host_communicator);
  core_->copier = std::move(copier);
}

HostStagedCommunicator::~HostStagedCommunicator() = default;

std::string HostStagedCommunicator::backend() const { return core_->host->backend() + "+staging"; }

void HostStagedCommunicator::set_timing(const TimingOptions& options) {
  core_->host->set_timing(options);
}

std::vector<CollectiveTiming> HostStagedCommunicator::timings() const {
  return core_->host->timings();
}

void HostStagedCommunicator::all_gather_host(void* data, std::span<const std::int64_t> counts,
                                             DType dtype) {
  core_->host->all_gather(data, counts, dtype);
}

void HostStagedCommunicator::set_compute_stream(void* stream) noexcept {
  core_->copier->set_compute_stream(stream);
}

std::size_t HostStagedCommunicator::staging_bytes() const noexcept { return core_->pool_bytes; }

void HostStagedCommunicator::charge_staging_to(MemoryTracker& tracker) {
  ZEROSHARD_CHECK_USAGE(core_->tracker == nullptr,
                        "the staging memory of this communicator is already charged to an engine; "
                        "give each engine a communicator of its own");
  core_->tracker = &tracker;
  core_->charge(static_cast<std::int64_t>(core_->pool_bytes));
}

Request HostStagedCommunicator::start_all_reduce(void* data, std::int64_t count, DType dtype,
                                                 ReduceOp op) {
  count_traffic(Collective::kAllReduce, 2 * count, dtype);
  const std::size_t bytes = bytes_of(count, dtype);
  Communicator& host = *core_->host;
  return stage(core_, bytes, data, 0, bytes,
               [&host, count, dtype, op](char* staged) {
                 return host.all_reduce_async(staged, count, dtype, op);
               },
               {data, 0, bytes});
}

Request HostStagedCommunicator::start_reduce_scatter(const void* input, void* output,
                                                     std::span<const std::int64_t> counts,
                                                     DType dtype, ReduceOp op) {
  ZEROSHARD_CHECK_USAGE(static_cast<int>(counts.size()) == size_,
                        "reduce-scatter: " << counts.size() << " counts for " << size_ << " ranks");
  const std::int64_t total = total_of(counts);
  count_traffic(Collective::kReduceScatter, total, dtype);
  const std::size_t in_bytes = bytes_of(total, dtype);
  const std::size_t own_offset = bytes_of(offset_of(counts, rank_), dtype);
  const std::size_t out_bytes = bytes_of(counts[static_cast<std::size_t>(rank_)], dtype);
  Communicator& host = *core_->host;
  // The host reduce-scatter runs in place in the staged input, so that the staging buffer holds
  // no receive area; the device output, in place or not, is only written by the copy back.
  return stage(core_, in_bytes, input, 0, in_bytes,
               [&host, own_offset, counts = std::vector<std::int64_t>(counts.begin(), counts.end()),
                dtype, op](char* staged) {
                 return host.reduce_scatter_async(staged, staged + own_offset, counts, dtype, op);
               },
               {output, own_offset, out_bytes});
}

Request HostStagedCommunicator::start_all_gather(void* data, std::span<const std::int64_t> counts,
                                                 DType dtype) {
  ZEROSHARD_CHECK_USAGE(static_cast<int>(counts.size()) == size_,
                        "all-gather: " << counts.size() << " counts for " << size_ << " ranks");
  const std::int64_t total = total_of(counts);
  count_traffic(Collective::kAllGather, total, dtype);
  const std::size_t own_offset = bytes_of(offset_of(counts, rank_), dtype);
  const std::size_t own_bytes = bytes_of(counts[static_cast<std::size_t>(rank_)], dtype);
  const std::size_t bytes = bytes_of(total, dtype);
  Communicator& host = *core_->host;
  return stage(core_, bytes, static_cast<const char*>(data) + own_offset, own_offset, own_bytes,
               [&host, counts = std::vector<std::int64_t>(counts.begin(), counts.end()),
                dtype](char* staged) { return host.all_gather_async(staged, counts, dtype); },
               {data, 0, bytes});
}

Request HostStagedCommunicator::start_broadcast(void* data, std::int64_t count, DType dtype,
                                                int root) {
  count_traffic(Collective::kBroadcast, count, dtype);
  const std::size_t bytes = bytes_of(count, dtype);
  const bool is_root = root == rank_;
  Communicator& host = *core_->host;
  return stage(core_, bytes, data, 0, is_root ? bytes : 0,
               [&host, count, dtype, root](char* staged) {
                 return host.broadcast_async(staged, count, dtype, root);
               },
               {data, 0, is_root ? 0 : bytes});
}

Request HostStagedCommunicator::start_all_to_all(const void* input,
                                                 std::span<const std::int64_t> send_counts,
                                                 void* output,
                                                 std::span<const std::int64_t> recv_counts,
                                                 DType dtype) {
  const std::int64_t to_others =
      check_all_to_all(input, send_counts, output, recv_counts, dtype, rank_, size_);
  count_traffic(Collective::kAllToAll, to_others, dtype);
  const std::size_t in_bytes = bytes_of(total_of(send_counts), dtype);
  const std::size_t out_bytes = bytes_of(total_of(recv_counts), dtype);
  Communicator& host = *core_->host;
  // One staging buffer: what is sent, then what is received.
  return stage(
      core_, in_bytes + out_bytes, input, 0, in_bytes,
      [&host, in_bytes, dtype,
       sends = std::vector<std::int64_t>(send_counts.begin(), send_counts.end()),
       receives = std::vector<std::int64_t>(recv_counts.begin(), recv_counts.end())](char* staged) {
        return host.all_to_all_async(staged, sends, staged + in_bytes, receives, dtype);
      },
      {output, in_bytes, out_bytes});
}

std::unique_ptr<Communicator> HostStagedCommunicator::make_split(int color, int key) {
  return std::make_unique<HostStagedCommunicator>(core_->host->split(color, key),
                                                  core_->copier->another());
}

void HostStagedCommunicator::run_barrier() {
  count_traffic(Collective::kBarrier, 0, DType::kFloat32);
  // Every rank must reach the host transport's collectives in the same order, the barrier's too.
  if (!core_->unstarted.empty()) core_->start_in_order(core_->unstarted.back().get());
  core_->host->barrier();
}

void HostStagedCommunicator::end_job(int error_code) noexcept {
  core_->host->abort(error_code);
  // The host communicator's abort ends the process; the compiler cannot see that through the
  // virtual call.
  std::_Exit(error_code);
}

}  // namespace zeroshard::detail
