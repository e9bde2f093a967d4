// ChecksumThread: a queue of growing CRC32C jobs served oldest first, a chunk at a time.
#include "offload/checksum_thread.h"

#include <unistd.h>  // write

#include <algorithm>
#include <string>
#include <system_error>

#include "util/crc32c.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

// Between chunks the thread takes new bytes, new jobs and drops into account; 1 MiB is ~0.1 ms of
// the SSE4.2 path, so a drop never waits long.
constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

}  // namespace

ChecksumThread::ChecksumThread() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    throw IoError(std::string("the swap file's checksum thread could not start: ") + e.what() +
                  "; raise the process's thread limit (ulimit -u)");
  }
}

ChecksumThread::~ChecksumThread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();
}

std::uint64_t ChecksumThread::start(const std::byte* data, std::size_t bytes, std::size_t ready) {
  std::uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_job_++;
    jobs_.emplace(id, Job{data, bytes, std::min(ready, bytes), 0, 0});
  }
  work_.notify_one();
  return id;
}

void ChecksumThread::extend(std::uint64_t job, std::size_t ready) {
  {
    std::lock_guard lock(mutex_);
    const auto it = jobs_.find(job);
    if (it == jobs_.end() || ready <= it->second.ready) return;
    it->second.ready = std::min(ready, it->second.bytes);
  }
  work_.notify_one();
}

std::optional<std::uint32_t> ChecksumThread::take(std::uint64_t job) {
  std::lock_guard lock(mutex_);
  const auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    throw UsageError("checksum job " + std::to_string(job) + " is unknown (internal error)");
  }
  if (it->second.checked < it->second.bytes) return std::nullopt;
  const std::uint32_t crc = it->second.crc;
  jobs_.erase(it);
  return crc;
}

std::uint32_t ChecksumThread::wait(std::uint64_t job) {
  std::unique_lock lock(mutex_);
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.ready < it->second.bytes) {
    throw UsageError("checksum job " + std::to_string(job) +
                     " is unknown or not all ready (internal error)");
  }
  finished_.wait(lock, [&] { return it->second.checked == it->second.bytes; });
  const std::uint32_t crc = it->second.crc;
  jobs_.erase(it);
  return crc;
}

void ChecksumThread::drop(std::uint64_t job) noexcept {
  std::unique_lock lock(mutex_);
  // The thread reads the job's bytes outside the lock: wait until it is off this job.
  finished_.wait(lock, [&] { return serving_ != job; });
  jobs_.erase(job);
}

void ChecksumThread::notify(int eventfd) noexcept {
  std::lock_guard lock(mutex_);
  eventfd_ = eventfd;
}

void ChecksumThread::run() noexcept {
  std::unique_lock lock(mutex_);
  for (;;) {
    // Oldest job with bytes to check first: the first write submitted is the first waited for.
    const auto pick = [&]() -> std::uint64_t {
      std::uint64_t best = 0;
      for (const auto& [id, job] : jobs_) {
        if (job.checked < job.ready && (best == 0 || id < best)) best = id;
      }
      return best;
    };
    std::uint64_t id = 0;
    work_.wait(lock, [&] { return stop_ || (id = pick()) != 0; });
    if (stop_) return;
    Job& job = jobs_.at(id);
    const std::byte* data = job.data + job.checked;
    const std::size_t bytes = std::min(kChunkBytes, job.ready - job.checked);
    std::uint32_t crc = job.crc;
    serving_ = id;
    lock.unlock();
    crc = crc32c(data, bytes, crc);
    lock.lock();
    serving_ = 0;
    const auto it = jobs_.find(id);  // dropped meanwhile: the result is not wanted
    const bool checked = it != jobs_.end() && (it->second.checked += bytes) == it->second.bytes;
    if (it != jobs_.end()) it->second.crc = crc;
    if (checked && eventfd_ >= 0) {
      const std::uint64_t one = 1;
      // Only a counter at its maximum refuses, and then a wake-up is pending anyway.
      [[maybe_unused]] const ssize_t n = ::write(eventfd_, &one, sizeof one);
    }
    finished_.notify_all();
  }
}

}  // namespace zeroshard::detail
