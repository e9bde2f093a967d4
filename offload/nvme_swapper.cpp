// NvmeSwapper: records with generations and checksums, A/B copies, and the io_uring pipeline
// that splits requests into pieces, keeps the queue full and re-queues short and busy ones.
#include "offload/nvme_swapper.h"

#include <liburing.h>
#include <sched.h>  // sched_yield

#include <algorithm>
#include <cerrno>
#include <cstddef>  // offsetof
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string_view>

#include "config/config_checks.h"
#include "util/crc32c.h"
#include "util/log.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

// check_aio() cuts requests into whole pieces of kAioBlockAlignment bytes.
static_assert(kAioBlockAlignment % kDirectIoAlignment == 0);
// The header occupies the record's first page, so the payload stays page-aligned for O_DIRECT.
constexpr std::int64_t kHeaderBytes = static_cast<std::int64_t>(kDirectIoAlignment);
constexpr char kMagic[8] = {'Z', 'S', 'S', 'W', 'A', 'P', '\0', '\1'};
// Version 2 added the writer's rank, kind and run id.
constexpr std::uint32_t kFormatVersion = 2;
// The kind in a header, NUL-padded; a longer kind is refused when the swapper is made.
constexpr std::size_t kKindBytes = 32;
// A request that keeps reporting EAGAIN this often is given up as an error.
constexpr int kMaxRetries = 1000;

// Little-endian, as the CPU stores it; header_crc covers every byte before it (no padding).
// Rank, kind and run tell apart records that are whole and of the right slot and generation but
// not this swapper's: another rank's file or an earlier run's copied over this one.
struct RecordHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t slot;
  std::uint64_t copy;
  std::uint64_t generation;
  std::uint64_t payload_bytes;
  std::uint64_t run_id;
  std::uint32_t rank;
  std::uint32_t payload_crc;
  char kind[kKindBytes];
  std::uint32_t header_crc;
};
static_assert(offsetof(RecordHeader, header_crc) == 96 && sizeof(RecordHeader) == 104);

std::uint32_t header_crc(const RecordHeader& header) {
  return crc32c(&header, offsetof(RecordHeader, header_crc));
}

std::string hex(std::uint64_t value) {
  std::ostringstream os;
  os << "0x" << std::hex << value;
  return os.str();
}

// "rank 1's optimizer_master of run 0x1a2b3c"
std::string owner_text(std::uint64_t rank, std::string_view kind, std::uint64_t run_id) {
  return "rank " + std::to_string(rank) + "'s " + std::string(kind) + " of run " + hex(run_id);
}

std::string advice(int error) {
  switch (error) {
    case ENOSPC:
      return "the drive is full: free space or point nvme_path at a larger drive";
    case EFBIG:
      return "the file-size limit (ulimit -f) or the file system's largest file was reached: "
             "raise the limit";
    case EIO:
      return "the drive reported an I/O error: check it (dmesg, smartctl); the slot's previous "
             "generation is still readable";
    case EINVAL:
      return "the file system refused the O_DIRECT request (alignment): use a local NVMe drive "
             "with ext4 or xfs";
    default:
      return "check the drive and nvme_path";
  }
}

const NvmeSwapperOptions& validated(const NvmeSwapperOptions& o) {
  check_aio(o.aio);
  if (o.slot_count < 1) {
    throw UsageError("NVMe swapper: slot_count " + std::to_string(o.slot_count) +
                     ", expected at least 1");
  }
  if (o.slot_bytes < 1) {
    throw UsageError("NVMe swapper: slot_bytes " + std::to_string(o.slot_bytes) +
                     ", expected at least 1");
  }
  if (o.buffer_count < 1) {
    throw ConfigError("buffer_count", "got " + std::to_string(o.buffer_count) +
                                          ", expected at least 1 swap buffer");
  }
  const bool kind_ok = !o.kind.empty() && o.kind.size() < kKindBytes &&
                       std::all_of(o.kind.begin(), o.kind.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
                       });
  if (!kind_ok) {
    throw UsageError("NVMe swapper: kind \"" + o.kind + "\" must be 1 to " +
                     std::to_string(kKindBytes - 1) +
                     " lower-case letters, digits and '_' (it names the file and each record)");
  }
  if (o.rank < 0) {
    throw UsageError("NVMe swapper: rank " + std::to_string(o.rank) + ", expected at least 0");
  }
  return o;
}

}  // namespace

