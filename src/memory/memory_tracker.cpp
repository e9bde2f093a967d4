// The accounting allocator behind every engine buffer.
#include "memory/memory_tracker.h"

#include <sys/mman.h>

#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "memory/host_first_touch.h"  // zero_host, kHugePageBytes
#include "util/check.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

void MemoryTracker::add(MemoryLocation location, MemoryCategory category, std::int64_t bytes,
                        bool adopted) {
  std::lock_guard lock(mutex_);
  const int l = static_cast<int>(location);
  if (adopted) adopted_[l][static_cast<int>(category)] += bytes;
  MemoryUsage& usage = usage_[l][static_cast<int>(category)];
  usage.current += bytes;
  if (usage.current > usage.peak) usage.peak = usage.current;
  total_current_[l] += bytes;
  if (total_current_[l] > total_peak_[l]) total_peak_[l] = total_current_[l];
}

void MemoryTracker::remove(MemoryLocation location, MemoryCategory category, std::int64_t bytes,
                           bool adopted) {
  std::lock_guard lock(mutex_);
  const int l = static_cast<int>(location);
  if (adopted) adopted_[l][static_cast<int>(category)] -= bytes;
  usage_[l][static_cast<int>(category)].current -= bytes;
  total_current_[l] -= bytes;
}

namespace {

// Bytes that stay held change what they are counted as: the total does not move.
void shift(MemoryUsage& from, MemoryUsage& to, std::int64_t bytes) {
  from.current -= bytes;
  to.current += bytes;
  if (to.current > to.peak) to.peak = to.current;
}

}  // namespace

void MemoryTracker::keep(MemoryLocation location, MemoryCategory category, std::int64_t bytes) {
  std::lock_guard lock(mutex_);
  const int l = static_cast<int>(location);
  shift(usage_[l][static_cast<int>(category)], kept_[l], bytes);
}

void MemoryTracker::reuse(MemoryLocation location, MemoryCategory category, std::int64_t bytes) {
  std::lock_guard lock(mutex_);
  const int l = static_cast<int>(location);
  shift(kept_[l], usage_[l][static_cast<int>(category)], bytes);
}

void MemoryTracker::remove_kept(MemoryLocation location, std::int64_t bytes) {
  std::lock_guard lock(mutex_);
  const int l = static_cast<int>(location);
  kept_[l].current -= bytes;
  total_current_[l] -= bytes;
}

std::int64_t MemoryTracker::current(MemoryCategory category, MemoryLocation location) const {
  std::lock_guard lock(mutex_);
  return usage_[static_cast<int>(location)][static_cast<int>(category)].current;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(mutex_);
  for (auto& location : usage_) {
    for (MemoryUsage& usage : location) usage.peak = usage.current;
  }
  for (MemoryUsage& kept : kept_) kept.peak = kept.current;
  total_peak_ = total_current_;
}

MemoryReport MemoryTracker::report(int rank, int world_size) const {
  MemoryReport report = counted(rank, world_size);
  report.process_peak_rss = process_peak_rss_bytes();
  return report;
}

MemoryReport MemoryTracker::counted(int rank, int world_size) const {
  MemoryReport report;
  {
    std::lock_guard lock(mutex_);
    report.usage = usage_;
    report.adopted = adopted_;
    report.kept_for_reuse = kept_;
    report.total_peak = total_peak_;
  }
  report.rank = rank;
  report.world_size = world_size;
  return report;
}

namespace {

class HostMemory final : public MemoryResource {
 public:
  MemoryLocation location() const noexcept override { return MemoryLocation::kHost; }
  void* allocate(std::size_t bytes, MemoryCategory category) override {
    const Block block = map(bytes, category, kBufferAlignment,
                            "lower the ZeRO stage's resident bytes (higher stage, smaller buckets) "
                            "or offload");
    // First touched by the thread that will update each part, not all by this one.
    zero_host(block.data, block.bytes);
    return block.data;
  }
  void* allocate_uninitialized(std::size_t bytes, MemoryCategory category) override {
    constexpr std::size_t kDirectIoAlignment = 4096;
    return map(bytes, category, kDirectIoAlignment, "free host memory and retry").data;
  }
  void deallocate(void* data) noexcept override { std::free(data); }

