// Float arrays over one element range kept in NVMe swap files, one tile (sub-group) per slot:
// the optimizer shard's fp32 master weights and rule states under offload_optimizer.device nvme.
// A pass walks the tiles in order through a ring of buffer_count buffers, reading ahead and
// writing behind as pipeline_read and pipeline_write allow, so host memory holds buffer_count
// tiles whatever the range's size; outside a pass, element access goes through a one-tile cache.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nvme_swapper.h"

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
  std::int64_t elements = 0;  ///< per array
  std::int64_t tile = 0;      ///< elements per slot (sub_group_size)
  std::vector<SwappedArrayFile> files;
  MemoryTracker* tracker = nullptr;
};

/// Where a pass's time went: waiting for reads and for writes (what the update did not hide).
struct SwapTimes {
  double read_wait = 0.0;  ///< includes checking each record's checksum
  double update = 0.0;     ///< from acquire() returning to release(): the caller's work on tiles
  double write_wait = 0.0;
  double write_start = 0.0;  ///< starting writes: mostly each record's checksum
  std::int64_t bytes_read = 0;
  std::int64_t bytes_written = 0;
};

class SwappedArrays {
 public:
  /// Creates the swap files; throws IoError (naming the file) when one cannot be made.
  explicit SwappedArrays(const SwappedArraysOptions& options);

  std::int64_t tile_count() const noexcept { return tile_count_; }
  std::int64_t tile_begin(std::int64_t tile) const noexcept { return tile * tile_; }
  std::int64_t tile_end(std::int64_t tile) const noexcept;

  /// Writes every tile that has no record yet (as zeros), so that all records exist and a full
  /// or failing drive shows now rather than at the first step (offload_optimizer.fast_init off).
  void write_missing_tiles();

  /// Starts a pass over tiles 0, 1, ...: writes the cache back and remembers which records are
  /// current, for roll_back_pass().
  void begin_pass();
  /// Waits for tile `tile` (the pass's next) and returns each array's pointer to its first
  /// element, valid until release(). A tile never written reads as zeros.
  std::span<float* const> acquire(std::int64_t tile);
  /// Advances the I/O in flight; call it between chunks of a long computation.
  void poll();
  /// The acquired tile was updated: writes it back.
  void release(std::int64_t tile);
  /// Waits for every write of the pass; IoError when one failed.
  void end_pass();
  /// Undoes the last pass, on success or after an error: waits for what is in flight (its errors
  /// are dropped) and makes the records current before begin_pass() current again.
  void roll_back_pass() noexcept;

  /// Outside a pass: elements [offset, offset + count) of `array`, through the one-tile cache.
  void read(int array, std::int64_t offset, float* out, std::int64_t count);
  void write(int array, std::int64_t offset, const float* values, std::int64_t count);
  /// Writes the cached tile back if it was changed.
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
  int buffer_of(std::int64_t tile) const noexcept { return static_cast<int>(tile % buffer_count_); }
  void start_read(std::int64_t tile);
  void wait_read(std::int64_t tile);
  /// Waits for each file's ticket (id 0: none), adding the time to `waited` and the records
  /// moved to `bytes`; rethrows the first failure once all are done, and clears `tickets`.
  void wait_tickets(std::vector<SwapTicket>& tickets, double& waited, std::int64_t& bytes);
  /// Outside a pass: brings each tile of `array`'s elements [offset, offset + count) into the
  /// cache and calls copy_part(pointer into the tile, elements done before, bytes of the part).
  template <class CopyPart>
  void for_each_cached_part(int array, std::int64_t offset, std::int64_t count, CopyPart copy_part);
  void start_write(std::int64_t tile);
  void wait_write(PendingWrite& write);
  /// Waits for the write that last used `buffer`, if it is still in flight.
  void free_buffer(int buffer);
  float* array_tile(int array, int buffer);
  void load_cache(std::int64_t tile);

  std::int64_t elements_;
  std::int64_t tile_;
  std::int64_t tile_count_;
  int array_count_ = 0;
  int buffer_count_;
  bool pipeline_read_;
  bool pipeline_write_;
  std::vector<File> files_;
  std::vector<float*> pointers_;
  SwapTimes times_{};
  std::chrono::steady_clock::time_point acquired_at_{};

  // The pass.
  std::vector<NvmeSwapper::Snapshot> before_pass_;
  std::int64_t next_read_ = 0;
  std::vector<std::vector<SwapTicket>> reads_;  ///< by buffer: the read in flight into it
  std::vector<std::int64_t> read_tile_;         ///< by buffer: its tile, -1 when none
  std::vector<PendingWrite> writes_;            ///< by buffer

  // The cache (buffer 0, outside passes).
  std::int64_t cached_tile_ = -1;
  bool cache_dirty_ = false;
};

}  // namespace zeroshard::detail
