// A thread that computes the swap records' CRC32C off the thread driving the I/O, so that under
// CPU contention the submitter stays a light sleeper that refills the queue as completions arrive.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace zeroshard::detail {

/// Computes the CRC32C of byte ranges on a thread of its own. A job may grow as its bytes arrive
/// (a read checks each block as it lands): the thread checksums [0, ready) and waits for more
/// until `ready` reaches the job's size. Jobs with bytes to check are served in turn, a chunk at
/// a time, so a read waiting for the drive never holds back a write's checksum. Thread-safe.
class ChecksumThread {
 public:
  /// Throws IoError when the thread cannot be started.
  ChecksumThread();
  ChecksumThread(const ChecksumThread&) = delete;
  ChecksumThread& operator=(const ChecksumThread&) = delete;
  /// Drops every job and joins the thread; never throws.
  ~ChecksumThread();

  /// Starts the checksum of `bytes` bytes at `data`, of which the first `ready` may be read now;
  /// returns the job's id (never 0). The bytes must not change until the job is taken or dropped.
  std::uint64_t start(const std::byte* data, std::size_t bytes, std::size_t ready);
  /// Lets the thread read the job's first `ready` bytes (never fewer than before).
  void extend(std::uint64_t job, std::size_t ready);
  /// The checksum, once every byte is checked; the job is then gone. nullopt while it runs.
  std::optional<std::uint32_t> take(std::uint64_t job);
  /// Blocks until the job is checked and returns its checksum; the job is then gone. Every byte
  /// must already be ready.
  std::uint32_t wait(std::uint64_t job);
  /// Forgets the job; returns once the thread no longer reads its bytes.
  void drop(std::uint64_t job) noexcept;
  /// Signals `eventfd` each time a job is checked, so that a thread sleeping on it for I/O
  /// completions also wakes for checksums; -1 for none.
  void notify(int eventfd) noexcept;

 private:
  struct Job {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    std::size_t ready = 0;
    std::size_t checked = 0;
    std::uint32_t crc = 0;
  };
  void run() noexcept;

  std::mutex mutex_;
  std::condition_variable work_;      // to the thread: a job has bytes to check, or stop
  std::condition_variable finished_;  // from the thread: a job is checked, or a chunk is done
  std::unordered_map<std::uint64_t, Job> jobs_;
  std::uint64_t next_job_ = 1;
  std::uint64_t serving_ = 0;  // the job whose chunk the thread is checking, 0 when none
  std::uint64_t last_served_ = 0;
  int eventfd_ = -1;
  bool stop_ = false;
  std::thread thread_;  // started in the constructor, once the members above exist
};

}  // namespace zeroshard::detail
