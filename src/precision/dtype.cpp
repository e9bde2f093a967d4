// Names of the element types, and conversion between them.
#include "zeroshard/dtype.h"

#include <algorithm>
#include <cstring>

#include "precision/half_conversion.h"

namespace zeroshard {

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat64:
      return "fp64";
  }
  return "unknown dtype";
}

void convert(const void* in, DType from, void* out, DType to, std::int64_t count) noexcept {
  if (from == to) {
    std::memmove(out, in, static_cast<std::size_t>(count) * size_of(from));
  } else if (from == DType::kFloat32) {
    detail::convert_from_float(static_cast<const float*>(in), out, to, count);
  } else if (to == DType::kFloat32) {
    detail::convert_to_float(in, from, static_cast<float*>(out), count);
  } else {
    // Between two types other than fp32, through fp32 one block at a time (from fp64 this
    // rounds once to fp32 and again to a 16-bit type; fp64 to fp64 took the memmove above).
    const auto in_size = static_cast<std::int64_t>(size_of(from));
    const auto out_size = static_cast<std::int64_t>(size_of(to));
    float block[256];
    for (std::int64_t done = 0; done < count; done += 256) {
      const std::int64_t n = std::min<std::int64_t>(256, count - done);
      detail::convert_to_float(static_cast<const char*>(in) + done * in_size, from, block, n);
      detail::convert_from_float(block, static_cast<char*>(out) + done * out_size, to, n);
    }
  }
}

}  // namespace zeroshard