std::int64_t swap_record_bytes(std::int64_t slot_bytes) {
  return kHeaderBytes + static_cast<std::int64_t>(round_up_to_page(slot_bytes));
}

NvmeSwapper::NvmeSwapper(const NvmeSwapperOptions& options)
    : rank_(validated(options).rank),
      kind_(options.kind),
      run_id_(options.run_id),
      slot_count_(options.slot_count),
      slot_bytes_(options.slot_bytes),
      record_bytes_(swap_record_bytes(options.slot_bytes)),
      aio_(options.aio),
      tracker_(options.tracker),
      category_(options.category),
      file_(swap_file_path(make_swap_directory(options.directory), options.rank, options.kind),
            2 * options.slot_count * swap_record_bytes(options.slot_bytes)),
      ring_(static_cast<unsigned>(options.aio.queue_depth * options.aio.intra_op_parallelism),
            file_.path(), options.ring),
      slots_(static_cast<std::size_t>(options.slot_count)) {
  buffers_.reserve(static_cast<std::size_t>(options.buffer_count));
  std::vector<iovec> iovecs;
  for (int i = 0; i < options.buffer_count; ++i) {
    buffers_.emplace_back(static_cast<std::size_t>(record_bytes_), tracker_, category_);
    iovecs.push_back(iovec{buffers_.back().data(), buffers_.back().bytes()});
  }
  buffer_busy_.assign(buffers_.size(), false);
  // io_uring registers at most 1 GiB per buffer; larger records use plain reads and writes.
  if (record_bytes_ <= (std::int64_t{1} << 30)) {
    buffers_registered_ = ring_.register_buffers(iovecs);
  } else {
    ZEROSHARD_LOG(kInfo, "NVMe swapper " << file_.path() << ": records of " << record_bytes_
                                         << " bytes exceed io_uring's 1 GiB per registered "
                                            "buffer; using unregistered buffers");
  }
  const int fd = file_.fd();
  file_registered_ = ring_.register_files(std::span<const int>(&fd, 1));
  const unsigned entries = ring_.entries();
  in_flight_.resize(entries);
  completions_.resize(entries);
  for (unsigned e = entries; e-- > 0;) free_entries_.push_back(e);
  if (tracker_) tracker_->add(MemoryLocation::kNvme, category_, file_.bytes());
  ZEROSHARD_LOG(kDebug, "NVMe swapper "
                            << file_.path() << ": " << slot_count_ << " slots of " << slot_bytes_
                            << " bytes, " << buffers_.size() << " buffers"
                            << (buffers_registered_ ? " (registered)" : "") << ", " << entries
                            << " requests in flight");
}

NvmeSwapper::~NvmeSwapper() {
  // The kernel may still be writing into the buffers: wait for every request before they go.
  queued_.clear();
  try {
    // Entries io_uring_submit never took will not complete; hand them over first.
    for (int tries = 0; prepared_ > 0 && tries < kMaxRetries; ++tries) {
      prepared_ -= static_cast<unsigned>(ring_.submit());
    }
    while (free_entries_.size() + prepared_ < in_flight_.size()) {
      const int n = ring_.wait(1, completions_);
      for (int i = 0; i < n; ++i)
        free_entries_.push_back(static_cast<unsigned>(completions_[i].user_data));
    }
  } catch (const std::exception& e) {
    ZEROSHARD_LOG(kError, "NVMe swapper " << file_.path() << ": draining at exit: " << e.what());
  }
  if (tracker_) tracker_->remove(MemoryLocation::kNvme, category_, file_.bytes());
}

std::span<std::byte> NvmeSwapper::buffer(int index) {
  check_buffer(index);
  return {buffers_[static_cast<std::size_t>(index)].data() + kHeaderBytes,
          static_cast<std::size_t>(slot_bytes_)};
}

std::int64_t NvmeSwapper::buffer_bytes() const noexcept {
  std::int64_t total = 0;
  for (const PinnedBuffer& b : buffers_) total += static_cast<std::int64_t>(b.bytes());
  return total;
}

