// The MPI backend: each collective is one or more non-blocking MPI calls whose requests are
// polled with MPI_Testall until they complete or the deadline passes, or (the reduce-scatter) a
// ring of point-to-point messages advanced each time it is polled.
#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/collective_checks.h"
#include "comm/mpi_peer_channel.h"
#include "comm/mpi_runtime.h"
#include "comm/rank_counts.h"
#include "comm/ring_reduce_scatter.h"
#include "comm/wait_deadline.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::detail {
namespace {

using Seconds = std::chrono::duration<double>;

// A timeout beyond a few decades means "never"; capping it keeps the deadline arithmetic in the
// range of steady_clock.
constexpr double kLongestTimeoutSeconds = 1e9;

// What a request is doing, copied into it for error messages: the communicator may be gone by
// the time the request fails.
struct Operation {
  const char* name;
  std::int64_t count = 0;
  std::optional<DType> dtype = std::nullopt;
  int rank = -1;
  int size = 0;

  std::string describe() const {
    std::ostringstream os;
    os << name;
    if (dtype) os << " of " << count << " " << to_string(*dtype) << " elements";
    os << " on rank " << rank << " of " << size;
    return os.str();
  }
};

// Tags of ring messages cycle below the smallest MPI_TAG_UB the standard allows; rings in flight
// at once on one communicator get different tags as long as fewer than this many are.
constexpr int kRingTags = 32767;
// The all-to-all's messages, above every ring's tag.
constexpr int kAllToAllTag = kRingTags;

// Messages of 1 MiB: large enough that per-message overhead is small on TCP, small enough that a
// slice's chunks pipeline (chunk c+1 is on the wire while chunk c is reduced).
constexpr std::int64_t kRingChunkBytes = std::int64_t{1} << 20;

// Everything MPI may read or write until a collective completes: the request handles, the count
// and displacement arrays of the v-collectives, the communicator MPI_Comm_idup fills in, a ring's
// state and staging buffers.
struct InFlight {
  std::vector<MPI_Request> requests;
  std::vector<int> counts;
  std::vector<int> displacements;
  MPI_Comm new_comm = MPI_COMM_NULL;
  std::shared_ptr<RingReduceScatter> ring;
  // An in-place MPI_Ireduce_scatter receives here and copies to `copy_back_to` once complete.
  std::vector<std::byte> received;
  void* copy_back_to = nullptr;
};

// The rings in flight on one communicator. A ring moves only when polled, so polling any request
// of the communicator advances all of them: a rank waiting on one collective keeps feeding its
// neighbours' rings of the others, whatever order the ranks wait in.
class RingProgress {
 public:
  void add(const std::shared_ptr<RingReduceScatter>& ring) { rings_.push_back(ring); }

  void advance_all() {
    std::erase_if(rings_, [](const std::weak_ptr<RingReduceScatter>& weak) {
      const std::shared_ptr<RingReduceScatter> ring = weak.lock();
      return ring == nullptr || ring->advance();
    });
  }

 private:
  std::vector<std::weak_ptr<RingReduceScatter>> rings_;
};

class MpiRequest final : public Request::Impl {
 public:
  MpiRequest(const Operation& operation, Seconds timeout,
             std::shared_ptr<MpiPeerChannel> channel = nullptr,
             std::shared_ptr<RingProgress> rings = nullptr)
      : operation_(operation),
        timeout_(timeout),
        channel_(std::move(channel)),
        rings_(std::move(rings)),
        in_flight_(std::make_unique<InFlight>()) {}
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;

  ~MpiRequest() override {
    const bool active = std::any_of(in_flight_->requests.begin(), in_flight_->requests.end(),
                                    [](MPI_Request r) { return r != MPI_REQUEST_NULL; }) ||
                        (in_flight_->ring && in_flight_->ring->in_flight());
    if (!active || mpi_finalized()) return;
    // A failed non-blocking collective can be neither cancelled nor freed (MPI forbids both), and
    // MPI may still read its arrays or write its buffers: leak them rather than free them.
    ZEROSHARD_LOG(kError, "abandoning "
                              << operation_.describe()
                              << " while it is still in flight; its buffers may still be "
                                 "used by MPI, so this communicator must not be used again");
    static_cast<void>(in_flight_.release());
  }

