// Float arrays over one element range kept in NVMe swap files, one tile (sub-group) per slot:
// the optimizer shard's fp32 master weights and rule states under offload_optimizer.device nvme.
// A pass walks the tiles through a ring of buffer_count buffers, reading ahead and writing behind
// on an I/O thread of its own as pipeline_read and pipeline_write allow, so host memory holds
// buffer_count tiles whatever the range's size; passes alternate direction, so the tiles a pass
// leaves in the buffers are the next one's first and are not read again. Outside a pass, element
// access goes through those buffers as a cache.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "offload/event_fd.h"
#include "offload/nvme_swapper.h"

namespace zeroshard::detail {

/// Arrays that share one swap file: each slot holds `arrays` tiles of fp32, one per array.
struct SwappedArrayFile {
  std::string kind;  ///< names the file (see swap_file_path)
  int arrays = 1;
  MemoryCategory category = MemoryCategory::kOptimizerStates;
};

struct SwappedArraysOptions {
  std::string directory;  ///< nvme_path
  int rank = 0;
  std::uint64_t run_id = 0;  ///< see NvmeSwapperOptions::run_id
  AioConfig aio{};
  int buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  /// Passes alternate direction; otherwise every pass ascends.
  bool alternate = true;
  std::int64_t elements = 0;  ///< per array
  std::int64_t tile = 0;      ///< elements per slot (sub_group_size)
  std::vector<SwappedArrayFile> files;
  MemoryTracker* tracker = nullptr;
};

/// Where a pass's time went, as the caller saw it: the three parts add up to the time from
/// begin_pass() to end_pass() returning, less the caller's own work between tiles.
struct SwapTimes {
  double read_wait = 0.0;   ///< blocked in acquire(): reads (and their checksums) not hidden
  double update = 0.0;      ///< from acquire() returning to release(): the caller's work on tiles
  double write_wait = 0.0;  ///< blocked in release() and end_pass(): writes not hidden
  std::int64_t bytes_read = 0;
  std::int64_t bytes_written = 0;
};

/// Tile t always lives in buffer t % buffer_count. A pass visits every tile once, ascending or
/// descending (the opposite of the pass before, unless options.alternate is off), so a tile's
/// buffer held the tile buffer_count places before it in the pass. During a pass the swappers
/// belong to its I/O thread, which starts reads as buffers come free (once the tile before is
/// written), checks them, and writes each released tile, sleeping on one eventfd that every ring's
/// completions and every call of the caller signal; so the drive stays busy while the caller
/// computes, without polling. A tile whose buffer still holds its current record (written or read
/// by the pass before, or by the cache) is not read again. With pipeline_read off a tile's read
/// starts only when it is acquired; with pipeline_write off release() waits for the tile's write.
/// buffer_count 1 is the serial read, update, write.
class SwappedArrays {
 public:
  /// Creates the swap files; throws IoError (naming the file) when one cannot be made.
  explicit SwappedArrays(const SwappedArraysOptions& options);
  SwappedArrays(const SwappedArrays&) = delete;
  SwappedArrays& operator=(const SwappedArrays&) = delete;
  /// Stops a pass still running (as roll_back_pass() would, without restoring); never throws.
  ~SwappedArrays();

  std::int64_t tile_count() const noexcept { return tile_count_; }
  std::int64_t tile_begin(std::int64_t tile) const noexcept { return tile * tile_; }
  std::int64_t tile_end(std::int64_t tile) const noexcept;

  /// Writes every tile that has no record yet (as zeros), so that all records exist and a full
  /// or failing drive shows now rather than at the first step (offload_optimizer.fast_init off).
  void write_missing_tiles();

  /// Starts a pass over every tile, in the direction opposite to the last pass's (ascending when
  /// passes do not alternate): writes the cache back, remembers which records are current, for
  /// roll_back_pass(), and starts the pass's I/O thread.
  void begin_pass();
  /// The tile the pass visits at `position` (0 .. tile_count() - 1).
  std::int64_t pass_tile(std::int64_t position) const noexcept {
    return descending_ ? tile_count_ - 1 - position : position;
  }
  /// Waits for tile `tile` (the pass's next, pass_tile() of the next position) and returns each
  /// array's pointer to its first element, valid until release(). A tile never written reads as
  /// zeros. IoError as soon as any read or write of the pass failed.
  std::span<float* const> acquire(std::int64_t tile);
  /// The acquired tile was updated: writes it back.
  void release(std::int64_t tile);
  /// Waits for every write of the pass and ends its thread; IoError when one failed. The buffers
  /// then hold the pass's last buffer_count tiles as written, for the next pass.
  void end_pass();
  /// Undoes the last pass, on success or after an error: waits for what is in flight (its errors
  /// are dropped) and makes the records current before begin_pass() current again. The buffers
  /// then hold nothing.
  void roll_back_pass() noexcept;

