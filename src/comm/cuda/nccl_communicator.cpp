// Collectives, completion polling, abort on timeout, and bootstrap of the NCCL communicator.
#include "comm/cuda/nccl_communicator.h"

#include <nccl.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/device_buffer.h"
#include "comm/collective_checks.h"
#include "comm/cuda/rendezvous_file.h"
#include "comm/mpi_communicator.h"
#include "comm/wait_deadline.h"
#include "kernels/cuda/cuda_check.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::cuda {

/// What the communicator and its pending requests share; the NCCL communicator lives as long as
/// the last of them.
struct NcclCommunicator::State {
  State(int rank, int world, int device, std::chrono::duration<double> timeout)
      : rank(rank), world(world), device(device), timeout(timeout), barrier_word(4) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State();

  /// "NCCL all-gather on rank 2 of 4 (device 1)".
  std::string describe(const char* what) const;
  /// Throws CommError when an earlier failure aborted the communicator.
  void require_usable(const char* what) const;
  /// ncclSuccess or ncclInProgress; on an asynchronous error aborts and throws CommError.
  ncclResult_t async_state(const char* what);
  /// Polls `done` until it returns true; aborts and throws TimeoutError after `timeout`.
  template <class Done>
  void await(const char* what, Done done);
  /// Waits until NCCL has queued (or, for init, completed) the operations just issued: on a
  /// non-blocking communicator they may still be in progress when the call returns.
  void await_ready(const char* what) {
    await(what, [&] { return async_state(what) == ncclSuccess; });
  }
  void abort(std::string reason) noexcept;