  InFlight& in_flight() noexcept { return *in_flight_; }
  bool empty() const noexcept { return in_flight_->requests.empty() && !in_flight_->ring; }

  // Makes this request drive a ring, which the communicator's other requests advance as well.
  // Its first messages leave now, so that they travel while the caller computes.
  void attach(RingPlan plan) {
    in_flight_->ring = std::make_shared<RingReduceScatter>(std::move(plan));
    rings_->add(in_flight_->ring);
    in_flight_->ring->advance();
  }

  std::string description() const { return operation_.describe(); }

  // The handle for the next MPI call to fill in; valid until the next call of add().
  MPI_Request& add() { return in_flight_->requests.emplace_back(MPI_REQUEST_NULL); }

  // Checks the return code of the MPI call that started the latest part of this collective.
  void check_started(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    in_flight_->requests.back() = MPI_REQUEST_NULL;
    throw CommError(ErrorCode::kMpi, std::string(call) + " failed to start " +
                                         operation_.describe() + ": " + mpi_error_string(rc));
  }

  void wait() override {
    check_not_finalized();
    WaitDeadline deadline(timeout_);
    // MPI progresses non-blocking collectives only inside MPI calls, so sleeping between polls
    // would stall large transfers; yielding keeps oversubscribed ranks fair, and costs no more
    // CPU than MPI_Wait, which busy-polls as well.
    while (!poll()) {
      // Peers that time out ask this rank how far it is; answering while waiting is what lets
      // them tell a rank that is behind from one that is waiting with them.
      if (channel_) channel_->service();
      if (deadline.expired()) {
        std::ostringstream os;
        os << operation_.describe() << " did not complete within " << timeout_.count()
           << " s; a peer rank may have died, hung, or issued a different collective (the limit "
              "is set by ZEROSHARD_COLLECTIVE_TIMEOUT_S)";
        if (deadline.not_running_s() > 0) {
          os << "; this rank itself did not run for " << deadline.not_running_s()
             << " s of the wait (stopped or descheduled), which was not counted";
        }
        throw TimeoutError(os.str());
      }
      std::this_thread::yield();
    }
  }

  bool test() override {
    check_not_finalized();
    return poll();
  }

 private:
  bool poll() {
    if (rings_) rings_->advance_all();
    if (in_flight_->ring) return in_flight_->ring->advance();
    std::vector<MPI_Request>& requests = in_flight_->requests;
    int done = 0;
    const int rc =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      throw CommError(ErrorCode::kMpi, "MPI_Testall failed for " + operation_.describe() + ": " +
                                           mpi_error_string(rc));
    }
    if (done != 0 && in_flight_->copy_back_to != nullptr) {
      std::memcpy(std::exchange(in_flight_->copy_back_to, nullptr), in_flight_->received.data(),
                  in_flight_->received.size());
    }
    return done != 0;
  }

  void check_not_finalized() const {
    if (mpi_finalized()) {
      throw CommError(ErrorCode::kMpi,
                      "MPI was finalized while " + operation_.describe() + " was pending");
    }
  }

  Operation operation_;
  Seconds timeout_;
  std::shared_ptr<MpiPeerChannel> channel_;  // null while the communicator is being made
  std::shared_ptr<RingProgress> rings_;      // null while the communicator is being made
  std::unique_ptr<InFlight> in_flight_;
};

