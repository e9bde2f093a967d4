// What the example models' math objects (MlpMath, GptMath) share: the choice of one for a device,
// and on the CPU the data moves, which are plain host calls there.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/error.h"

namespace zeroshard::examples {

/// A model's math interface `Math` with the CPU's data moves filled in: no stream (the engine
/// then orders nothing after the model's work), conversions by zeroshard::convert(), copies and
/// uploads by memcpy.
template <class Math>
class CpuDataMoves : public Math {
 public:
  void* stream() const noexcept override { return nullptr; }

  void convert(const void* in, DType from, void* out, DType to, std::int64_t count) override {
    zeroshard::convert(in, from, out, to, count);
  }

  void copy(void* destination, const void* source, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(destination, source, bytes);
  }

  void upload(void* destination, const void* host, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(destination, host, bytes);
  }
};

/// The math for `device`: `make_cpu()` on the CPU, `make_cuda(index)` on a GPU. Where the
/// example was built without CUDA (`make_cuda` null) a GPU is a UsageError naming `example`.
template <class Math>
std::unique_ptr<Math> make_math_for(const Device& device, const char* example,
                                    std::unique_ptr<Math> (*make_cpu)(),
                                    std::unique_ptr<Math> (*make_cuda)(int)) {
  if (!device.is_cuda()) return make_cpu();
  if (make_cuda == nullptr) {
    throw UsageError(std::string("the ") + example +
                     " example was built without CUDA; it cannot compute on " + device.to_string());
  }
  return make_cuda(device.index);
}

}  // namespace zeroshard::examples
