// SwappedArrays: the tile ring of a pass (reads ahead, writes behind), its roll-back through the
// swappers' A/B records, and the one-tile cache for element access between passes.
#include "swapped_arrays.h"

#include <algorithm>
#include <chrono>
#include <cstring>

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
      pipeline_write_(options.pipeline_write) {
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
    array_count_ += spec.arrays;
  }
  pointers_.resize(static_cast<std::size_t>(array_count_));
  reads_.resize(static_cast<std::size_t>(buffer_count_));
  read_tile_.assign(static_cast<std::size_t>(buffer_count_), -1);
  writes_.resize(static_cast<std::size_t>(buffer_count_));
}

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

void SwappedArrays::wait_tickets(std::vector<SwapTicket>& tickets, double& waited,
                                 std::int64_t& bytes) {
  const auto start = std::chrono::steady_clock::now();
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
  waited += seconds_between(start);
  if (failure) std::rethrow_exception(failure);
}

void SwappedArrays::wait_write(PendingWrite& write) {
  if (write.tile < 0) return;
  write.tile = -1;
  wait_tickets(write.tickets, times_.write_wait, times_.bytes_written);
}

void SwappedArrays::free_buffer(int buffer) {
  wait_write(writes_[static_cast<std::size_t>(buffer)]);
}

void SwappedArrays::start_read(std::int64_t tile) {
  const int buffer = buffer_of(tile);
  free_buffer(buffer);
  auto& tickets = reads_[static_cast<std::size_t>(buffer)];
  tickets.assign(files_.size(), SwapTicket{});
  for (std::size_t f = 0; f < files_.size(); ++f) {
    NvmeSwapper& swapper = *files_[f].swapper;
    if (swapper.generation(tile) == 0) {
      zero_payload(swapper, buffer);
    } else {
      tickets[f] = swapper.read(tile, buffer);
    }
  }
  read_tile_[static_cast<std::size_t>(buffer)] = tile;
}

void SwappedArrays::wait_read(std::int64_t tile) {
  const int buffer = buffer_of(tile);
  read_tile_[static_cast<std::size_t>(buffer)] = -1;
  wait_tickets(reads_[static_cast<std::size_t>(buffer)], times_.read_wait, times_.bytes_read);
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
  cached_tile_ = -1;
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
  cached_tile_ = -1;
  for (File& file : files_) before_pass_.push_back(file.swapper->snapshot());
  next_read_ = 0;
}

std::span<float* const> SwappedArrays::acquire(std::int64_t tile) {
  // With writes behind, the buffer of the write just started is not free for a read ahead.
  const std::int64_t ahead =
      pipeline_read_ ? std::max(0, buffer_count_ - (pipeline_write_ ? 2 : 1)) : 0;
  const std::int64_t last = std::min(tile_count_ - 1, tile + ahead);
  if (read_tile_[static_cast<std::size_t>(buffer_of(tile))] != tile) start_read(tile);
  next_read_ = std::max(next_read_, tile + 1);
  for (; next_read_ <= last; ++next_read_) start_read(next_read_);
  wait_read(tile);
  const int buffer = buffer_of(tile);
  for (int a = 0; a < array_count_; ++a) {
    pointers_[static_cast<std::size_t>(a)] = array_tile(a, buffer);
  }
  acquired_at_ = std::chrono::steady_clock::now();
  return pointers_;
}

void SwappedArrays::poll() {
  for (File& file : files_) file.swapper->poll();
}

void SwappedArrays::release(std::int64_t tile) {
  times_.update += seconds_between(acquired_at_);
  const auto start = std::chrono::steady_clock::now();
  start_write(tile);
  times_.write_start += seconds_between(start);
  if (!pipeline_write_) wait_write(writes_[static_cast<std::size_t>(buffer_of(tile))]);
}

void SwappedArrays::end_pass() {
  std::exception_ptr failure;
  for (PendingWrite& write : writes_) {
    try {
      wait_write(write);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void SwappedArrays::roll_back_pass() noexcept {
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
  std::fill(read_tile_.begin(), read_tile_.end(), -1);
  for (PendingWrite& write : writes_) write = PendingWrite{};
  cached_tile_ = -1;
  cache_dirty_ = false;
}

void SwappedArrays::load_cache(std::int64_t tile) {
  if (cached_tile_ == tile) return;
  flush();
  cached_tile_ = -1;
  start_read(tile);
  wait_read(tile);
  cached_tile_ = tile;
}

void SwappedArrays::flush() {
  if (!cache_dirty_) return;
  start_write(cached_tile_);
  cache_dirty_ = false;
  wait_write(writes_[static_cast<std::size_t>(buffer_of(cached_tile_))]);
}

template <class CopyPart>
void SwappedArrays::for_each_cached_part(int array, std::int64_t offset, std::int64_t count,
                                         CopyPart copy_part) {
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t tile = (offset + done) / tile_;
    const std::int64_t n = std::min(count - done, tile_end(tile) - (offset + done));
    load_cache(tile);
    copy_part(array_tile(array, buffer_of(tile)) + (offset + done - tile_begin(tile)), done,
              static_cast<std::size_t>(n) * sizeof(float));
    done += n;
  }
}

void SwappedArrays::read(int array, std::int64_t offset, float* out, std::int64_t count) {
  for_each_cached_part(array, offset, count,
                       [out](const float* in_tile, std::int64_t done, std::size_t bytes) {
                         std::memcpy(out + done, in_tile, bytes);
                       });
}

void SwappedArrays::write(int array, std::int64_t offset, const float* values, std::int64_t count) {
  for_each_cached_part(array, offset, count,
                       [this, values](float* in_tile, std::int64_t done, std::size_t bytes) {
                         std::memcpy(in_tile, values + done, bytes);
                         cache_dirty_ = true;
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