std::int64_t NvmeSwapper::record_offset(std::int64_t slot, int copy) const noexcept {
  return (2 * slot + copy) * record_bytes_;
}

std::uint64_t NvmeSwapper::generation(std::int64_t slot) const {
  check_slot(slot);
  return slots_[static_cast<std::size_t>(slot)].generation;
}

int NvmeSwapper::current_copy(std::int64_t slot) const {
  check_slot(slot);
  return slots_[static_cast<std::size_t>(slot)].current;
}

NvmeSwapper::Snapshot NvmeSwapper::snapshot() const {
  Snapshot taken;
  for (const SlotState& state : slots_) {
    taken.current.push_back(state.current);
    taken.generation.push_back(state.generation);
  }
  return taken;
}

void NvmeSwapper::restore(const Snapshot& snapshot) {
  if (!ops_.empty()) {
    throw UsageError("NVMe swapper " + file_.path() +
                     ": restore() while requests are in flight; wait for them first");
  }
  if (snapshot.current.size() != slots_.size()) {
    throw UsageError("NVMe swapper " + file_.path() + ": restore() of a snapshot of " +
                     std::to_string(snapshot.current.size()) + " slots into " +
                     std::to_string(slots_.size()));
  }
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    slots_[s].current = snapshot.current[s];
    slots_[s].generation = snapshot.generation[s];
  }
}

void NvmeSwapper::inject_fault(const IoFault& fault) noexcept {
  fault_ = fault;
  completions_since_fault_ = 0;
}

void NvmeSwapper::check_slot(std::int64_t slot) const {
  if (slot < 0 || slot >= slot_count_) {
    throw UsageError("NVMe swapper " + file_.path() + ": slot " + std::to_string(slot) +
                     " out of range 0.." + std::to_string(slot_count_ - 1));
  }
}

void NvmeSwapper::check_buffer(int buffer) const {
  if (buffer < 0 || buffer >= buffer_count()) {
    throw UsageError("NVMe swapper " + file_.path() + ": buffer " + std::to_string(buffer) +
                     " out of range 0.." + std::to_string(buffer_count() - 1));
  }
}

std::string NvmeSwapper::describe(const Op& op, std::int64_t offset) const {
  return "swap file " + file_.path() + ", offset " + std::to_string(offset) + ", " +
         (op.kind == OpKind::kRead ? "read" : "write") + " of slot " + std::to_string(op.slot) +
         " (copy " + (op.copy == 0 ? "A" : "B") + ", generation " + std::to_string(op.generation) +
         ")";
}

SwapTicket NvmeSwapper::write(std::int64_t slot, int buffer) {
  return start(OpKind::kWrite, slot, buffer);
}

SwapTicket NvmeSwapper::read(std::int64_t slot, int buffer) {
  return start(OpKind::kRead, slot, buffer);
}

