// The activation buffers an engine has handed out and not yet freed. The engine frees those left
// when it is destroyed, so a buffer that outlives it (a trainer's global, say) is empty by then
// and its own destruction touches nothing of the engine's.
#pragma once

#include <mutex>
#include <unordered_set>

#include "memory/memory_tracker.h"

namespace zeroshard::detail {

class ActivationRegistry {
 public:
  void add(TrackedBuffer& buffer);
  /// Frees `buffer` unless the engine has already freed it.
  void free(TrackedBuffer& buffer) noexcept;
  /// The engine is going: frees every buffer still handed out; later free() calls do nothing.
  void free_all() noexcept;

 private:
  // A buffer may be destroyed on another thread than the engine.
  std::mutex mutex_;
  bool engine_alive_ = true;
  std::unordered_set<TrackedBuffer*> live_;
};

}  // namespace zeroshard::detail
