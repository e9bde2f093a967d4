// Double-buffered pinned staging between an offloaded (host) update and the parameters and
// gradients the device holds: while one half's copy runs on the backend's copy stream, the host
// fills or drains the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "engine/engine_context.h"
#include "layout/host_staging_size.h"

namespace zeroshard::detail {

/// In a destructor, before freeing what `copy` reads or writes: waits for it, and logs a failure
/// (naming `what`) rather than throwing.
void wait_before_freeing(CopyEvent& copy, const char* what) noexcept;

class HostStaging {
 public:
  /// Two halves of `half_bytes` of pinned host memory, charged to communication.
  HostStaging(const EngineContext& context, std::size_t half_bytes);
  /// Waits for the copies in flight, which still use the halves.
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  std::size_t half_bytes() const noexcept { return half_bytes_; }
  /// The half the next copy uses (the halves take turns), once its previous copy has finished and
  /// what was to be done with the bytes it brought has been done.
  char* acquire();
  /// acquire() for bytes that to_device() then copies to `destination`: the memory to write them
  /// in, the acquired half, or, where the device's memory is the host's (a CPU rank), `destination`
  /// itself: there the copy would be a second pass over the bytes, which cost the offloaded update
  /// a fifth more time. The halves still take turns and land what they brought as on a GPU.
  char* acquire_for(void* destination);
  /// Copies `bytes` of the acquired half to `destination` (device memory), unless acquire_for()
  /// had them written there.
  void to_device(void* destination, std::size_t bytes);
  /// Copies `bytes` of `source` (device memory) into the acquired half; `land` reads them there
  /// once they have arrived, at the latest when the half is acquired again or at land_all().
  void to_host(const void* source, std::size_t bytes, std::function<void()> land);
  /// The same into `destination` (host memory, pinned for an asynchronous copy) instead of the
  /// half, whose turn it takes: what the copy writes is there once `land` could run.
  void to_host(const void* source, void* destination, std::size_t bytes,
               std::function<void()> land);
  /// Waits for every copy in flight and lands what they brought, oldest first.
  void land_all();
  /// Lands what the copies that have already finished brought, oldest first, without waiting.
  void land_finished();
  /// Makes work queued later on the compute stream wait for every copy in flight: before
  /// the device memory they read is written again, or the memory they write is read.
  void order_compute_after();

 private:
  struct Half {
    TrackedBuffer buffer;
    std::unique_ptr<CopyEvent> done;
    std::function<void()> land;  ///< empty once landed, and for copies to the device
  };
  void settle(Half& half);

  ComputeBackend& backend_;
  StepTimes& times_;
  std::size_t half_bytes_;
  Half halves_[2];
  int next_ = 0;                   ///< the half acquire() hands out next: the older copy
  int current_ = 1;                ///< the half acquire() handed out last
  bool written_in_place_ = false;  ///< acquire_for() handed out the destination itself
};

}  // namespace zeroshard::detail
