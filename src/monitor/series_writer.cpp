// The CSV and TensorBoard series writers, and the folder both start from.
#include "monitor/series_writer.h"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <system_error>

#include "monitor/event_encoding.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// DeepSpeed's file name for a series: "Train/Samples/lr" -> "Train_Samples_lr".
std::string csv_file_name(std::string_view tag) {
  std::string name(tag);
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return name + ".csv";
}

// TensorBoard's name: events.out.tfevents.<seconds>.<host>.<pid>.<n>, the n-th file of the process.
std::string event_file_name() {
  static std::atomic<int> files{0};
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  return "events.out.tfevents." + std::to_string(static_cast<std::int64_t>(wall_seconds())) + "." +
         host + "." + std::to_string(getpid()) + "." + std::to_string(files++);
}

}  // namespace

void create_monitor_folder(const std::string& folder, const std::string& key) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) {
    throw IoError(key + ": cannot create the monitor's folder '" + folder +
                  "': " + error.message() + "; give an output_path this process may write to");
  }
}

CsvWriter::CsvWriter(std::string folder) : folder_(std::move(folder)) {
  // A folder that takes no file, or a full disk, shows here rather than in the first step.
  const std::string probe = folder_ + "/.zeroshard-probe-" + std::to_string(getpid());
  std::exception_ptr failure;
  try {
    SeriesFile file(probe);
    file.write("step,value\n");
    file.flush();
  } catch (...) {
    failure = std::current_exception();
  }
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
  if (failure) std::rethrow_exception(failure);
}

void CsvWriter::add(std::string_view tag, std::int64_t x, double value) {
  auto it = files_.find(tag);
  if (it == files_.end()) {
    it = files_.emplace(std::string(tag), SeriesFile(folder_ + "/" + csv_file_name(tag))).first;
    const std::size_t slash = tag.rfind('/');
    it->second.write("step," +
                     std::string(slash == std::string_view::npos ? tag : tag.substr(slash + 1)) +
                     "\n");
  }
  // Formatted in place: some forty rows a step should cost no allocation.
  char row[64];
  char* end = std::to_chars(row, row + sizeof row, x).ptr;
  *end++ = ',';
  end = std::to_chars(end, row + sizeof row - 1, value).ptr;
  *end++ = '\n';
  it->second.write(std::string_view(row, static_cast<std::size_t>(end - row)));
}

void CsvWriter::flush() {
  for (auto& [tag, file] : files_) file.flush();
}

EventFileWriter::EventFileWriter(const std::string& folder)
    : file_(folder + "/" + event_file_name()) {
  file_.write(tfrecord_frame(file_version_event(wall_seconds())));
  file_.flush();
}

void EventFileWriter::add(std::string_view tag, std::int64_t x, double value) {
  record_.clear();
  append_scalar_record(record_, wall_seconds(), x, tag, static_cast<float>(value));
  file_.write(record_);
}

void EventFileWriter::flush() { file_.flush(); }

}  // namespace zeroshard::detail
