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

std::size_t varint_size(std::uint64_t value) {
  std::size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

// Bytes of a length-delimited field (a one-byte key) holding `length` bytes.
std::size_t field_size(std::size_t length) { return 1 + varint_size(length) + length; }

void put_event_head(std::string& out, double wall_time, std::int64_t step) {
  put_key(out, 1, kFixed64);
  put_little_endian(out, std::bit_cast<std::uint64_t>(wall_time));
  if (step != 0) {
    put_key(out, 2, kVarint);
    put_varint(out, static_cast<std::uint64_t>(step));
  }
}

std::size_t event_head_size(std::int64_t step) {
  return 9 + (step != 0 ? 1 + varint_size(static_cast<std::uint64_t>(step)) : 0);
}

// The frame's head: the data's length and the length's masked checksum.
void put_frame_head(std::string& out, std::size_t length) {
  const std::size_t at = out.size();
  put_little_endian(out, static_cast<std::uint64_t>(length));
  put_little_endian(out, masked_crc32c(std::string_view(out).substr(at, 8)));
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  const std::uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta;
}

std::string tfrecord_frame(std::string_view data) {
  std::string frame;
  put_frame_head(frame, data.size());
  frame.append(data);
  put_little_endian(frame, masked_crc32c(data));
  return frame;
}

std::string file_version_event(double wall_time, std::string_view version) {
  std::string event;
  put_event_head(event, wall_time, 0);
  put_bytes(event, 3, version);
  return event;
}

void append_scalar_record(std::string& out, double wall_time, std::int64_t step,
                          std::string_view tag, float value) {
  const std::size_t value_size = field_size(tag.size()) + 1 + 4;
  const std::size_t summary_size = field_size(value_size);
  const std::size_t event_size = event_head_size(step) + field_size(summary_size);
  put_frame_head(out, event_size);
  const std::size_t event_at = out.size();
  put_event_head(out, wall_time, step);
  put_key(out, 5, kLengthDelimited);
  put_varint(out, summary_size);
  put_key(out, 1, kLengthDelimited);
  put_varint(out, value_size);
  put_bytes(out, 1, tag);
  put_key(out, 2, kFixed32);
  put_little_endian(out, std::bit_cast<std::uint32_t>(value));
  put_little_endian(out, masked_crc32c(std::string_view(out).substr(event_at, event_size)));
}

}  // namespace zeroshard::detail