 private:
  struct Block {
    void* data;
    std::size_t bytes;  ///< rounded up to the alignment
  };
  // Transparent huge pages where the buffer spans some: a fresh buffer is mapped once per 2 MiB
  // instead of once per 4 KiB as it is first written.
  static Block map(std::size_t bytes, MemoryCategory category, std::size_t alignment,
                   const char* advice) {
    if (bytes >= kHugePageBytes) alignment = kHugePageBytes;
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* data = std::aligned_alloc(alignment, rounded);
    if (data == nullptr) {
      std::ostringstream os;
      os << "cannot allocate " << bytes << " bytes of host memory for " << to_string(category)
         << " [" << where(__FILE__, __LINE__) << "]; " << advice;
      throw OutOfMemoryError(os.str());
    }
    if (alignment == kHugePageBytes) ::madvise(data, rounded, MADV_HUGEPAGE);  // advice only
    return {data, rounded};
  }
};

}  // namespace

MemoryResource& host_memory() noexcept {
  static HostMemory memory;
  return memory;
}

TrackedBuffer::TrackedBuffer(MemoryTracker& tracker, MemoryCategory category, std::size_t bytes,
                             MemoryResource& resource)
    : tracker_(&tracker), resource_(&resource), category_(category), bytes_(bytes) {
  if (bytes == 0) return;
  data_ = resource.allocate(bytes, category);
  tracker_->add(resource.location(), category_, static_cast<std::int64_t>(bytes_));
}

TrackedBuffer TrackedBuffer::adopt(MemoryTracker& tracker, MemoryCategory category,
                                   std::size_t bytes, MemoryResource& resource, void* data) {
  TrackedBuffer buffer;
  if (bytes == 0) return buffer;
  buffer.tracker_ = &tracker;
  buffer.resource_ = &resource;
  buffer.category_ = category;
  buffer.data_ = data;
  buffer.bytes_ = bytes;
  buffer.adopted_ = true;
  tracker.add(resource.location(), category, static_cast<std::int64_t>(bytes), true);
  return buffer;
}

TrackedBuffer::TrackedBuffer(TrackedBuffer&& other) noexcept
    : tracker_(other.tracker_),
      resource_(other.resource_),
      category_(other.category_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      adopted_(std::exchange(other.adopted_, false)),
      kept_(std::exchange(other.kept_, false)) {}

TrackedBuffer& TrackedBuffer::operator=(TrackedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    tracker_ = other.tracker_;
    resource_ = other.resource_;
    category_ = other.category_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    adopted_ = std::exchange(other.adopted_, false);
    kept_ = std::exchange(other.kept_, false);
  }
  return *this;
}

TrackedBuffer::~TrackedBuffer() { reset(); }

void TrackedBuffer::reset() noexcept {
  if (data_ != nullptr) {
    if (!adopted_) resource_->deallocate(data_);
    const auto bytes = static_cast<std::int64_t>(bytes_);
    if (kept_) {
      tracker_->remove_kept(resource_->location(), bytes);
    } else {
      tracker_->remove(resource_->location(), category_, bytes, adopted_);
    }
  }
  data_ = nullptr;
  bytes_ = 0;
  adopted_ = false;
  kept_ = false;
}

void TrackedBuffer::keep_for_reuse() noexcept {
  if (data_ == nullptr || adopted_ || kept_) return;
  tracker_->keep(resource_->location(), category_, static_cast<std::int64_t>(bytes_));
  kept_ = true;
}

void TrackedBuffer::reuse() noexcept {
  if (!kept_) return;
  tracker_->reuse(resource_->location(), category_, static_cast<std::int64_t>(bytes_));
  kept_ = false;
}

TrackedBuffer TrackedBuffer::uninitialized(MemoryTracker& tracker, MemoryCategory category,
                                           std::size_t bytes, MemoryResource& resource) {
  TrackedBuffer buffer;
  buffer.tracker_ = &tracker;
  buffer.resource_ = &resource;
  buffer.category_ = category;
  if (bytes == 0) return buffer;
  buffer.data_ = resource.allocate_uninitialized(bytes, category);
  buffer.bytes_ = bytes;
  tracker.add(resource.location(), category, static_cast<std::int64_t>(bytes));
  return buffer;
}

TrackedBuffer TrackedBuffer::uninitialized_twin() const {
  if (data_ == nullptr || adopted_) return {};
  return uninitialized(*tracker_, category_, bytes_, *resource_);
}

std::int64_t process_peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      std::int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace zeroshard::detail
