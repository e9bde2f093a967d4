// The two staging halves and the order of their copies and landings.
#include "engine/host_staging.h"

#include <chrono>
#include <exception>
#include <utility>

#include "util/log.h"

namespace zeroshard::detail {

HostStaging::HostStaging(const EngineContext& context, std::size_t half_bytes)
    : backend_(context.backend), times_(context.times), half_bytes_(half_bytes) {
  for (Half& half : halves_) {
    half.buffer = context.allocate(Tier::kPinnedHost, MemoryCategory::kCommunication, half_bytes);
    half.done = backend_.make_copy_event();
  }
}

void wait_before_freeing(CopyEvent& copy, const char* what) noexcept {
  try {
    copy.wait();
  } catch (const std::exception& error) {
    ZEROSHARD_LOG(kWarning,
                  what << " failed while the engine was being destroyed: " << error.what());
  }
}

HostStaging::~HostStaging() {
  // The copy stream may still read or write the halves, which are freed after this body.
  for (Half& half : halves_) wait_before_freeing(*half.done, "a staging copy");
}

void HostStaging::settle(Half& half) {
  const auto start = std::chrono::steady_clock::now();
  half.done->wait();
  times_.copy_wait += seconds_since(start);
  if (half.land) std::exchange(half.land, nullptr)();
}

char* HostStaging::acquire() {
  current_ = next_;
  next_ = 1 - next_;
  Half& half = halves_[current_];
  settle(half);
  return half.buffer.as<char>();
}

char* HostStaging::acquire_for(void* destination) {
  char* half = acquire();
  written_in_place_ = backend_.memory().location() == MemoryLocation::kHost;
  return written_in_place_ ? static_cast<char*>(destination) : half;
}

void HostStaging::to_device(void* destination, std::size_t bytes) {
  if (std::exchange(written_in_place_, false)) return;
  Half& half = halves_[current_];
  backend_.copy_from_host_async(destination, half.buffer.data(), bytes, *half.done);
}

void HostStaging::to_host(const void* source, std::size_t bytes, std::function<void()> land) {
  to_host(source, halves_[current_].buffer.data(), bytes, std::move(land));
}

void HostStaging::to_host(const void* source, void* destination, std::size_t bytes,
                          std::function<void()> land) {
  Half& half = halves_[current_];
  backend_.copy_to_host_async(destination, source, bytes, *half.done);
  half.land = std::move(land);
}

void HostStaging::land_all() {
  settle(halves_[next_]);
  settle(halves_[1 - next_]);
}

void HostStaging::land_finished() {
  for (Half* half : {&halves_[next_], &halves_[1 - next_]}) {
    if (!half->land) continue;
    if (!half->done->finished()) return;  // a younger copy is not landed before an older one
    std::exchange(half->land, nullptr)();
  }
}

void HostStaging::order_compute_after() {
  for (Half& half : halves_) half.done->order_compute_after();
}

}  // namespace zeroshard::detail
