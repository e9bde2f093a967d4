// SwappedArrays: the tile ring of a pass (reads ahead, writes behind, on the pass's I/O thread,
// in alternating directions), its roll-back through the swappers' A/B records, and the buffers as
// a cache for element access between passes.
#include "offload/swapped_arrays.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

// A record never written reads as zeros.
void zero_payload(NvmeSwapper& swapper, int buffer) {
  const std::span<std::byte> payload = swapper.buffer(buffer);
  std::memset(payload.data(), 0, payload.size());
}

double seconds_between(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

SwappedArrays::SwappedArrays(const SwappedArraysOptions& options)
    : elements_(options.elements),
      tile_(std::max<std::int64_t>(1, std::min(options.tile, options.elements))),
      tile_count_(std::max<std::int64_t>(1, (options.elements + tile_ - 1) / tile_)),
      buffer_count_(std::max(1, options.buffer_count)),
      pipeline_read_(options.pipeline_read),
      pipeline_write_(options.pipeline_write),
      alternate_(options.alternate) {
  for (const SwappedArrayFile& spec : options.files) {
    NvmeSwapperOptions swapper;
    swapper.directory = options.directory;
    swapper.rank = options.rank;
    swapper.kind = spec.kind;
    swapper.run_id = options.run_id;
    swapper.slot_count = tile_count_;
    swapper.slot_bytes = spec.arrays * tile_ * static_cast<std::int64_t>(sizeof(float));
    swapper.buffer_count = buffer_count_;
    swapper.aio = options.aio;
    swapper.tracker = options.tracker;
    swapper.category = spec.category;
    files_.push_back({std::make_unique<NvmeSwapper>(swapper), array_count_, spec.arrays});
    files_.back().swapper->notify_completions(wake_.fd());
    array_count_ += spec.arrays;
  }
  pointers_.resize(static_cast<std::size_t>(array_count_));
  held_.assign(static_cast<std::size_t>(buffer_count_), -1);
  reads_.resize(static_cast<std::size_t>(buffer_count_));
  writes_.resize(static_cast<std::size_t>(buffer_count_));
}

SwappedArrays::~SwappedArrays() { stop_pass(); }

std::int64_t SwappedArrays::tile_end(std::int64_t tile) const noexcept {
  return std::min(elements_, (tile + 1) * tile_);
}

float* SwappedArrays::array_tile(int array, int buffer) {
  for (File& file : files_) {
    if (array < file.first_array + file.arrays) {
      std::byte* payload = file.swapper->buffer(buffer).data();
      return reinterpret_cast<float*>(payload) + (array - file.first_array) * tile_;
    }
  }
  throw UsageError("swapped arrays: array " + std::to_string(array) + " out of range 0.." +
                   std::to_string(array_count_ - 1));
}

void SwappedArrays::wait_tickets(std::vector<SwapTicket>& tickets, std::int64_t& bytes) {
  // Every ticket is waited for even when one fails, so no request is left behind.
  std::exception_ptr failure;
  for (std::size_t f = 0; f < tickets.size(); ++f) {
    if (tickets[f].id == 0) continue;  // nothing was started for this file
    try {
      files_[f].swapper->wait(tickets[f]);
      bytes += files_[f].swapper->record_bytes();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  tickets.clear();
  if (failure) std::rethrow_exception(failure);
}

bool SwappedArrays::tickets_done(const std::vector<SwapTicket>& tickets) const {
  for (std::size_t f = 0; f < tickets.size(); ++f) {
    if (tickets[f].id != 0 && !files_[f].swapper->done(tickets[f])) return false;
  }
  return true;
}

void SwappedArrays::wait_write(PendingWrite& write) {
  if (write.tile < 0) return;
  write.tile = -1;
  wait_tickets(write.tickets, times_.bytes_written);
}

void SwappedArrays::free_buffer(int buffer) {
  wait_write(writes_[static_cast<std::size_t>(buffer)]);
}

void SwappedArrays::start_read(std::int64_t tile) {
  const int buffer = buffer_of(tile);
  free_buffer(buffer);
  auto& tickets = reads_[static_cast<std::size_t>(buffer)];
  tickets.assign(files_.size(), SwapTicket{});
  std::int64_t& held = held_[static_cast<std::size_t>(buffer)];
  // The buffer holds what the record holds: its checksum was checked when it was read, or it is
  // what was written. Nothing of the disk is taken without a check either way.
  if (held == tile) return;
  // Until the read has landed and been checked, the buffer holds no tile.
  held = -1;
  for (std::size_t f = 0; f < files_.size(); ++f) {
    NvmeSwapper& swapper = *files_[f].swapper;
    if (swapper.generation(tile) == 0) {
      zero_payload(swapper, buffer);
    } else {
      tickets[f] = swapper.read(tile, buffer);
    }
  }
}

void SwappedArrays::wait_read(std::int64_t tile) {
  wait_tickets(reads_[static_cast<std::size_t>(buffer_of(tile))], times_.bytes_read);
}

void SwappedArrays::start_write(std::int64_t tile) {
  const int buffer = buffer_of(tile);
  PendingWrite& write = writes_[static_cast<std::size_t>(buffer)];
  write.tile = tile;
  write.tickets.assign(files_.size(), SwapTicket{});
  for (std::size_t f = 0; f < files_.size(); ++f)
    write.tickets[f] = files_[f].swapper->write(tile, buffer);
}

void SwappedArrays::write_missing_tiles() {
  flush();
  std::fill(held_.begin(), held_.end(), -1);  // the zeros below overwrite the buffers
  for (std::int64_t tile = 0; tile < tile_count_; ++tile) {
    const int buffer = buffer_of(tile);
    free_buffer(buffer);
    PendingWrite& write = writes_[static_cast<std::size_t>(buffer)];
    write.tickets.assign(files_.size(), SwapTicket{});
    for (std::size_t f = 0; f < files_.size(); ++f) {
      NvmeSwapper& swapper = *files_[f].swapper;
      if (swapper.generation(tile) != 0) continue;
      zero_payload(swapper, buffer);
      write.tile = tile;
      write.tickets[f] = swapper.write(tile, buffer);
    }
  }
  for (PendingWrite& write : writes_) wait_write(write);
}

void SwappedArrays::begin_pass() {
  // Forgotten first: if writing the cache back fails, a roll-back must not return to the records
  // of an older pass.
  before_pass_.clear();
  flush();
  for (File& file : files_) before_pass_.push_back(file.swapper->snapshot());
  // The last pass left its last tiles in the buffers: this one visits them first.
  descending_ = alternate_ && !descending_;
  shared_ = PassShared{};
  io_thread_ = std::thread([this] { run_pass(); });
}

void SwappedArrays::run_pass() noexcept {
  // Positions below next_read have reads started, below read_done checked and handed over;
  // likewise for writes. Only this thread touches the swappers and held_ until the caller joins
  // it.
  std::int64_t next_read = 0;
  std::int64_t read_done = 0;
  std::int64_t next_write = 0;
  std::int64_t write_done = 0;
  try {
    for (;;) {
      PassShared asked;
      {
        std::lock_guard lock(mutex_);
        asked.requested = shared_.requested;
        asked.released = shared_.released;
        asked.closing = shared_.closing;
        asked.stop = shared_.stop;
      }
      if (asked.stop) return;
      bool progress = false;
      // Writes first: each frees a buffer for a read ahead.
      for (; next_write < asked.released; ++next_write, progress = true) {
        start_write(pass_tile(next_write));
      }
      // Position p's buffer held position p - buffer_count's tile, which must be written before
      // the buffer is reused.
      const std::int64_t readable =
          std::min({tile_count_, pipeline_read_ ? tile_count_ : asked.requested,
                    write_done + buffer_count_});
      for (; next_read < readable; ++next_read, progress = true) start_read(pass_tile(next_read));
      for (File& file : files_) file.swapper->poll();
      for (; write_done < next_write; ++write_done, progress = true) {
        PendingWrite& write = writes_[static_cast<std::size_t>(buffer_of(pass_tile(write_done)))];
        if (!tickets_done(write.tickets)) break;
        wait_write(write);
      }
      for (; read_done < next_read; ++read_done, progress = true) {
        const std::int64_t tile = pass_tile(read_done);
        if (!tickets_done(reads_[static_cast<std::size_t>(buffer_of(tile))])) break;
        wait_read(tile);  // checks each record's checksum
      }
      if (progress) {
        {
          std::lock_guard lock(mutex_);
          shared_.ready = read_done;
          shared_.written = write_done;
        }
        progress_.notify_all();
        continue;
      }
      if (asked.closing && write_done == asked.released && read_done == next_read) return;
      // Nothing to do until a request completes (every ring signals wake_) or the caller calls.
      wake_.wait();
    }
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      shared_.failure = std::current_exception();
    }
    progress_.notify_all();
  }
}

template <class Reached>
void SwappedArrays::wait_for_pass(Reached reached, double& waited) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  progress_.wait(lock, [&] { return reached() || shared_.failure; });
  waited += seconds_between(start);
  if (shared_.failure) std::rethrow_exception(shared_.failure);
}

std::span<float* const> SwappedArrays::acquire(std::int64_t tile) {
  if (!io_thread_.joinable() || tile >= tile_count_) {
    throw UsageError("swapped arrays: acquire(" + std::to_string(tile) +
                     ") outside a pass over tiles 0.." + std::to_string(tile_count_ - 1));
  }
  const std::int64_t position = pass_position(tile);
  {
    std::lock_guard lock(mutex_);
    shared_.requested = std::max(shared_.requested, position + 1);
  }
  wake_.signal();
  wait_for_pass([&] { return shared_.ready > position; }, times_.read_wait);
  const int buffer = buffer_of(tile);
  for (int a = 0; a < array_count_; ++a) {
    pointers_[static_cast<std::size_t>(a)] = array_tile(a, buffer);
  }
  acquired_at_ = std::chrono::steady_clock::now();
  return pointers_;
}

void SwappedArrays::release(std::int64_t tile) {
  times_.update += seconds_between(acquired_at_);
  const std::int64_t position = pass_position(tile);
  {
    std::lock_guard lock(mutex_);
    shared_.released = position + 1;
  }
  wake_.signal();
  if (!pipeline_write_) {
    wait_for_pass([&] { return shared_.written > position; }, times_.write_wait);
  }
}

void SwappedArrays::end_pass() {
  if (!io_thread_.joinable()) throw UsageError("swapped arrays: end_pass() outside a pass");
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    shared_.closing = true;
  }
  wake_.signal();
  io_thread_.join();
  times_.write_wait += seconds_between(start);
  if (shared_.failure) std::rethrow_exception(shared_.failure);
  // Every write went through: each buffer holds the last tile the pass put in it, as written.
  if (shared_.released < tile_count_) return;
  for (std::int64_t position = std::max<std::int64_t>(0, tile_count_ - buffer_count_);
       position < tile_count_; ++position) {
    const std::int64_t tile = pass_tile(position);
    held_[static_cast<std::size_t>(buffer_of(tile))] = tile;
  }
}

