// Sequential checkpoint file writes: two aligned chunks, O_DIRECT on a worker, CRC on the caller.
#include "checkpoint/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/crc32c.h"

namespace zeroshard::detail {

ShardWriter::ShardWriter(const std::string& path) : buffered_(FileHandle::create(path)) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (fd >= 0) direct_.emplace(fd, path);
  chunks_[0] = aligned_chunk(kIoChunk, "checkpoint write buffer");
  chunks_[1] = aligned_chunk(kIoChunk, "checkpoint write buffer");
}

ShardWriter::~ShardWriter() {
  if (pending_.valid()) pending_.wait();
}

std::vector<std::uint32_t> ShardWriter::write_section(std::int64_t count, const Producer& produce) {
  std::vector<std::uint32_t> crcs;
  for (std::int64_t first = 0; first < count;) {
    if (filled_ == kIoChunk) submit(kIoChunk * sizeof(float));
    if (first % kIoChunk == 0) crcs.push_back(0);
    float* out = chunks_[current_].get() + filled_;
    const std::int64_t n =
        std::min({count - first, kIoChunk - filled_, kIoChunk - first % kIoChunk});
    produce(out, first, n);
    crcs.back() = crc32c(out, static_cast<std::size_t>(n) * sizeof(float), crcs.back());
    filled_ += n;
    first += n;
  }
  return crcs;
}

void ShardWriter::finish() {
  const std::int64_t size = written_ + filled_ * static_cast<std::int64_t>(sizeof(float));
  if (filled_ > 0) {
    std::int64_t bytes = filled_ * static_cast<std::int64_t>(sizeof(float));
    if (direct_) {
      // A direct write is whole blocks: the last one is padded with zeros and the file cut back.
      const std::int64_t padded = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      std::memset(reinterpret_cast<char*>(chunks_[current_].get()) + bytes, 0,
                  static_cast<std::size_t>(padded - bytes));
      bytes = padded;
    }
    submit(bytes);
  }
  if (pending_.valid()) pending_.get();
  if (written_ != size && ::ftruncate(buffered_.fd(), size) != 0) {
    throw_io_error("cannot set the length of", buffered_.path());
  }
  direct_.reset();
  buffered_.close_synced();
}

void ShardWriter::submit(std::int64_t bytes) {
  if (pending_.valid()) pending_.get();  // the other chunk's write; rethrows its failure
  pending_ = std::async(std::launch::async, &ShardWriter::write_chunk, this,
                        chunks_[current_].get(), bytes, written_);
  written_ += bytes;
  current_ ^= 1;
  filled_ = 0;
}

void ShardWriter::write_chunk(const float* data, std::int64_t bytes, std::int64_t offset) {
  const char* p = reinterpret_cast<const char*>(data);
  while (direct_ && bytes > 0) {
    const ssize_t n = ::pwrite(direct_->fd(), p, static_cast<std::size_t>(bytes), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EINVAL) throw_io_error("cannot write", buffered_.path());
      direct_.reset();  // the file system takes O_DIRECT opens but not writes: page cache
      break;
    }
    p += n;
    offset += n;
    bytes -= n;
    // A short write leaves an unaligned rest, which only the page cache takes.
    if (n % kDirectAlign != 0) break;
  }
  if (bytes > 0) buffered_.pwrite_all(p, static_cast<std::size_t>(bytes), offset);
}

}  // namespace zeroshard::detail