SwapTicket NvmeSwapper::start(OpKind kind, std::int64_t slot, int buffer) {
  check_slot(slot);
  check_buffer(buffer);
  SlotState& state = slots_[static_cast<std::size_t>(slot)];
  const char* verb = kind == OpKind::kRead ? "read" : "write";
  if (state.busy) {
    throw UsageError("NVMe swapper " + file_.path() + ": " + verb + " of slot " +
                     std::to_string(slot) + " while a request on it is in flight; wait first");
  }
  if (buffer_busy_[static_cast<std::size_t>(buffer)]) {
    throw UsageError("NVMe swapper " + file_.path() + ": " + verb + " into buffer " +
                     std::to_string(buffer) + " while a request on it is not waited for");
  }
  if (kind == OpKind::kRead && state.current < 0) {
    throw UsageError("NVMe swapper " + file_.path() + ": read of slot " + std::to_string(slot) +
                     ", which was never written");
  }
  file_.check_intact(verb);

  Op op;
  op.kind = kind;
  op.slot = slot;
  op.buffer = buffer;
  std::byte* const record = buffers_[static_cast<std::size_t>(buffer)].data();
  if (kind == OpKind::kWrite) {
    // Never the current copy: until this write completes, the previous generation stays whole.
    op.copy = state.current < 0 ? 0 : 1 - state.current;
    op.generation = state.generation + 1;
  } else {
    op.copy = state.current;
    op.generation = state.generation;
  }

  // Cut the record into stripes (one per intra-op stream) of whole blocks, then interleave the
  // stripes' pieces so that every stream has requests in flight.
  const std::int64_t block = aio_.block_size;
  const std::int64_t blocks = (record_bytes_ + block - 1) / block;
  const std::int64_t stripes = std::min<std::int64_t>(aio_.intra_op_parallelism, blocks);
  const std::int64_t blocks_per_stripe = (blocks + stripes - 1) / stripes;
  const std::int64_t base = record_offset(slot, op.copy);
  const std::uint64_t id = next_op_++;
  if (kind == OpKind::kRead) op.landed.assign(static_cast<std::size_t>(blocks), false);
  for (std::int64_t i = 0; i < blocks_per_stripe; ++i) {
    for (std::int64_t s = 0; s < stripes; ++s) {
      const std::int64_t b = s * blocks_per_stripe + i;
      if (b >= blocks || i >= blocks_per_stripe) continue;
      const std::int64_t begin = b * block;
      Piece piece;
      piece.op = id;
      piece.offset = base + begin;
      piece.data = record + begin;
      piece.bytes = static_cast<std::uint32_t>(std::min(block, record_bytes_ - begin));
      piece.buffer = buffer;
      ++op.outstanding;
      if (kind == OpKind::kWrite && b == 0) {
        op.header = piece;
        op.header_held = true;
      } else {
        queued_.push_back(piece);
      }
    }
  }
  // The checksum thread checks a write's payload while the rest of the record is in flight; the
  // first piece, which carries the header and its checksum, goes out once that is done. Order
  // on disk does not matter: a record only partly written fails its checksum, and the copy is
  // not current before every piece is written. A read's payload is checked as its blocks land.
  const auto payload = static_cast<std::size_t>(slot_bytes_);
  op.checksum = checksums_.start(record + kHeaderBytes, payload,
                                 kind == OpKind::kWrite ? payload : std::size_t{0});
  if (kind == OpKind::kWrite) held_headers_.push_back(id);
  state.busy = true;
  buffer_busy_[static_cast<std::size_t>(buffer)] = true;
  ops_.emplace(id, std::move(op));
  fill();
  return SwapTicket{id};
}

bool NvmeSwapper::release_headers(bool block) {
  bool released = false;
  while (!held_headers_.empty()) {
    const std::uint64_t id = held_headers_.front();
    Op& op = ops_.at(id);
    std::optional<std::uint32_t> crc = checksums_.take(op.checksum);
    if (!crc && block && !released) crc = checksums_.wait(op.checksum);
    if (!crc) break;
    op.checksum = 0;
    op.header_held = false;
    held_headers_.erase(held_headers_.begin());
    write_header(buffers_[static_cast<std::size_t>(op.buffer)].data(), op, *crc);
    queued_.push_front(op.header);
    released = true;
  }
  return released;
}

void NvmeSwapper::land(Op& op, const Piece& piece) {
  const std::int64_t base = record_offset(op.slot, op.copy);
  op.landed[static_cast<std::size_t>((piece.offset - base) / aio_.block_size)] = true;
  const auto blocks = static_cast<std::int64_t>(op.landed.size());
  const std::int64_t before = op.landed_prefix;
  while (op.landed_prefix < blocks && op.landed[static_cast<std::size_t>(op.landed_prefix)]) {
    ++op.landed_prefix;
  }
  if (op.landed_prefix == before) return;
  const std::int64_t landed_bytes =
      std::min(op.landed_prefix * aio_.block_size, record_bytes_) - kHeaderBytes;
  checksums_.extend(op.checksum, static_cast<std::size_t>(
                                     std::clamp<std::int64_t>(landed_bytes, 0, slot_bytes_)));
}

