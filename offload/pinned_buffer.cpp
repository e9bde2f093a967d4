// PinnedBuffer: mmap, mlock and the tracker's charge, undone in reverse order.
#include "offload/pinned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "memory/host_first_touch.h"  // zero_host
#include "util/log.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

PinnedBuffer::PinnedBuffer(std::size_t bytes, MemoryTracker* tracker, MemoryCategory category)
    : bytes_(round_up_to_page(bytes)), tracker_(tracker), category_(category) {
  if (bytes_ == 0) return;
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int error = errno;
    throw OutOfMemoryError("pinned swap buffer: mmap of " + std::to_string(bytes_) + " bytes of " +
                           to_string(category) + " failed: " + std::strerror(error));
  }
  data_ = static_cast<std::byte*>(p);
  // Transparent huge pages make each block of a transfer one physically contiguous segment, so a
  // 1 MiB request is not split at the device's segment limit (virtio-blk: 254 pages). Advisory:
  // where they are off the kernel refuses, and 4 KiB pages serve as before.
  [[maybe_unused]] const int advised = madvise(data_, bytes_, MADV_HUGEPAGE);
  // The pages are faulted in by the threads the update's static schedule gives them to (mlock
  // would fault them all on this one).
  zero_host(data_, bytes_);
  // Locking keeps the pages resident, so the kernel never has to fault them in mid-transfer.
  if (mlock(data_, bytes_) == 0) {
    locked_ = true;
  } else {
    const int error = errno;
    ZEROSHARD_LOG(kWarning, "pinned swap buffer: mlock of " << bytes_ << " bytes failed ("
                                                            << std::strerror(error)
                                                            << "); raise RLIMIT_MEMLOCK "
                                                               "(ulimit -l) to keep it resident");
  }
  if (tracker_) tracker_->add(MemoryLocation::kHost, category_, static_cast<std::int64_t>(bytes_));
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      locked_(std::exchange(other.locked_, false)),
      tracker_(std::exchange(other.tracker_, nullptr)),
      category_(other.category_) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    locked_ = std::exchange(other.locked_, false);
    tracker_ = std::exchange(other.tracker_, nullptr);
    category_ = other.category_;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() noexcept {
  if (data_) {
    if (tracker_) {
      tracker_->remove(MemoryLocation::kHost, category_, static_cast<std::int64_t>(bytes_));
    }
    if (locked_) munlock(data_, bytes_);
    munmap(data_, bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
  locked_ = false;
  tracker_ = nullptr;
}

}  // namespace zeroshard::detail
