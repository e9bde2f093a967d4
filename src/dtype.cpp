// Names of the element types, and the public face of the fp32 <-> 16-bit conversions.
#include "zeroshard/dtype.h"

#include "half_conversion.h"

namespace zeroshard {

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown dtype";
}

void to_float(const void* in, DType from, float* out, std::int64_t count) noexcept {
  detail::convert_to_float(in, from, out, count);
}

void from_float(const float* in, void* out, DType to, std::int64_t count) noexcept {
  detail::convert_from_float(in, out, to, count);
}

}  // namespace zeroshard