// Owns a communicator made for zeroshard; frees it unless MPI is already finalized, so that a
// communicator outliving the runtime (a global destroyed late) does not call into a dead MPI.
class OwnedComm {
 public:
  explicit OwnedComm(MPI_Comm comm) noexcept : comm_(comm) {}
  OwnedComm(OwnedComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  OwnedComm& operator=(OwnedComm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  ~OwnedComm() { reset(); }

  MPI_Comm get() const noexcept { return comm_; }
  /// Hands the communicator to a new owner.
  MPI_Comm release() noexcept { return std::exchange(comm_, MPI_COMM_NULL); }

 private:
  void reset() noexcept {
    if (comm_ != MPI_COMM_NULL && !mpi_finalized() && MPI_Comm_free(&comm_) != MPI_SUCCESS) {
      ZEROSHARD_LOG(kError, "MPI_Comm_free failed");
    }
    comm_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_;
};

void throw_if_failed(int rc, const char* call, const std::string& context) {
  if (rc != MPI_SUCCESS) {
    throw CommError(ErrorCode::kMpi,
                    std::string(call) + " failed " + context + ": " + mpi_error_string(rc));
  }
}

// MPI_Comm_idup rather than MPI_Comm_dup so that creating a communicator with a dead peer times
// out like any collective. `parent` is MPI_COMM_WORLD or the program's own communicator;
// `what` names its duplication in messages.
OwnedComm duplicate(MPI_Comm parent, const char* what, Seconds timeout) {
  int rank = -1;
  int size = 0;
  throw_if_failed(MPI_Comm_rank(parent, &rank), "MPI_Comm_rank", std::string("before ") + what);
  throw_if_failed(MPI_Comm_size(parent, &size), "MPI_Comm_size", std::string("before ") + what);
  MpiRequest dup({.name = what, .rank = rank, .size = size}, timeout);
  dup.check_started(MPI_Comm_idup(parent, &dup.in_flight().new_comm, &dup.add()), "MPI_Comm_idup");
  dup.wait();
  OwnedComm comm(dup.in_flight().new_comm);
  // Our calls check every return code, so MPI must return errors instead of aborting the job.
  throw_if_failed(MPI_Comm_set_errhandler(comm.get(), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
                  "on rank " + std::to_string(rank));
  return comm;
}

std::byte* element_at(void* base, std::int64_t index, DType dtype) noexcept {
  return static_cast<std::byte*>(base) + index * static_cast<std::int64_t>(size_of(dtype));
}
const std::byte* element_at(const void* base, std::int64_t index, DType dtype) noexcept {
  return static_cast<const std::byte*>(base) + index * static_cast<std::int64_t>(size_of(dtype));
}

std::vector<int> to_int(std::span<const std::int64_t> values) {
  std::vector<int> out(values.size());
  std::transform(values.begin(), values.end(), out.begin(),
                 [](std::int64_t v) { return static_cast<int>(v); });
  return out;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const MpiCommunicatorOptions& options, MPI_Comm parent, const char* what)
      : runtime_(MpiRuntime::instance()),
        options_(options),
        timeout_(options.timeout),
        max_elements_per_call_(options.max_elements_per_call),
        reduce_scatter_(options.reduce_scatter),
        comm_(duplicate(parent, what, options.timeout)) {
    throw_if_failed(MPI_Comm_rank(comm_.get(), &rank_), "MPI_Comm_rank", "on a new communicator");
    throw_if_failed(MPI_Comm_size(comm_.get(), &size_), "MPI_Comm_size", "on a new communicator");
    // The side channel has a communicator of its own, so that its messages can never match the
    // collectives' and it still works when a collective is stuck.
    OwnedComm side = duplicate(parent, what, options.timeout);
    channel_ = std::make_shared<MpiPeerChannel>(side.release(), tracker()->board());
    tracker()->set_peer_channel(channel_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string backend() const override { return "mpi"; }

  Request start_all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op) override {
    check_buffer(Collective::kAllReduce, data, count);
    auto request = start(Collective::kAllReduce, count, dtype);
    for_each_piece(count, [&](std::int64_t offset, int n) {
      request->check_started(
          MPI_Iallreduce(MPI_IN_PLACE, element_at(data, offset, dtype), n, runtime_.datatype(dtype),
                         runtime_.op(dtype, op), comm_.get(), &request->add()),
          "MPI_Iallreduce");
    });
    count_traffic(Collective::kAllReduce, 2 * count, dtype);
    return finish(std::move(request));
  }

  Request start_reduce_scatter(const void* input, void* output,
                               std::span<const std::int64_t> counts, DType dtype,
                               ReduceOp op) override {
    const std::int64_t total = checked_total(Collective::kReduceScatter, counts, size_);
    const std::int64_t mine = counts[static_cast<std::size_t>(rank_)];
    check_buffer(Collective::kReduceScatter, input, total);
    check_buffer(Collective::kReduceScatter, output, mine);
    const auto element_bytes = static_cast<std::int64_t>(size_of(dtype));
    const std::int64_t own_offset = offset_of(counts, rank_);
    const bool in_place = check_in_place(input, total * element_bytes, own_offset * element_bytes,
                                         output, mine * element_bytes);

    auto request = start(Collective::kReduceScatter, total, dtype);
    const MPI_Datatype type = runtime_.datatype(dtype);
    const MPI_Op mpi_op = runtime_.op(dtype, op);
    // Every rank holds the same counts, so every rank takes the same branch below and issues the
    // same sequence of MPI calls. A total of zero needs no call at all.
    if (total > 0 && reduce_scatter_ == ReduceScatterAlgorithm::kRing) {
      // Every rank starts its rings in the same order, so the counter agrees across ranks.
      const int tag = next_ring_tag_;
      next_ring_tag_ = (next_ring_tag_ + 1) % kRingTags;
      request->attach(
          {.input = input,
           .output = output,
           .counts = {counts.begin(), counts.end()},
           .dtype = dtype,
           .op = op,
           .rank = rank_,
           .size = size_,
           .comm = comm_.get(),
           .type = type,
           .tag = tag,
           .chunk_elements = std::min(kRingChunkBytes / static_cast<std::int64_t>(size_of(dtype)),
                                      max_elements_per_call_),
           .description = request->description()});
    } else if (total > 0 && total <= max_elements_per_call_) {
      InFlight& in_flight = request->in_flight();
      in_flight.counts = to_int(counts);
      // MPI_IN_PLACE here would take the input from the output buffer and put the result at its
      // start, not at this rank's slice: an in-place rank receives apart and copies its slice
      // back on completion, so that every rank still issues the same call.
      void* received = output;
      if (in_place && mine > 0) {
        in_flight.received.resize(static_cast<std::size_t>(mine * element_bytes));
        in_flight.copy_back_to = output;
        received = in_flight.received.data();
      }
      request->check_started(MPI_Ireduce_scatter(input, received, in_flight.counts.data(), type,
                                                 mpi_op, comm_.get(), &request->add()),
                             "MPI_Ireduce_scatter");
    } else if (total > max_elements_per_call_) {
      // Counts or offsets beyond int: one reduce per slice, rooted at the rank that owns the
      // slice, split into pieces that fit an int count. Only the root passes MPI_IN_PLACE, so a
      // rank may reduce in place whatever the others do.
      std::int64_t slice_start = 0;
      for (int root = 0; root < size_; ++root) {
        for_each_piece(counts[static_cast<std::size_t>(root)], [&](std::int64_t offset, int n) {
          const void* sent = element_at(input, slice_start + offset, dtype);
          void* received = nullptr;
          if (root == rank_) {
            received = element_at(output, offset, dtype);
            if (in_place) sent = MPI_IN_PLACE;
          }
          request->check_started(
              MPI_Ireduce(sent, received, n, type, mpi_op, root, comm_.get(), &request->add()),
              "MPI_Ireduce");
        });
        slice_start += counts[static_cast<std::size_t>(root)];
      }
    }
    count_traffic(Collective::kReduceScatter, total, dtype);
    return finish(std::move(request));
  }

  Request start_all_gather(void* data, std::span<const std::int64_t> counts, DType dtype) override {
    const std::int64_t total = checked_total(Collective::kAllGather, counts, size_);
    check_buffer(Collective::kAllGather, data, total);

    auto request = start(Collective::kAllGather, total, dtype);
    const MPI_Datatype type = runtime_.datatype(dtype);
    // Every rank holds the same counts, so every rank takes the same branch; zero needs no call.
    if (total > 0 && total <= max_elements_per_call_) {
      InFlight& in_flight = request->in_flight();
      in_flight.counts = to_int(counts);
      in_flight.displacements.resize(counts.size());
      std::exclusive_scan(in_flight.counts.begin(), in_flight.counts.end(),
                          in_flight.displacements.begin(), 0);
      request->check_started(
          MPI_Iallgatherv(MPI_IN_PLACE, 0, type, data, in_flight.counts.data(),
                          in_flight.displacements.data(), type, comm_.get(), &request->add()),
          "MPI_Iallgatherv");
    } else if (total > max_elements_per_call_) {
      // Counts or displacements beyond int: each rank broadcasts its own slice, in pieces that
      // fit an int count.
      std::int64_t slice_start = 0;
      for (int root = 0; root < size_; ++root) {
        for_each_piece(counts[static_cast<std::size_t>(root)], [&](std::int64_t offset, int n) {
          request->check_started(MPI_Ibcast(element_at(data, slice_start + offset, dtype), n, type,
                                            root, comm_.get(), &request->add()),
                                 "MPI_Ibcast");
        });
        slice_start += counts[static_cast<std::size_t>(root)];
      }
    }
    count_traffic(Collective::kAllGather, total, dtype);
    return finish(std::move(request));
  }

  Request start_broadcast(void* data, std::int64_t count, DType dtype, int root) override {
    check_buffer(Collective::kBroadcast, data, count);
    check_root(root, size_);
    auto request = start(Collective::kBroadcast, count, dtype);
    for_each_piece(count, [&](std::int64_t offset, int n) {
      request->check_started(
          MPI_Ibcast(element_at(data, offset, dtype), n, runtime_.datatype(dtype), root,
                     comm_.get(), &request->add()),
          "MPI_Ibcast");
    });
    count_traffic(Collective::kBroadcast, count, dtype);
    return finish(std::move(request));
  }

  Request start_all_to_all(const void* input, std::span<const std::int64_t> send_counts,
                           void* output, std::span<const std::int64_t> recv_counts,
                           DType dtype) override {
    const std::int64_t to_others =
        check_all_to_all(input, send_counts, output, recv_counts, dtype, rank_, size_);
    const auto own = static_cast<std::size_t>(rank_);
    ZEROSHARD_CHECK_USAGE(send_counts[own] == recv_counts[own],
                          "all-to-all: rank " << rank_ << " sends " << send_counts[own]
                                              << " elements to itself but expects "
                                              << recv_counts[own]);
    auto request = start(Collective::kAllToAll, total_of(send_counts), dtype);
    const MPI_Datatype type = runtime_.datatype(dtype);
    // Point-to-point messages in pieces that fit an int count, at offsets of any size, rather
    // than MPI_Ialltoallv, whose counts and displacements are int. Pieces between two ranks match
    // in the order they are posted (MPI's non-overtaking rule), and every rank posts its
    // all-to-alls in the same order.
    std::int64_t sent_before = 0;
    std::int64_t received_before = 0;
    for (int peer = 0; peer < size_; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      if (peer == rank_) {
        if (send_counts[p] > 0) {
          std::memcpy(element_at(output, received_before, dtype),
                      element_at(input, sent_before, dtype),
                      static_cast<std::size_t>(send_counts[p]) * size_of(dtype));
        }
      } else {
        for_each_piece(recv_counts[p], [&](std::int64_t offset, int n) {
          request->check_started(MPI_Irecv(element_at(output, received_before + offset, dtype), n,
                                           type, peer, kAllToAllTag, comm_.get(), &request->add()),
                                 "MPI_Irecv");
        });
        for_each_piece(send_counts[p], [&](std::int64_t offset, int n) {
          request->check_started(MPI_Isend(element_at(input, sent_before + offset, dtype), n, type,
                                           peer, kAllToAllTag, comm_.get(), &request->add()),
                                 "MPI_Isend");
        });
      }
      sent_before += send_counts[p];
      received_before += recv_counts[p];
    }
    count_traffic(Collective::kAllToAll, to_others, dtype);
    return finish(std::move(request));
  }

  std::unique_ptr<Communicator> make_split(int color, int key) override {
    MPI_Comm split = MPI_COMM_NULL;
    throw_if_failed(MPI_Comm_split(comm_.get(), color, key, &split), "MPI_Comm_split",
                    "on rank " + std::to_string(rank_) + " (color " + std::to_string(color) + ")");
    // The new communicator works on duplicates of its own, like every MPI communicator here.
    const OwnedComm owned(split);
    return std::make_unique<MpiCommunicator>(options_, owned.get(), "duplication of a split");
  }

  [[noreturn]] void end_job(int error_code) noexcept override {
    MPI_Abort(comm_.get(), error_code);
    std::_Exit(error_code);
  }

  void run_barrier() override {
    auto request = std::make_unique<MpiRequest>(
        Operation{.name = to_string(Collective::kBarrier), .rank = rank_, .size = size_}, timeout_,
        channel_, rings_);
    request->check_started(MPI_Ibarrier(comm_.get(), &request->add()), "MPI_Ibarrier");
    count_traffic(Collective::kBarrier, 0, DType::kFloat32);
    Request(std::move(request)).wait();
  }

 private:
  std::unique_ptr<MpiRequest> start(Collective collective, std::int64_t count, DType dtype) const {
    return std::make_unique<MpiRequest>(
        Operation{to_string(collective), count, dtype, rank_, size_}, timeout_, channel_, rings_);
  }

  // A collective that needed no MPI call is already complete.
  static Request finish(std::unique_ptr<MpiRequest> request) {
    return request->empty() ? Request{} : Request(std::move(request));
  }

  // Calls post(offset, n) for consecutive pieces of [0, count), each at most
  // max_elements_per_call_ elements so that n fits MPI's int count.
  template <class Post>
  void for_each_piece(std::int64_t count, Post&& post) const {
    for (std::int64_t offset = 0; offset < count; offset += max_elements_per_call_) {
      post(offset, static_cast<int>(std::min(max_elements_per_call_, count - offset)));
    }
  }

  const MpiRuntime& runtime_;
  MpiCommunicatorOptions options_;
  Seconds timeout_;
  std::int64_t max_elements_per_call_;
  ReduceScatterAlgorithm reduce_scatter_;
  OwnedComm comm_;
  int rank_ = -1;
  int size_ = 0;
  std::shared_ptr<MpiPeerChannel> channel_;
  std::shared_ptr<RingProgress> rings_ = std::make_shared<RingProgress>();
  int next_ring_tag_ = 0;
};

}  // namespace

Seconds collective_timeout_from_environment() {
  const char* text = std::getenv("ZEROSHARD_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr) return kDefaultCollectiveTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0)) {
    throw ConfigError("ZEROSHARD_COLLECTIVE_TIMEOUT_S",
                      std::string("got '") + text + "', expected a positive number of seconds");
  }
  return Seconds(std::min(seconds, kLongestTimeoutSeconds));
}

ReduceScatterAlgorithm reduce_scatter_algorithm_from_environment() {
  const char* text = std::getenv("ZEROSHARD_REDUCE_SCATTER");
  if (text == nullptr || std::strcmp(text, "ring") == 0) return ReduceScatterAlgorithm::kRing;
  if (std::strcmp(text, "mpi") == 0) return ReduceScatterAlgorithm::kMpi;
  throw ConfigError("ZEROSHARD_REDUCE_SCATTER",
                    std::string("got '") + text + "', expected 'ring' or 'mpi'");
}

namespace {

MpiCommunicatorOptions checked_options(const MpiCommunicatorOptions& options) {
  ZEROSHARD_CHECK_USAGE(options.timeout.count() > 0, "MPI communicator: got timeout "
                                                         << options.timeout.count()
                                                         << " s, expected > 0");
  ZEROSHARD_CHECK_USAGE(
      options.max_elements_per_call >= 1 && options.max_elements_per_call <= INT_MAX,
      "MPI communicator: got max_elements_per_call " << options.max_elements_per_call
                                                     << ", expected 1.." << INT_MAX);
  MpiCommunicatorOptions checked = options;
  checked.timeout = std::min(checked.timeout, Seconds(kLongestTimeoutSeconds));
  return checked;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const MpiCommunicatorOptions& options) {
  return std::make_unique<MpiCommunicator>(checked_options(options), MPI_COMM_WORLD,
                                           "duplication of MPI_COMM_WORLD");
}

std::unique_ptr<Communicator> make_mpi_communicator(const MpiCommunicatorOptions& options,
                                                    int fortran_handle) {
  // The program made its communicator, so MPI is initialised and the handle converts.
  const MPI_Comm parent = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  ZEROSHARD_CHECK_USAGE(parent != MPI_COMM_NULL,
                        "Communicator::from_mpi: got MPI_COMM_NULL, expected the communicator "
                        "of the ranks to shard over");
  return std::make_unique<MpiCommunicator>(checked_options(options), parent,
                                           "duplication of the program's communicator");
}

}  // namespace zeroshard::detail
