// A monitor's output file: opened for appending, written and flushed with every failure turned
// into an IoError naming the file, so that a full disk or a missing permission says what and where.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace zeroshard::detail {

/// An append-only file, closed when destroyed. Move-only.
class SeriesFile {
 public:
  /// Creates (or truncates) `path`; IoError naming the path and the system's reason otherwise.
  explicit SeriesFile(std::string path);

  /// Buffers `bytes`; IoError when the file cannot take them.
  void write(std::string_view bytes);
  /// Hands what is buffered to the system, so that a crash loses at most what came after.
  void flush();
  const std::string& path() const noexcept { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* file) const noexcept { std::fclose(file); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

}  // namespace zeroshard::detail
