// What a monitor writes to: named scalar series, one value per x (step or samples), and the two
// formats that keep them, DeepSpeed's csv_monitor files and TensorBoard's event files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "monitor/series_file.h"

namespace zeroshard::detail {

/// A destination of scalar series. Writes go to buffers; flush() makes them durable.
class SeriesWriter {
 public:
  virtual ~SeriesWriter() = default;
  /// Appends (x, value) to series `tag` ("Train/Samples/lr").
  virtual void add(std::string_view tag, std::int64_t x, double value) = 0;
  virtual void flush() = 0;
  /// Where it writes, for messages.
  virtual std::string where() const = 0;
};

/// csv_monitor: folder/<tag with '/' and ' ' as '_'>.csv per series, a header "step,<last part
/// of the tag>" and then rows "x,value", as DeepSpeed's CSV monitor writes them. Values are
/// written with the fewest digits that read back as the same double (std::to_chars).
class CsvWriter final : public SeriesWriter {
 public:
  /// Creates `folder` if needed and checks a file can be written and flushed there (IoError).
  explicit CsvWriter(std::string folder);
  void add(std::string_view tag, std::int64_t x, double value) override;
  void flush() override;
  std::string where() const override { return folder_; }

 private:
  std::string folder_;
  std::map<std::string, SeriesFile, std::less<>> files_;
};

/// tensorboard: one TensorBoard event file, events.out.tfevents.<seconds>.<host>.<pid>.<n>, in
/// `folder`: TFRecord frames of Event protos holding simple_value scalars (docs/monitoring.md).
class EventFileWriter final : public SeriesWriter {
 public:
  /// Creates `folder` if needed and writes the file_version event (IoError).
  explicit EventFileWriter(const std::string& folder);
  void add(std::string_view tag, std::int64_t x, double value) override;
  void flush() override;
  std::string where() const override { return file_.path(); }

 private:
  SeriesFile file_;
  std::string record_;  // reused for every record
};

/// Creates `folder` and its parents; IoError naming `key` (the config key that gave it) otherwise.
void create_monitor_folder(const std::string& folder, const std::string& key);

}  // namespace zeroshard::detail
