// SwappedShard: the tile cache over one swap file (which buffer a tile goes to, read ahead,
// write-back on eviction and at flush) and its roll-back through the swapper's A/B records.
#include "offload/swapped_shard.h"

#include <algorithm>
#include <cstring>

namespace zeroshard::detail {
namespace {

std::int64_t tile_of(const SwappedShardOptions& options) {
  return std::max<std::int64_t>(1, std::min(options.tile, options.elements));
}

NvmeSwapperOptions swapper_options(const SwappedShardOptions& options) {
  NvmeSwapperOptions swapper;
  swapper.directory = options.directory;
  swapper.rank = options.rank;
  swapper.kind = options.kind;
  swapper.run_id = options.run_id;
  const std::int64_t tile = tile_of(options);
  swapper.slot_count = std::max<std::int64_t>(1, (options.elements + tile - 1) / tile);
  swapper.slot_bytes = tile * static_cast<std::int64_t>(options.element_bytes);
  // More buffers than tiles would hold nothing.
  swapper.buffer_count = static_cast<int>(
      std::min<std::int64_t>(std::max(1, options.buffer_count), swapper.slot_count));
  swapper.aio = options.aio;
  swapper.tracker = options.tracker;
  swapper.category = options.category;
  return swapper;
}

}  // namespace

SwappedShard::SwappedShard(const SwappedShardOptions& options)
    : elements_(options.elements),
      element_bytes_(options.element_bytes),
      tile_(tile_of(options)),
      swapper_(swapper_options(options)),
      buffers_(static_cast<std::size_t>(swapper_.buffer_count())) {}

std::int64_t SwappedShard::tile_end(std::int64_t tile) const noexcept {
  return std::min(elements_, (tile + 1) * tile_);
}

std::byte* SwappedShard::tile_data(int buffer) { return swapper_.buffer(buffer).data(); }

int SwappedShard::find(std::int64_t tile) const noexcept {
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].state != State::kFree && buffers_[b].tile == tile) return static_cast<int>(b);
  }
  return -1;
}

void SwappedShard::wait(int buffer) {
  Buffer& b = buffers_[static_cast<std::size_t>(buffer)];
  if (b.state != State::kReading && b.state != State::kWriting) return;
  const bool reading = b.state == State::kReading;
  try {
    swapper_.wait(b.ticket);
  } catch (...) {
    // A failed read leaves nothing usable; a failed write leaves the tile changed in the cache.
    b.state = reading ? State::kFree : State::kDirty;
    throw;
  }
  b.state = State::kClean;
}

void SwappedShard::start_read(int buffer, std::int64_t tile) {
  Buffer& b = buffers_[static_cast<std::size_t>(buffer)];
  b.tile = tile;
  b.last_use = ++clock_;
  if (swapper_.generation(tile) == 0) {
    // Never written: zeros, as a fresh shard holds before the engine stores its values.
    const std::span<std::byte> payload = swapper_.buffer(buffer);
    std::memset(payload.data(), 0, payload.size());
    b.state = State::kClean;
    return;
  }
  b.ticket = swapper_.read(tile, buffer);
  b.state = State::kReading;
}

void SwappedShard::start_write(int buffer) {
  Buffer& b = buffers_[static_cast<std::size_t>(buffer)];
  b.ticket = swapper_.write(b.tile, buffer);
  b.state = State::kWriting;
}

int SwappedShard::take_buffer(bool may_wait) {
  int chosen = -1;
  const auto consider = [&](auto accepts) {
    for (std::size_t b = 0; b < buffers_.size(); ++b) {
      const Buffer& buffer = buffers_[b];
      if (!accepts(buffer)) continue;
      if (chosen < 0 || buffer.last_use < buffers_[static_cast<std::size_t>(chosen)].last_use) {
        chosen = static_cast<int>(b);
      }
    }
    return chosen >= 0;
  };
  if (consider([](const Buffer& b) { return b.state == State::kFree; })) return chosen;
  if (consider([](const Buffer& b) { return b.state == State::kClean && !b.ahead; })) {
    return chosen;
  }
  if (!may_wait) return -1;
  if (consider([](const Buffer& b) { return b.state == State::kDirty; })) {
    start_write(chosen);
  } else {
    consider([](const Buffer&) { return true; });
  }
  wait(chosen);
  return chosen;
}

int SwappedShard::acquire(std::int64_t tile, bool will_write, bool overwritten_whole) {
  int buffer = find(tile);
  if (buffer < 0) {
    buffer = take_buffer(true);
    if (overwritten_whole) {
      buffers_[static_cast<std::size_t>(buffer)].tile = tile;
      buffers_[static_cast<std::size_t>(buffer)].state = State::kClean;
    } else {
      start_read(buffer, tile);
    }
  }
  wait(buffer);
  Buffer& b = buffers_[static_cast<std::size_t>(buffer)];
  b.ahead = false;
  b.last_use = ++clock_;
  if (will_write) b.state = State::kDirty;
  return buffer;
}

bool SwappedShard::read_ahead(std::int64_t offset, std::int64_t count) {
  if (count <= 0) return true;
  for (std::int64_t tile = offset / tile_; tile * tile_ < offset + count; ++tile) {
    if (find(tile) >= 0) continue;
    const int buffer = take_buffer(false);
    if (buffer < 0) return false;
    start_read(buffer, tile);
    buffers_[static_cast<std::size_t>(buffer)].ahead = true;
  }
  swapper_.poll();
  return true;
}

void SwappedShard::poll() { swapper_.poll(); }

void SwappedShard::flush() {
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].state == State::kDirty) start_write(static_cast<int>(b));
  }
  // Every write is waited for even when one fails, so no request is left behind.
  std::exception_ptr failure;
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (buffers_[b].state != State::kWriting) continue;
    try {
      wait(static_cast<int>(b));
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void SwappedShard::begin_update() {
  flush();
  before_update_ = swapper_.snapshot();
  updating_ = true;
}

void SwappedShard::end_update() {
  flush();
  updating_ = false;
}

void SwappedShard::roll_back() noexcept {
  if (!updating_) return;
  updating_ = false;
  try {
    swapper_.wait_all();
  } catch (...) {
    // The update's error was already raised; what else failed is undone below all the same.
  }
  swapper_.restore(before_update_);
  for (Buffer& b : buffers_) b = Buffer{};
}

}  // namespace zeroshard::detail
