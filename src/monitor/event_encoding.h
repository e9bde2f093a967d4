// The bytes of a TensorBoard event file, encoded by hand: TFRecord frames (length, masked CRC-32C
// of the length, data, masked CRC-32C of the data) around the few fields of tensorflow's Event and
// Summary protos that scalars need, so that no TensorFlow or protobuf library is required.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zeroshard::detail {

/// TFRecord's checksum: CRC-32C rotated right by 15 bits plus 0xa282ead8.
std::uint32_t masked_crc32c(std::string_view bytes) noexcept;
/// One TFRecord frame around `data`.
std::string tfrecord_frame(std::string_view data);
/// Event{wall_time, step, file_version}: the record that opens every event file.
std::string file_version_event(double wall_time, std::string_view version = "brain.Event:2");
/// Appends the TFRecord frame of Event{wall_time, step, summary{value{tag, simple_value}}}, one
/// scalar, to `out`, building nothing on the way: a monitor writes some forty at every step.
void append_scalar_record(std::string& out, double wall_time, std::int64_t step,
                          std::string_view tag, float value);

}  // namespace zeroshard::detail
