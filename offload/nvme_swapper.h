// The NVMe swapper: fixed-size records ("slots", one per sub-group) in one O_DIRECT swap file,
// read and written through io_uring from a pool of registered, page-aligned buffers, each record
// carrying a generation and a CRC32C so that nothing wrong is ever taken for good data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/memory_tracker.h"
#include "offload/checksum_thread.h"
#include "offload/io_fault.h"
#include "offload/io_uring_ring.h"
#include "offload/pinned_buffer.h"
#include "offload/swap_file.h"
#include "zeroshard/config.h"  // AioConfig

namespace zeroshard::detail {

/// What a swapper holds and how it does I/O.
struct NvmeSwapperOptions {
  std::string directory;  ///< nvme_path; must exist
  int rank = 0;
  std::string kind = "optimizer";  ///< names the file; lower-case letters, digits, '_'
  /// Names the run in every record, the same on every rank of it: a record of another run (a file
  /// left over or put back) is refused as one of another rank or kind is.
  std::uint64_t run_id = 0;
  std::int64_t slot_count = 1;
  std::int64_t slot_bytes = 0;  ///< payload bytes of every slot (any size)
  int buffer_count = 4;
  AioConfig aio{};
  /// A kernel thread polls the submission queue (see RingOptions); off by default, as it spends
  /// a CPU while the swapper is busy.
  RingOptions ring{};
  /// When set, the pinned buffers are charged as host bytes of `category` and the file as NVMe
  /// bytes of it, for as long as the swapper lives.
  MemoryTracker* tracker = nullptr;
  MemoryCategory category = MemoryCategory::kOptimizerStates;
};

/// Bytes of one record on disk and of one buffer in host memory: a page of header and the payload
/// rounded up to whole pages. A swap file holds two records per slot.
std::int64_t swap_record_bytes(std::int64_t slot_bytes);

/// Names one read or write until it is waited for.
struct SwapTicket {
  std::uint64_t id = 0;
};

/// On disk, slot s has two records, copies A and B at offsets (2s + copy) * record_bytes(): a
/// 4 KiB header (magic, slot, copy, generation, payload size, the writer's rank, kind and run id,
/// CRC32C of the payload and of the header) and the payload padded to 4 KiB. A write goes to the
/// copy that is not current and becomes current only once all its bytes are written, so a failed
/// write leaves the previous generation readable; a read checks the header and the checksum
/// against this swapper's rank, kind and run and the generation it expects. Errors are IoError
/// (naming file, offset, operation, what to do) raised by wait(); the slot's table entry is then
/// unchanged and the swapper stays usable.
///
/// Requests are split into aio.block_size pieces; an op is cut into aio.intra_op_parallelism
/// contiguous stripes whose pieces are interleaved, as DeepSpeed's I/O threads each take one;
/// at most aio.queue_depth * aio.intra_op_parallelism pieces are in flight (DeepSpeed: that many
/// per thread). aio.single_submit submits each piece alone rather than in batches;
/// aio.overlap_events refills the queue as each completion arrives rather than after all in
/// flight have completed. Checksums are computed on a thread of the swapper's own: a write's
/// while its payload is in flight (the piece with the header goes once it is done), a read's as
/// its blocks land. Not thread-safe: I/O advances inside write(), read(), poll() and wait(), so
/// one thread drives it (SwappedArrays runs a pass's I/O on a thread of its own, woken through
/// notify_completions(), which also signals when a write's checksum is done).
class NvmeSwapper {
 public:
  /// Creates (or reuses and resizes) the swap file and the buffers. Throws ConfigError for a bad
  /// option (naming the aio key), IoError when the file cannot be made (see SwapFile).
  explicit NvmeSwapper(const NvmeSwapperOptions& options);
  NvmeSwapper(const NvmeSwapper&) = delete;
  NvmeSwapper& operator=(const NvmeSwapper&) = delete;
  /// Waits for every request in flight; never throws.
  ~NvmeSwapper();

  /// The payload of buffer `index`: slot_bytes bytes, page-aligned, owned by the swapper.
  std::span<std::byte> buffer(int index);
  int buffer_count() const noexcept { return static_cast<int>(buffers_.size()); }

  /// Starts writing buffer `buffer`'s payload as the next generation of `slot`. The buffer and
  /// the slot must have no request in flight (UsageError otherwise) and the buffer must not be
  /// changed until the ticket is waited for.
  SwapTicket write(std::int64_t slot, int buffer);
  /// Starts reading the current generation of `slot` into buffer `buffer`. UsageError when the
  /// slot was never written or the slot or the buffer is busy.
  SwapTicket read(std::int64_t slot, int buffer);
  /// Blocks until the request is done; throws IoError if it failed (a read: also when its
  /// record's header or checksum is wrong). Each ticket is waited for once.
  void wait(SwapTicket ticket);
  /// Advances I/O without blocking: reaps what has completed and refills the queue.
  void poll();
  /// True when wait(ticket) will not block for I/O (it may still check a read's checksum).
  bool done(SwapTicket ticket) const;
  /// From now on, every completion of this swapper's requests signals `eventfd`, so that a thread
  /// driving several swappers can sleep until any of them has something to reap.
  void notify_completions(int eventfd) {
    ring_.register_eventfd(eventfd);
    checksums_.notify(eventfd);
  }
  /// Waits for every request; throws the first error after all have finished.
  void wait_all();