void SwappedArrays::stop_pass() noexcept {
  if (!io_thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    shared_.stop = true;
  }
  wake_.signal();
  io_thread_.join();
}

void SwappedArrays::roll_back_pass() noexcept {
  stop_pass();
  for (std::size_t f = 0; f < files_.size(); ++f) {
    NvmeSwapper& swapper = *files_[f].swapper;
    try {
      swapper.wait_all();
    } catch (...) {
      // The pass's error was already raised; what else failed is undone below all the same.
    }
    if (f < before_pass_.size()) swapper.restore(before_pass_[f]);
  }
  for (auto& tickets : reads_) tickets.clear();
  for (PendingWrite& write : writes_) write = PendingWrite{};
  // The pass changed the buffers; the records they came from are current again.
  std::fill(held_.begin(), held_.end(), -1);
  dirty_tile_ = -1;
}

void SwappedArrays::load_cache(std::int64_t tile) {
  if (dirty_tile_ != tile) flush();
  start_read(tile);  // nothing when the buffer holds the tile
  wait_read(tile);
  held_[static_cast<std::size_t>(buffer_of(tile))] = tile;
}

void SwappedArrays::flush() {
  if (dirty_tile_ < 0) return;
  const std::int64_t tile = std::exchange(dirty_tile_, -1);
  std::int64_t& held = held_[static_cast<std::size_t>(buffer_of(tile))];
  // A failed write leaves the buffer newer than the current record, which it then no longer is.
  held = -1;
  start_write(tile);
  wait_write(writes_[static_cast<std::size_t>(buffer_of(tile))]);
  held = tile;
}

