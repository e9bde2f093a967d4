// Appending and flushing a monitor's file, with the system's reason in every error.
#include "monitor/series_file.h"

#include <cerrno>
#include <cstring>

#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

IoError file_error(const std::string& what, const std::string& path, int error) {
  return IoError(what + " '" + path + "': " + std::strerror(error) +
                 "; give the monitor an output_path on a file system with room that this "
                 "process may write to");
}

}  // namespace

SeriesFile::SeriesFile(std::string path) : path_(std::move(path)) {
  file_.reset(std::fopen(path_.c_str(), "wb"));
  if (!file_) throw file_error("cannot create monitor file", path_, errno);
}

void SeriesFile::write(std::string_view bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_.get()) != bytes.size()) {
    throw file_error("cannot write monitor file", path_, errno);
  }
}

void SeriesFile::flush() {
  if (std::fflush(file_.get()) != 0) throw file_error("cannot write monitor file", path_, errno);
}

}  // namespace zeroshard::detail