  /// Outside a pass: elements [offset, offset + count) of `array`, through the buffers: a tile
  /// one of them holds is not read, a changed tile is written back before another is loaded.
  void read(int array, std::int64_t offset, float* out, std::int64_t count);
  void write(int array, std::int64_t offset, const float* values, std::int64_t count);
  /// Writes the changed tile back, if any.
  void flush();

  SwapTimes& times() noexcept { return times_; }

  /// Tests only: the fault applies to the swap file holding `array`.
  void inject_fault(int array, const IoFault& fault);

 private:
  struct File {
    std::unique_ptr<NvmeSwapper> swapper;
    int first_array = 0;
    int arrays = 1;
  };
  struct PendingWrite {
    std::int64_t tile = -1;
    std::vector<SwapTicket> tickets;  ///< one per file
  };
  /// What the caller and the pass's I/O thread tell each other, under mutex_.
  /// Counts are of the pass's positions (pass_tile()), not of tile numbers.
  struct PassShared {
    std::int64_t requested = 0;  ///< caller: positions below were acquired
    std::int64_t released = 0;   ///< caller: positions below were updated
    bool closing = false;        ///< caller: end_pass() was called
    bool stop = false;           ///< caller: start nothing more, leave the swappers
    std::int64_t ready = 0;      ///< I/O: positions below are read and checked
    std::int64_t written = 0;    ///< I/O: positions below are written
    std::exception_ptr failure;  ///< I/O: the first error; the thread then stops
  };
  int buffer_of(std::int64_t tile) const noexcept { return static_cast<int>(tile % buffer_count_); }
  /// Which position of the pass visits `tile` (either direction's order is its own inverse).
  std::int64_t pass_position(std::int64_t tile) const noexcept { return pass_tile(tile); }
  /// Reads `tile` into its buffer, unless the buffer holds it already.
  void start_read(std::int64_t tile);
  void wait_read(std::int64_t tile);
  /// Waits for each file's ticket (id 0: none), adding the records moved to `bytes`; rethrows
  /// the first failure once all are done, and clears `tickets`.
  void wait_tickets(std::vector<SwapTicket>& tickets, std::int64_t& bytes);
  /// True when every ticket's request has completed.
  bool tickets_done(const std::vector<SwapTicket>& tickets) const;
  /// Outside a pass: brings each tile of `array`'s elements [offset, offset + count) into the
  /// cache and calls copy_part(pointer into the tile, elements done before, bytes of the part);
  /// with `changes`, the tile is then to be written back.
  template <class CopyPart>
  void for_each_cached_part(int array, std::int64_t offset, std::int64_t count, bool changes,
                            CopyPart copy_part);
  void start_write(std::int64_t tile);
  void wait_write(PendingWrite& write);
  /// Waits for the write that last used `buffer`, if it is still in flight.
  void free_buffer(int buffer);
  float* array_tile(int array, int buffer);
  void load_cache(std::int64_t tile);
  /// The pass's I/O thread.
  void run_pass() noexcept;
  /// Blocks until `reached()` holds under the lock, adding the time to `waited`; rethrows the
  /// pass's failure.
  template <class Reached>
  void wait_for_pass(Reached reached, double& waited);
  /// Tells the I/O thread to stop and joins it, if it runs.
  void stop_pass() noexcept;

  std::int64_t elements_;
  std::int64_t tile_;
  std::int64_t tile_count_;
  int array_count_ = 0;
  int buffer_count_;
  bool pipeline_read_;
  bool pipeline_write_;
  bool alternate_;
  std::vector<File> files_;
  std::vector<float*> pointers_;
  SwapTimes times_{};
  /// By buffer: the tile whose current records (or, for the changed tile, newer values) it holds,
  /// -1 when none. Belongs to the pass's I/O thread while one runs.
  std::vector<std::int64_t> held_;
  bool descending_ = true;  ///< the last pass's direction; the first pass ascends

  // The pass.
  std::vector<NvmeSwapper::Snapshot> before_pass_;
  std::vector<std::vector<SwapTicket>> reads_;  ///< by buffer: the read in flight into it
  std::vector<PendingWrite> writes_;            ///< by buffer
  std::chrono::steady_clock::time_point acquired_at_{};
  std::mutex mutex_;
  std::condition_variable progress_;  ///< the caller waits on it for PassShared's I/O side
  PassShared shared_;
  EventFd wake_;  ///< the I/O thread sleeps on it
  std::thread io_thread_;

  /// Outside passes: the tile the cache changed and has not written back, -1 when none.
  std::int64_t dirty_tile_ = -1;
};

}  // namespace zeroshard::detail