  /// 0 when the slot was never written; then 1, 2, ... per completed write.
  std::uint64_t generation(std::int64_t slot) const;
  const std::string& path() const noexcept { return file_.path(); }
  std::int64_t slot_count() const noexcept { return slot_count_; }
  std::int64_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Header plus padded payload: the bytes one request moves.
  std::int64_t record_bytes() const noexcept { return record_bytes_; }
  /// The file's size: 2 * slot_count * record_bytes.
  std::int64_t disk_bytes() const noexcept { return file_.bytes(); }
  /// Pinned host bytes of all buffers.
  std::int64_t buffer_bytes() const noexcept;
  bool buffers_registered() const noexcept { return buffers_registered_; }
  bool file_registered() const noexcept { return file_registered_; }
  bool sq_polling() const noexcept { return ring_.sq_polling(); }
  /// Byte offset of a slot's copy (0 or 1) in the file.
  std::int64_t record_offset(std::int64_t slot, int copy) const noexcept;
  /// Which copy of `slot` is current: 0 or 1, -1 when never written.
  int current_copy(std::int64_t slot) const;

  /// Every slot's current copy and generation, to go back to with restore().
  struct Snapshot {
    std::vector<int> current;
    std::vector<std::uint64_t> generation;
  };
  Snapshot snapshot() const;
  /// Makes the copies that were current at snapshot() current again. Writes go to the copy that
  /// is not current, so this undoes a pass that wrote each slot at most once since the snapshot:
  /// the previous records are still on disk. UsageError while a request is in flight.
  void restore(const Snapshot& snapshot);

  /// Pieces sent again after a short transfer or EAGAIN, since construction.
  std::int64_t resubmissions() const noexcept { return resubmissions_; }

  /// Tests only (see io_fault.h): the numbering of completions restarts now.
  void inject_fault(const IoFault& fault) noexcept;

 private:
  enum class OpKind { kRead, kWrite };
  struct Piece {
    std::uint64_t op = 0;
    std::int64_t offset = 0;  // in the file
    std::byte* data = nullptr;
    std::uint32_t bytes = 0;
    int buffer = 0;
    int retries = 0;
  };
  struct Op {
    OpKind kind = OpKind::kRead;
    std::int64_t slot = 0;
    int copy = 0;
    int buffer = 0;
    std::uint64_t generation = 0;
    std::int64_t outstanding = 0;  // pieces held, queued or in flight
    bool done = false;
    std::string error;           // empty when it succeeded
    std::uint64_t checksum = 0;  // the payload's job on checksums_; 0 once taken or dropped
    bool header_held = false;    // a write's first piece, sent once the checksum is in it
    Piece header;
    std::vector<bool> landed;        // a read's blocks that arrived in full
    std::int64_t landed_prefix = 0;  // blocks 0..landed_prefix-1 all arrived
  };
  struct SlotState {
    int current = -1;
    std::uint64_t generation = 0;
    bool busy = false;
  };

  SwapTicket start(OpKind kind, std::int64_t slot, int buffer);
  void fill();
  void reap(bool block);
  void complete_piece(const Piece& piece, int result);
  void fail(std::uint64_t op_id, Op& op, std::string message);
  void finish_if_done(std::uint64_t op_id, Op& op);
  std::string describe(const Op& op, std::int64_t offset) const;
  /// Fills the first page of `record` with the header of `op`'s write.
  void write_header(std::byte* record, const Op& op, std::uint32_t payload_crc) const;
  /// Sends the first piece of every write whose checksum is done; with `block`, waits for the
  /// oldest one's checksum first. Returns whether any was sent.
  bool release_headers(bool block);
  /// A read's piece arrived in full: the checksum thread may read the landed prefix.
  void land(Op& op, const Piece& piece);
  /// The payload checksum of a read whose I/O is done, reaping others' completions meanwhile.
  std::uint32_t read_checksum(Op& op);
  void verify_read(const Op& op, std::uint32_t payload_crc);
  int apply_fault(int result, std::uint32_t bytes) noexcept;
  void check_slot(std::int64_t slot) const;
  void check_buffer(int buffer) const;

  int rank_;
  std::string kind_;
  std::uint64_t run_id_;
  std::int64_t slot_count_;
  std::int64_t slot_bytes_;
  std::int64_t record_bytes_;
  AioConfig aio_;
  MemoryTracker* tracker_;
  MemoryCategory category_;
  SwapFile file_;
  std::vector<PinnedBuffer> buffers_;
  std::vector<bool> buffer_busy_;
  IoUringRing ring_;  // after the buffers: torn down first
  bool buffers_registered_ = false;
  bool file_registered_ = false;
  std::vector<SlotState> slots_;
  std::unordered_map<std::uint64_t, Op> ops_;
  std::uint64_t next_op_ = 1;
  std::deque<Piece> queued_;
  std::vector<Piece> in_flight_;  // indexed by the request's user_data
  std::vector<unsigned> free_entries_;
  unsigned prepared_ = 0;  // prepared but not yet accepted by io_uring_submit
  std::vector<RingCompletion> completions_;
  std::vector<std::uint64_t> held_headers_;  // writes waiting for their checksum, oldest first
  ChecksumThread checksums_;  // after the buffers and the ring: stops reading buffers first
  IoFault fault_{};
  std::int64_t completions_since_fault_ = 0;
  std::int64_t resubmissions_ = 0;
};

}  // namespace zeroshard::detail
