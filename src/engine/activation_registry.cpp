// Frees activation buffers exactly once, whichever of a buffer and its engine goes first.
#include "engine/activation_registry.h"

namespace zeroshard::detail {

void ActivationRegistry::add(TrackedBuffer& buffer) {
  const std::lock_guard lock(mutex_);
  live_.insert(&buffer);
}

void ActivationRegistry::free(TrackedBuffer& buffer) noexcept {
  const std::lock_guard lock(mutex_);
  // Freed under the lock, so that the engine cannot be destroyed half-way through.
  if (engine_alive_ && live_.erase(&buffer) > 0) buffer.reset();
}

void ActivationRegistry::free_all() noexcept {
  const std::lock_guard lock(mutex_);
  engine_alive_ = false;
  for (TrackedBuffer* buffer : live_) buffer->reset();
  live_.clear();
}

}  // namespace zeroshard::detail