void NvmeSwapper::fill() {
  const auto submit_prepared = [this] {
    int idle = 0;
    while (prepared_ > 0) {
      const int n = ring_.submit();
      prepared_ -= static_cast<unsigned>(n);
      if (n > 0) {
        idle = 0;
      } else if (++idle > kMaxRetries) {
        throw IoError("swap file " + file_.path() +
                      ": io_uring_submit made no progress; the kernel is out of resources");
      } else {
        sched_yield();
      }
    }
  };
  // Without overlap_events, a new batch starts only once the previous one has fully completed.
  if (!aio_.overlap_events && free_entries_.size() < in_flight_.size()) return;
  while (!queued_.empty() && !free_entries_.empty()) {
    const Piece piece = queued_.front();
    queued_.pop_front();
    const unsigned entry = free_entries_.back();
    free_entries_.pop_back();
    in_flight_[entry] = piece;
    io_uring_sqe* sqe = ring_.next_sqe();
    const int fd = file_registered_ ? 0 : file_.fd();
    const auto offset = static_cast<std::uint64_t>(piece.offset);
    if (ops_.at(piece.op).kind == OpKind::kRead) {
      if (buffers_registered_) {
        io_uring_prep_read_fixed(sqe, fd, piece.data, piece.bytes, offset, piece.buffer);
      } else {
        io_uring_prep_read(sqe, fd, piece.data, piece.bytes, offset);
      }
    } else {
      if (buffers_registered_) {
        io_uring_prep_write_fixed(sqe, fd, piece.data, piece.bytes, offset, piece.buffer);
      } else {
        io_uring_prep_write(sqe, fd, piece.data, piece.bytes, offset);
      }
    }
    if (file_registered_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, entry);
    ++prepared_;
    if (aio_.single_submit) submit_prepared();
  }
  submit_prepared();
}

int NvmeSwapper::apply_fault(int result, std::uint32_t bytes) noexcept {
  if (fault_.kind == IoFaultKind::kNone) return result;
  const std::int64_t n = ++completions_since_fault_;
  if (n < fault_.at_completion || n >= fault_.at_completion + fault_.count) return result;
  switch (fault_.kind) {
    case IoFaultKind::kEio:
      return -EIO;
    case IoFaultKind::kEagain:
      return -EAGAIN;
    case IoFaultKind::kShortTransfer: {
      const auto half = static_cast<int>((bytes / 2) & ~(kDirectIoAlignment - 1));
      return result > 0 && half > 0 ? std::min(result, half) : result;
    }
    case IoFaultKind::kNone:
      break;
  }
  return result;
}

void NvmeSwapper::reap(bool block) {
  const auto in_flight = static_cast<unsigned>(in_flight_.size() - free_entries_.size());
  if (in_flight > 0) {
    const unsigned want = !block ? 0u : aio_.overlap_events ? 1u : in_flight;
    const int n = ring_.wait(want, completions_);
    for (int i = 0; i < n; ++i) {
      const auto entry = static_cast<unsigned>(completions_[i].user_data);
      const Piece piece = in_flight_[entry];
      free_entries_.push_back(entry);
      complete_piece(piece, apply_fault(completions_[i].result, piece.bytes));
    }
  }
  release_headers(false);
  fill();
}

void NvmeSwapper::complete_piece(const Piece& piece, int result) {
  const auto it = ops_.find(piece.op);
  if (it == ops_.end()) return;
  Op& op = it->second;
  --op.outstanding;
  if (!op.error.empty()) {
    finish_if_done(piece.op, op);  // the op already failed: only drain its requests
    return;
  }
  const char* verb = op.kind == OpKind::kRead ? "read" : "write";
  if (result == -EAGAIN || result == -EINTR) {
    if (piece.retries >= kMaxRetries) {
      fail(piece.op, op,
           describe(op, piece.offset) + ": " + std::to_string(kMaxRetries) + " retries of a " +
               std::to_string(piece.bytes) + "-byte " + verb +
               " all got EAGAIN; the device is overloaded: lower aio.queue_depth");
      return;
    }
    Piece again = piece;
    ++again.retries;
    queued_.push_front(again);
    ++op.outstanding;
    ++resubmissions_;
    return;
  }
  if (result < 0) {
    fail(piece.op, op,
         describe(op, piece.offset) + ": " + verb + " of " + std::to_string(piece.bytes) +
             " bytes failed: " + std::strerror(-result) + " (errno " + std::to_string(-result) +
             "); " + advice(-result));
    return;
  }
  if (result == 0) {
    fail(piece.op, op,
         describe(op, piece.offset) + ": " + verb + " of " + std::to_string(piece.bytes) +
             " bytes transferred nothing" +
             (op.kind == OpKind::kRead
                  ? ": the file ends early (truncated?); restart from a checkpoint"
                  : ": a short write that cannot complete; check free space on the drive"));
    return;
  }
  if (static_cast<std::uint32_t>(result) < piece.bytes) {
    // A short transfer: the rest goes back to the head of the queue.
    Piece rest = piece;
    rest.offset += result;
    rest.data += result;
    rest.bytes -= static_cast<std::uint32_t>(result);
    queued_.push_front(rest);
    ++op.outstanding;
    ++resubmissions_;
    return;
  }
  if (op.kind == OpKind::kRead) land(op, piece);
  finish_if_done(piece.op, op);
}

