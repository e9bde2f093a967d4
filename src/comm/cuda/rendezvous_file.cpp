// Publishing and polling of the rendezvous file.
#include "comm/cuda/rendezvous_file.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

#include "util/check.h"

namespace zeroshard::cuda {
namespace {

void publish(const std::filesystem::path& path, const void* bytes, std::size_t count) {
  std::filesystem::path temporary = path;
  temporary += ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(count));
    out.close();
    if (!out) {
      throw IoError("cannot write the rendezvous file " + temporary.string() + " [" +
                    detail::where(__FILE__, __LINE__) + "]");
    }
  }
  std::error_code error;
  // rename() replaces `path` atomically: a reader sees the old file or the whole new one.
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw IoError("cannot rename the rendezvous file to " + path.string() + ": " + error.message() +
                  " [" + detail::where(__FILE__, __LINE__) + "]");
  }
}

// True once the file was read; false while it does not exist yet.
bool try_read(const std::filesystem::path& path, void* bytes, std::size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.read(static_cast<char*>(bytes), static_cast<std::streamsize>(count));
  const auto got = static_cast<std::size_t>(in.gcount());
  const bool longer = in.peek() != std::ifstream::traits_type::eof();
  if (got != count || longer) {
    std::ostringstream os;
    os << "rendezvous file " << path.string() << " does not hold the expected " << count
       << " bytes; is it left over from another program? [" << detail::where(__FILE__, __LINE__)
       << "]";
    throw IoError(os.str());
  }
  return true;
}

}  // namespace

void exchange_through_file(const std::filesystem::path& path, int rank, void* bytes,
                           std::size_t count, std::chrono::duration<double> timeout) {
  if (rank == 0) {
    publish(path, bytes, count);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!try_read(path, bytes, count)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::ostringstream os;
      os << "rank " << rank << " waited " << timeout.count() << " s for rank 0 to write the "
         << "rendezvous file " << path.string() << " (ZEROSHARD_RDZV_FILE); is rank 0 running "
         << "and is the path on a file system all ranks share? ["
         << detail::where(__FILE__, __LINE__) << "]";
      throw TimeoutError(os.str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace zeroshard::cuda