  const int rank;
  const int world;
  const int device;
  const std::chrono::duration<double> timeout;
  CudaStream stream;
  CudaEvent compute_done;
  DeviceBuffer barrier_word;
  ncclComm_t comm = nullptr;
  std::string abort_reason;  ///< non-empty once aborted
};

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat64:
      return ncclFloat64;
  }
  throw UsageError("unknown DType " + std::to_string(static_cast<int>(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

char* element_at(void* data, std::int64_t index, DType dtype) {
  return static_cast<char*>(data) + index * static_cast<std::int64_t>(size_of(dtype));
}

const char* element_at(const void* data, std::int64_t index, DType dtype) {
  return static_cast<const char*>(data) + index * static_cast<std::int64_t>(size_of(dtype));
}

/// The offset of each rank's slice; validates the counts against the world size.
std::vector<std::int64_t> slice_offsets(std::span<const std::int64_t> counts, int world,
                                        const char* what) {
  ZEROSHARD_CHECK_USAGE(counts.size() == static_cast<std::size_t>(world),
                        what << ": got " << counts.size() << " counts for " << world << " ranks");
  std::vector<std::int64_t> offsets(counts.size());
  std::int64_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    ZEROSHARD_CHECK_USAGE(counts[r] >= 0,
                          what << ": negative count " << counts[r] << " for rank " << r);
    offsets[r] = offset;
    offset += counts[r];
  }
  return offsets;
}

bool all_equal(std::span<const std::int64_t> counts) {
  for (std::int64_t count : counts) {
    if (count != counts.front()) return false;
  }
  return true;
}

/// An NCCL group that is closed even when an exception leaves the scope early, so a failed
/// collective does not leave this thread's later NCCL calls inside an unterminated group.
class NcclGroup {
 public:
  NcclGroup() { ZEROSHARD_NCCL_CHECK(ncclGroupStart()); }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  void end() {
    open_ = false;
    ZEROSHARD_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

class NcclRequest final : public Request::Impl {
 public:
  NcclRequest(std::shared_ptr<NcclCommunicator::State> state, Collective collective, CudaEvent done)
      : state_(std::move(state)), collective_(collective), done_(std::move(done)) {}

  void wait() override {
    state_->await(to_string(collective_), [this] { return test(); });
  }

  bool test() override {
    // An aborted communicator may have cut the collective short while its event still
    // completes, so abort is checked first: a wrong result must never look like success.
    state_->require_usable(to_string(collective_));
    if (done_.query()) return true;
    state_->async_state(to_string(collective_));
    return false;
  }

 private:
  std::shared_ptr<NcclCommunicator::State> state_;
  Collective collective_;
  CudaEvent done_;
};

int int_from_environment(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr) return fallback;
  int parsed = -1;
  const char* end = value + std::strlen(value);
  const auto [parsed_to, error] = std::from_chars(value, end, parsed);
  ZEROSHARD_CHECK_USAGE(error == std::errc() && parsed_to == end && parsed_to != value,
                        "environment variable " << name << "='" << value << "' is not an integer");
  return parsed;
}

}  // namespace

NcclCommunicator::State::~State() {
  if (comm == nullptr) return;
  // Finalize flushes the queued collectives. On this non-blocking communicator it returns at
  // once and is polled, so a peer that died cannot hang the destructor past the timeout.
  ncclResult_t result = ncclCommFinalize(comm);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  while (result == ncclInProgress || result == ncclSuccess) {
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess || result != ncclInProgress) break;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (result == ncclSuccess) {
    result = ncclCommDestroy(comm);
  } else {
    ZEROSHARD_LOG(kWarning, describe("finalize") << " did not finish ("
                                                 << ncclGetErrorString(result) << "); aborting it");
    result = ncclCommAbort(comm);
  }
  if (result != ncclSuccess) {
    ZEROSHARD_LOG(kError, "releasing the NCCL communicator of rank "
                              << rank << " failed: " << ncclGetErrorString(result));
  }
}

std::string NcclCommunicator::State::describe(const char* what) const {
  std::ostringstream os;
  os << "NCCL " << what << " on rank " << rank << " of " << world << " (device " << device << ")";
  return os.str();
}

void NcclCommunicator::State::require_usable(const char* what) const {
  if (abort_reason.empty()) return;
  throw CommError(ErrorCode::kNccl, describe(what) +
                                        " refused: the communicator was aborted "
                                        "earlier, after: " +
                                        abort_reason);
}

ncclResult_t NcclCommunicator::State::async_state(const char* what) {
  require_usable(what);
  ncclResult_t state = ncclSuccess;
  ZEROSHARD_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
  if (state == ncclSuccess || state == ncclInProgress) return state;
  std::ostringstream os;
  os << describe(what) << " failed: " << ncclGetErrorString(state) << " (" << ncclGetLastError(comm)
     << "); the communicator was aborted [" << detail::where(__FILE__, __LINE__) << "]";
  abort(os.str());
  throw CommError(ErrorCode::kNccl, os.str());
}

template <class Done>
void NcclCommunicator::State::await(const char* what, Done done) {
  detail::WaitDeadline deadline(timeout);
  for (int polls = 0;; ++polls) {
    if (done()) return;
    if (deadline.expired()) {
      std::ostringstream os;
      os << describe(what) << " did not complete within " << timeout.count()
         << " s (ZEROSHARD_COLLECTIVE_TIMEOUT_S): a rank may have died, hung or issued a "
            "different collective; the communicator was aborted ["
         << detail::where(__FILE__, __LINE__) << "]";
      if (deadline.not_running_s() > 0) {
        os << "; this rank itself did not run for " << deadline.not_running_s()
           << " s of the wait (stopped or descheduled), which was not counted";
      }
      abort(os.str());
      throw TimeoutError(os.str());
    }
    // Spin briefly, which keeps short collectives fast, then sleep so that a long wait does not
    // take a core from the rest of the program.
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclCommunicator::State::abort(std::string reason) noexcept {
  if (comm != nullptr) {
    if (const ncclResult_t result = ncclCommAbort(comm); result != ncclSuccess) {
      ZEROSHARD_LOG(kError,
                    "ncclCommAbort on rank " << rank << " failed: " << ncclGetErrorString(result));
    }
    comm = nullptr;
  }
  abort_reason = std::move(reason);
}

NcclCommunicator::NcclCommunicator(int rank, int world, int device, const void* unique_id) {
  ZEROSHARD_CHECK_USAGE(world >= 1 && rank >= 0 && rank < world,
                        "NCCL communicator: rank " << rank << " is not in a world of " << world);
  DeviceGuard guard(device);
  state_ =
      std::make_shared<State>(rank, world, device, detail::collective_timeout_from_environment());
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: initialisation and every later call return at once and are polled against the
  // timeout, so a rank that never joins turns into a TimeoutError rather than a hang.
  config.blocking = 0;
  const ncclResult_t result = ncclCommInitRankConfig(&state_->comm, world, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    state_->abort("ncclCommInitRankConfig failed");
    throw_nccl_error(static_cast<int>(result), ncclGetErrorString(result), "ncclCommInitRankConfig",
                     __FILE__, __LINE__);
  }
  state_->await_ready("communicator initialisation");
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, int device) {
  int rank = 0;
  int world = 0;
  ZEROSHARD_NCCL_CHECK(ncclCommUserRank(comm, &rank));
  ZEROSHARD_NCCL_CHECK(ncclCommCount(comm, &world));
  DeviceGuard guard(device);
  state_ =
      std::make_shared<State>(rank, world, device, detail::collective_timeout_from_environment());
  state_->comm = comm;
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const noexcept { return state_->rank; }
int NcclCommunicator::size() const noexcept { return state_->world; }
cudaStream_t NcclCommunicator::stream() const noexcept { return state_->stream.get(); }
int NcclCommunicator::device() const noexcept { return state_->device; }

void NcclCommunicator::all_gather_host(void* data, std::span<const std::int64_t> counts,
                                       DType dtype) {
  std::int64_t total = 0;
  for (std::int64_t count : counts) total += count;
  const std::size_t bytes = static_cast<std::size_t>(total) * size_of(dtype);
  const DeviceGuard guard(state_->device);
  const DeviceBuffer buffer(bytes, "all_gather_text's device copy");
  if (bytes > 0)
    ZEROSHARD_CUDA_CHECK(cudaMemcpy(buffer.data(), data, bytes, cudaMemcpyHostToDevice));
  all_gather(buffer.data(), counts, dtype);
  if (bytes > 0)
    ZEROSHARD_CUDA_CHECK(cudaMemcpy(data, buffer.data(), bytes, cudaMemcpyDeviceToHost));
}

void NcclCommunicator::order_after_compute() {
  // The collective reads buffers the compute stream may still be writing (gradients, updated
  // parameters): the communication stream waits for that work on the device, the host does not.
  state_->compute_done.record(compute_stream_);
  state_->compute_done.make_wait(state_->stream.get());
}

Request NcclCommunicator::finish(Collective collective) {
  state_->await_ready(to_string(collective));
  CudaEvent done;
  done.record(state_->stream.get());
  return Request(std::make_unique<NcclRequest>(state_, collective, std::move(done)));
}

Request NcclCommunicator::start_all_reduce(void* data, std::int64_t count, DType dtype,
                                           ReduceOp op) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "all_reduce: negative count " << count);
  DeviceGuard guard(state_->device);
  state_->require_usable("all-reduce");
  order_after_compute();
  if (count > 0) {
    ZEROSHARD_NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(count),
                                       nccl_type(dtype), nccl_op(op), state_->comm,
                                       state_->stream.get()));
  }
  count_traffic(Collective::kAllReduce, 2 * count, dtype);
  return finish(Collective::kAllReduce);
}

Request NcclCommunicator::start_reduce_scatter(const void* input, void* output,
                                               std::span<const std::int64_t> counts, DType dtype,
                                               ReduceOp op) {
  const std::vector<std::int64_t> offsets = slice_offsets(counts, state_->world, "reduce_scatter");
  DeviceGuard guard(state_->device);
  state_->require_usable("reduce-scatter");
  order_after_compute();
  const std::int64_t total = offsets.back() + counts.back();
  if (all_equal(counts)) {
    if (counts.front() > 0) {
      ZEROSHARD_NCCL_CHECK(
          ncclReduceScatter(input, output, static_cast<std::size_t>(counts.front()),
                            nccl_type(dtype), nccl_op(op), state_->comm, state_->stream.get()));
    }
  } else {
    // Uneven slices: one reduce per slice onto the rank that owns it, grouped so that NCCL runs
    // them together; no padded copy of the input is needed.
    NcclGroup group;
    for (int root = 0; root < state_->world; ++root) {
      if (counts[root] == 0) continue;
      ZEROSHARD_NCCL_CHECK(ncclReduce(element_at(input, offsets[root], dtype),
                                      root == state_->rank ? output : nullptr,
                                      static_cast<std::size_t>(counts[root]), nccl_type(dtype),
                                      nccl_op(op), root, state_->comm, state_->stream.get()));
    }
    group.end();
  }
  count_traffic(Collective::kReduceScatter, total, dtype);
  return finish(Collective::kReduceScatter);
}

Request NcclCommunicator::start_all_gather(void* data, std::span<const std::int64_t> counts,
                                           DType dtype) {
  const std::vector<std::int64_t> offsets = slice_offsets(counts, state_->world, "all_gather");
  DeviceGuard guard(state_->device);
  state_->require_usable("all-gather");
  order_after_compute();
  const std::int64_t total = offsets.back() + counts.back();
  if (all_equal(counts)) {
    if (counts.front() > 0) {
      // In place: NCCL requires the send buffer to be this rank's slice of the receive buffer.
      ZEROSHARD_NCCL_CHECK(ncclAllGather(element_at(data, offsets[state_->rank], dtype), data,
                                         static_cast<std::size_t>(counts.front()), nccl_type(dtype),
                                         state_->comm, state_->stream.get()));
    }
  } else {
    // Uneven slices: each rank broadcasts its slice in place, grouped so that NCCL runs the
    // broadcasts together.
    NcclGroup group;
    for (int root = 0; root < state_->world; ++root) {
      if (counts[root] == 0) continue;
      char* slice = element_at(data, offsets[root], dtype);
      ZEROSHARD_NCCL_CHECK(ncclBroadcast(slice, slice, static_cast<std::size_t>(counts[root]),
                                         nccl_type(dtype), root, state_->comm,
                                         state_->stream.get()));
    }
    group.end();
  }
  count_traffic(Collective::kAllGather, total, dtype);
  return finish(Collective::kAllGather);
}

Request NcclCommunicator::start_broadcast(void* data, std::int64_t count, DType dtype, int root) {
  ZEROSHARD_CHECK_USAGE(count >= 0, "broadcast: negative count " << count);
  ZEROSHARD_CHECK_USAGE(root >= 0 && root < state_->world,
                        "broadcast: root " << root << " is not in a world of " << state_->world);
  DeviceGuard guard(state_->device);
  state_->require_usable("broadcast");
  order_after_compute();
  if (count > 0) {
    ZEROSHARD_NCCL_CHECK(ncclBroadcast(data, data, static_cast<std::size_t>(count),
                                       nccl_type(dtype), root, state_->comm, state_->stream.get()));
  }
  count_traffic(Collective::kBroadcast, count, dtype);
  return finish(Collective::kBroadcast);
}

Request NcclCommunicator::start_all_to_all(const void* input,
                                           std::span<const std::int64_t> send_counts, void* output,
                                           std::span<const std::int64_t> recv_counts, DType dtype) {
  const std::int64_t to_others = detail::check_all_to_all(input, send_counts, output, recv_counts,
                                                          dtype, state_->rank, state_->world);
  const std::vector<std::int64_t> send_offsets =
      slice_offsets(send_counts, state_->world, "all_to_all");
  const std::vector<std::int64_t> recv_offsets =
      slice_offsets(recv_counts, state_->world, "all_to_all");
  DeviceGuard guard(state_->device);
  state_->require_usable("all-to-all");
  order_after_compute();
  // NCCL has no all-to-all with counts: one send and one receive per peer, grouped so that NCCL
  // runs them together.
  NcclGroup group;
  for (int peer = 0; peer < state_->world; ++peer) {
    if (send_counts[peer] > 0) {
      ZEROSHARD_NCCL_CHECK(ncclSend(element_at(input, send_offsets[peer], dtype),
                                    static_cast<std::size_t>(send_counts[peer]), nccl_type(dtype),
                                    peer, state_->comm, state_->stream.get()));
    }
    if (recv_counts[peer] > 0) {
      ZEROSHARD_NCCL_CHECK(ncclRecv(element_at(output, recv_offsets[peer], dtype),
                                    static_cast<std::size_t>(recv_counts[peer]), nccl_type(dtype),
                                    peer, state_->comm, state_->stream.get()));
    }
  }
  group.end();
  count_traffic(Collective::kAllToAll, to_others, dtype);
  return finish(Collective::kAllToAll);
}

std::unique_ptr<Communicator> NcclCommunicator::make_split(int color, int key) {
  DeviceGuard guard(state_->device);
  state_->require_usable("split");
  return split_nccl_communicator(state_->comm, color, key);
}

void NcclCommunicator::end_job(int error_code) noexcept {
  state_->abort("aborted by the program");
  std::_Exit(error_code);
}

void NcclCommunicator::run_barrier() {
  DeviceGuard guard(state_->device);
  state_->require_usable("barrier");
  // NCCL has no barrier: an all-reduce of one word completes only once every rank has issued it.
  ZEROSHARD_NCCL_CHECK(ncclAllReduce(state_->barrier_word.data(), state_->barrier_word.data(), 1,
                                     ncclFloat32, ncclSum, state_->comm, state_->stream.get()));
  count_traffic(Collective::kBarrier, 0, DType::kFloat32);
  finish(Collective::kBarrier).wait();
}

std::vector<std::byte> new_nccl_unique_id() {
  ncclUniqueId id;
  ZEROSHARD_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<std::byte> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  return bytes;
}

int nccl_version() {
  int version = 0;
  ZEROSHARD_NCCL_CHECK(ncclGetVersion(&version));
  return version;
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(
    int device, int rank, int world, const BroadcastFromRank0& broadcast_from_rank0) {
  ZEROSHARD_CHECK_USAGE(world >= 1 && rank >= 0 && rank < world,
                        "NCCL communicator: rank " << rank << " is not in a world of " << world);
  detail::set_rank_for_messages(rank);
  std::vector<std::byte> id(sizeof(ncclUniqueId));
  if (rank == 0) id = new_nccl_unique_id();
  broadcast_from_rank0(id.data(), id.size());
  return std::make_unique<NcclCommunicator>(rank, world, device, id.data());
}

std::unique_ptr<NcclCommunicator> split_nccl_communicator(ncclComm* parent, int color, int key) {
  ZEROSHARD_CHECK_USAGE(parent != nullptr, "Communicator::from_nccl: got a null ncclComm_t");
  ZEROSHARD_CHECK_USAGE(color >= 0, "Communicator::from_nccl: got color "
                                        << color << ", expected >= 0 (every rank joins a group)");
  int device = 0;
  ZEROSHARD_CUDA_CHECK(cudaGetDevice(&device));
  // Blocking, unlike the communicators zeroshard creates itself: the split is a collective of the
  // program's communicator, whose ranks are all running when it is called.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  ZEROSHARD_NCCL_CHECK(ncclCommSplit(parent, color, key, &comm, &config));
  return std::make_unique<NcclCommunicator>(comm, device);
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator_from_environment(int device) {
  const bool launched = std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr;
  ZEROSHARD_CHECK_USAGE(!launched || (std::getenv("RANK") && std::getenv("WORLD_SIZE")),
                        "set both RANK and WORLD_SIZE, or neither for a world of one");
  const int rank = int_from_environment("RANK", 0);
  const int world = int_from_environment("WORLD_SIZE", 1);
  const char* path = std::getenv("ZEROSHARD_RDZV_FILE");
  ZEROSHARD_CHECK_USAGE(world == 1 || (path != nullptr && *path != '\0'),
                        "ZEROSHARD_RDZV_FILE is not set: with WORLD_SIZE="
                            << world << " rank 0 passes NCCL's id to the others through that "
                            << "file; set it to a fresh path on a file system all ranks share");
  const std::chrono::duration<double> timeout = detail::collective_timeout_from_environment();
  auto communicator =
      make_nccl_communicator(device, rank, world, [&](void* bytes, std::size_t count) {
        if (world > 1) exchange_through_file(path, rank, bytes, count, timeout);
      });
  if (rank == 0 && world > 1) {
    // Initialisation completes only once every rank has joined, so all have read the id; removing
    // the file keeps a later job at the same path from reading a stale one.
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  return communicator;
}

}  // namespace zeroshard::cuda