void NvmeSwapper::fail(std::uint64_t op_id, Op& op, std::string message) {
  op.error = std::move(message);
  const auto before = queued_.size();
  std::erase_if(queued_, [op_id](const Piece& p) { return p.op == op_id; });
  op.outstanding -= static_cast<std::int64_t>(before - queued_.size());
  if (op.header_held) {
    // The header of a failed write is never written: the record stays unreadable.
    op.header_held = false;
    --op.outstanding;
    std::erase(held_headers_, op_id);
  }
  if (op.checksum != 0) {
    checksums_.drop(op.checksum);
    op.checksum = 0;
  }
  finish_if_done(op_id, op);
}

void NvmeSwapper::finish_if_done(std::uint64_t /*op_id*/, Op& op) {
  if (op.outstanding > 0 || op.done) return;
  op.done = true;
  SlotState& state = slots_[static_cast<std::size_t>(op.slot)];
  state.busy = false;
  // The flip: only a write whose every byte reached the file makes its copy current.
  if (op.kind == OpKind::kWrite && op.error.empty()) {
    state.current = op.copy;
    state.generation = op.generation;
  }
}

void NvmeSwapper::poll() { reap(false); }

bool NvmeSwapper::done(SwapTicket ticket) const {
  const auto it = ops_.find(ticket.id);
  if (it == ops_.end()) {
    throw UsageError("NVMe swapper " + file_.path() + ": ticket " + std::to_string(ticket.id) +
                     " is unknown or was already waited for");
  }
  return it->second.done;
}

void NvmeSwapper::wait(SwapTicket ticket) {
  auto it = ops_.find(ticket.id);
  if (it == ops_.end()) {
    throw UsageError("NVMe swapper " + file_.path() + ": ticket " + std::to_string(ticket.id) +
                     " is unknown or was already waited for");
  }
  while (!it->second.done) {
    if (free_entries_.size() == in_flight_.size() && queued_.empty()) {
      // Nothing in flight: what is left is a header waiting for its checksum.
      if (!release_headers(true)) {
        throw IoError("swap file " + file_.path() + ": request " + std::to_string(ticket.id) +
                      " has nothing in flight but is not done (internal error)");
      }
      fill();
    } else {
      reap(true);
    }
    it = ops_.find(ticket.id);
  }
  std::uint32_t payload_crc = 0;
  if (it->second.kind == OpKind::kRead && it->second.error.empty()) {
    payload_crc = read_checksum(it->second);
    it = ops_.find(ticket.id);
  }
  Op op = std::move(it->second);
  ops_.erase(it);
  buffer_busy_[static_cast<std::size_t>(op.buffer)] = false;
  if (op.checksum != 0) checksums_.drop(op.checksum);
  if (!op.error.empty()) throw IoError(op.error);
  if (op.kind == OpKind::kRead) verify_read(op, payload_crc);
}

std::uint32_t NvmeSwapper::read_checksum(Op& op) {
  const std::uint64_t job = op.checksum;
  try {
    for (;;) {
      if (const std::optional<std::uint32_t> crc = checksums_.take(job)) {
        op.checksum = 0;
        return *crc;
      }
      // Keep others' requests flowing while the last blocks are checked; with none in flight
      // (or none but held headers) sleep on the checksum itself.
      if (free_entries_.size() == in_flight_.size() && queued_.empty()) {
        const std::uint32_t crc = checksums_.wait(job);
        op.checksum = 0;
        return crc;
      }
      reap(true);
    }
  } catch (...) {
    if (op.checksum != 0) checksums_.drop(job);
    op.checksum = 0;
    throw;
  }
}

