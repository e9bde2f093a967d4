// Protocol-buffer wire format for Event (wall_time = 1, step = 2, file_version = 3, summary = 5),
// Summary (value = 1) and Summary.Value (tag = 1, simple_value = 2), and the TFRecord framing.
#include "monitor/event_encoding.h"

#include <bit>

#include "util/crc32c.h"

namespace zeroshard::detail {
namespace {

// Wire types of the protobuf encoding.
constexpr std::uint8_t kVarint = 0;
constexpr std::uint8_t kFixed64 = 1;
constexpr std::uint8_t kLengthDelimited = 2;
constexpr std::uint8_t kFixed32 = 5;

constexpr std::uint32_t kCrcMaskDelta = 0xa282ead8u;

void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, int field, std::uint8_t wire_type) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | wire_type);
}

// The wire format is little-endian whatever the host.
template <class Unsigned>
void put_little_endian(std::string& out, Unsigned value) {
  for (std::size_t i = 0; i < sizeof(Unsigned); ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_head(double wall_time, std::int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_little_endian(event, std::bit_cast<std::uint64_t>(wall_time));
  if (step != 0) {
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<std::uint64_t>(step));
  }
  return event;
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  const std::uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta;
}

std::string tfrecord_frame(std::string_view data) {
  std::string length;
  put_little_endian(length, static_cast<std::uint64_t>(data.size()));
  std::string frame = length;
  put_little_endian(frame, masked_crc32c(length));
  frame.append(data);
  put_little_endian(frame, masked_crc32c(data));
  return frame;
}

std::string file_version_event(double wall_time, std::string_view version) {
  std::string event = event_head(wall_time, 0);
  put_bytes(event, 3, version);
  return event;
}

std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_little_endian(summary_value, std::bit_cast<std::uint32_t>(value));
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_head(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

}  // namespace zeroshard::detail
