// Tensor shapes: the checked element count (no byte size, flat offset or padded total derived
// from a registered shape can overflow int64) and the text that names a shape in messages.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace zeroshard::detail {

/// 2^56 elements: the widest per-element footprint of any buffer (a bucket slot's 16-bit input,
/// fp32 send and receive areas: 10 bytes) times this, plus alignment padding, stays below 2^63.
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 56;

/// The product of `dims`, or nullopt when a dimension is negative or the product exceeds
/// kMaxElements. A zero dimension gives 0 whatever the others are.
inline std::optional<std::int64_t> element_product(std::span<const std::int64_t> dims) noexcept {
  std::int64_t product = 1;
  bool too_large = false;
  for (std::int64_t d : dims) {
    if (d < 0) return std::nullopt;
    if (d == 0) return 0;
    // Overflow is remembered rather than returned at once: a later zero still makes it empty.
    if (too_large || d > kMaxElements / product) {
      too_large = true;
      continue;
    }
    product *= d;
  }
  if (too_large) return std::nullopt;
  return product;
}

/// "[3, 4]"; "[]" for a scalar.
inline std::string format_shape(std::span<const std::int64_t> dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

}  // namespace zeroshard::detail