void NvmeSwapper::wait_all() {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, op] : ops_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::exception_ptr first;
  for (const std::uint64_t id : ids) {
    try {
      wait(SwapTicket{id});
    } catch (const IoError&) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void NvmeSwapper::write_header(std::byte* record, const Op& op, std::uint32_t payload_crc) const {
  RecordHeader header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kFormatVersion;
  header.header_bytes = static_cast<std::uint32_t>(kHeaderBytes);
  header.slot = static_cast<std::uint64_t>(op.slot);
  header.copy = static_cast<std::uint64_t>(op.copy);
  header.generation = op.generation;
  header.payload_bytes = static_cast<std::uint64_t>(slot_bytes_);
  header.run_id = run_id_;
  header.rank = static_cast<std::uint32_t>(rank_);
  header.payload_crc = payload_crc;
  std::memcpy(header.kind, kind_.data(), kind_.size());
  header.header_crc = header_crc(header);
  std::memset(record, 0, static_cast<std::size_t>(kHeaderBytes));
  std::memcpy(record, &header, sizeof header);
}

void NvmeSwapper::verify_read(const Op& op, std::uint32_t payload_crc) {
  const std::byte* record = buffers_[static_cast<std::size_t>(op.buffer)].data();
  RecordHeader header;
  std::memcpy(&header, record, sizeof header);
  const std::int64_t offset = record_offset(op.slot, op.copy);
  const std::string where = describe(op, offset);
  const std::string remedy =
      "; the record is corrupt (a drive error or a modified file): restart "
      "from a checkpoint";
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0) {
    throw IoError(where + ": no swap record header (bad magic)" + remedy);
  }
  const std::uint32_t computed_header = header_crc(header);
  if (computed_header != header.header_crc) {
    throw IoError(where + ": header checksum mismatch (stored " + hex(header.header_crc) +
                  ", computed " + hex(computed_header) + ")" + remedy);
  }
  if (header.version != kFormatVersion) {
    throw IoError(where + ": swap record format version " + std::to_string(header.version) +
                  ", expected " + std::to_string(kFormatVersion) +
                  " (a file another zeroshard wrote)" + remedy);
  }
  const std::string_view kind(header.kind, strnlen(header.kind, kKindBytes));
  const bool other_rank = header.rank != static_cast<std::uint32_t>(rank_);
  const bool other_kind = kind != kind_;
  if (other_rank || other_kind || header.run_id != run_id_) {
    const std::string whose = other_rank   ? "another rank's swap file"
                              : other_kind ? "another kind's swap file"
                                           : "a swap file of another run";
    throw IoError(where + ": the record holds " + owner_text(header.rank, kind, header.run_id) +
                  ", expected " + owner_text(static_cast<std::uint64_t>(rank_), kind_, run_id_) +
                  " (this run): " + whose +
                  " was copied over this one, and nothing of it is used: leave the swap files "
                  "alone while a run uses them, and restart from a checkpoint");
  }
  if (header.slot != static_cast<std::uint64_t>(op.slot) ||
      header.copy != static_cast<std::uint64_t>(op.copy) || header.generation != op.generation ||
      header.payload_bytes != static_cast<std::uint64_t>(slot_bytes_)) {
    throw IoError(where + ": header names slot " + std::to_string(header.slot) + ", copy " +
                  std::to_string(header.copy) + ", generation " +
                  std::to_string(header.generation) + ", " + std::to_string(header.payload_bytes) +
                  " bytes; expected " + std::to_string(slot_bytes_) +
                  " bytes (a stale or foreign record)" + remedy);
  }
  const std::uint32_t computed = payload_crc;
  if (computed != header.payload_crc) {
    throw IoError(where + ": payload checksum mismatch (stored " + hex(header.payload_crc) +
                  ", computed " + hex(computed) + ")" + remedy);
  }
}

}  // namespace zeroshard::detail
