// Names of the element types.
#include "zeroshard/dtype.h"

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

}  // namespace zeroshard