template <class CopyPart>
void SwappedArrays::for_each_cached_part(int array, std::int64_t offset, std::int64_t count,
                                         bool changes, CopyPart copy_part) {
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t tile = (offset + done) / tile_;
    const std::int64_t n = std::min(count - done, tile_end(tile) - (offset + done));
    load_cache(tile);
    copy_part(array_tile(array, buffer_of(tile)) + (offset + done - tile_begin(tile)), done,
              static_cast<std::size_t>(n) * sizeof(float));
    if (changes) dirty_tile_ = tile;
    done += n;
  }
}

void SwappedArrays::read(int array, std::int64_t offset, float* out, std::int64_t count) {
  for_each_cached_part(array, offset, count, false,
                       [out](const float* in_tile, std::int64_t done, std::size_t bytes) {
                         std::memcpy(out + done, in_tile, bytes);
                       });
}

void SwappedArrays::write(int array, std::int64_t offset, const float* values, std::int64_t count) {
  for_each_cached_part(array, offset, count, true,
                       [values](float* in_tile, std::int64_t done, std::size_t bytes) {
                         std::memcpy(in_tile, values + done, bytes);
                       });
}

void SwappedArrays::inject_fault(int array, const IoFault& fault) {
  for (File& file : files_) {
    if (array < file.first_array + file.arrays) {
      file.swapper->inject_fault(fault);
      return;
    }
  }
  throw UsageError("swapped arrays: array " + std::to_string(array) + " out of range");
}

}  // namespace zeroshard::detail
