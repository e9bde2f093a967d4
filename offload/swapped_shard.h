// A shard of model-precision elements kept in an NVMe swap file and reached through a cache of
// buffer_count tiles: the stage-3 parameter shard under offload_param.device nvme. Reads are
// started ahead of use (read_ahead) along the order the caller expects; a tile written is kept
// in the cache and written back when its buffer is needed or at flush().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "offload/nvme_swapper.h"

namespace zeroshard::detail {

struct SwappedShardOptions {
  std::string directory;  ///< nvme_path
  int rank = 0;
  std::string kind;          ///< names the file (see swap_file_path)
  std::uint64_t run_id = 0;  ///< see NvmeSwapperOptions::run_id
  AioConfig aio{};
  std::int64_t elements = 0;
  std::size_t element_bytes = 2;
  std::int64_t tile = 0;  ///< elements per slot and per buffer (offload_param.buffer_size)
  int buffer_count = 5;
  MemoryTracker* tracker = nullptr;
  MemoryCategory category = MemoryCategory::kParameters;
};

class SwappedShard {
 public:
  /// Creates the swap file and the buffers; throws IoError (naming the file) when it cannot.
  explicit SwappedShard(const SwappedShardOptions& options);

  std::int64_t tile_elements() const noexcept { return tile_; }
  /// Elements the buffers hold at once.
  std::int64_t capacity_elements() const noexcept {
    return tile_ * static_cast<std::int64_t>(buffers_.size());
  }

  /// Calls use(pointer into a cached tile, elements done before, elements of the part) for each
  /// part of [offset, offset + count), bringing tiles in as needed. With `will_write` the parts
  /// are to be changed and their tiles are written back later. Pointers are valid until the next
  /// call on this object.
  template <class Use>
  void for_each_part(std::int64_t offset, std::int64_t count, bool will_write, Use use) {
    for (std::int64_t done = 0; done < count;) {
      const std::int64_t tile = (offset + done) / tile_;
      const std::int64_t n = std::min(count - done, tile_end(tile) - (offset + done));
      const bool whole = will_write && n == tile_end(tile) - tile * tile_;
      std::byte* base = tile_data(acquire(tile, will_write, whole));
      use(base + (offset + done - tile * tile_) * static_cast<std::int64_t>(element_bytes_), done,
          n);
      done += n;
    }
  }

  /// Starts reading the tiles of [offset, offset + count) that are not cached, into buffers that
  /// are free or hold a clean tile not itself read ahead. Returns false when it stopped because
  /// no such buffer was left.
  bool read_ahead(std::int64_t offset, std::int64_t count);
  /// Advances the I/O in flight without blocking.
  void poll();
  /// Writes every changed tile back and waits; IoError when one failed (that tile stays changed
  /// in the cache, so nothing is lost, and a later flush() tries again).
  void flush();
  /// Writes the cache back and remembers the current records, for roll_back().
  void begin_update();
  /// flush(), then the update is done and cannot be rolled back any more.
  void end_update();
  /// After begin_update() succeeded and until end_update() does: forgets every cached tile and
  /// makes the records current at begin_update() current again. Valid while no slot was written
  /// twice since (an update writes its range in one ascending walk, so each tile at most once).
  /// Otherwise it does nothing, so that a failed begin_update() keeps the changed tiles.
  void roll_back() noexcept;

  /// Tests only.
  void inject_fault(const IoFault& fault) noexcept { swapper_.inject_fault(fault); }

 private:
  enum class State { kFree, kReading, kClean, kDirty, kWriting };
  struct Buffer {
    State state = State::kFree;
    std::int64_t tile = -1;
    SwapTicket ticket{};
    std::uint64_t last_use = 0;
    bool ahead = false;  ///< read ahead and not yet used
  };

  std::int64_t tile_end(std::int64_t tile) const noexcept;
  std::byte* tile_data(int buffer);
  /// The buffer holding `tile`, read in (or zero-filled when never written) if it was not;
  /// not read when the caller overwrites it whole.
  int acquire(std::int64_t tile, bool will_write, bool overwritten_whole);
  int find(std::int64_t tile) const noexcept;
  /// A buffer to put a new tile in: free first, then the least recently used clean tile (not
  /// read ahead), then a changed one written back, then one read ahead; -1 when `may_wait` is
  /// false and only the last two are left.
  int take_buffer(bool may_wait);
  void start_read(int buffer, std::int64_t tile);
  void wait(int buffer);
  void start_write(int buffer);

  std::int64_t elements_;
  std::size_t element_bytes_;
  std::int64_t tile_;
  NvmeSwapper swapper_;
  std::vector<Buffer> buffers_;
  std::uint64_t clock_ = 0;
  NvmeSwapper::Snapshot before_update_;
  bool updating_ = false;
};

}  // namespace zeroshard::detail
