// The frozen parameters (trainable = false): whole on every rank, in the model's type, or under
// zero_quantized_nontrainable_weights as int8 blocks that are decoded while their module is
// gathered.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine_context.h"

namespace zeroshard::detail {

class FrozenParams {
 public:
  /// Allocates every frozen parameter, encoded when `quantized`.
  FrozenParams(const EngineContext& context, bool quantized);

  bool quantized() const noexcept { return quantized_; }
  /// Not quantized: where frozen parameter `index` lives, numel elements of the model's type.
  void* data(int index);
  /// Sets frozen parameter `index` from host fp32 values, rounded to the model's type (and
  /// encoded). Quantized: UsageError naming the parameter when a value is inf or NaN in the
  /// model's type, which the format would store as zero; the stored values are then unchanged.
  void store(int index, const float* values);
  /// Host fp32 values of frozen parameter `index`: what the model reads (decoded when quantized).
  void read(int index, float* out);
  /// Quantized: the elements of module `module`'s frozen parameters.
  std::int64_t module_elements(ModuleId module) const { return module_elements_[module]; }
  /// Quantized: a new buffer of module_elements(module) elements of the model's type, holding the
  /// module's frozen parameters decoded in registration order.
  TrackedBuffer decode_module(ModuleId module);
  /// Quantized: decodes frozen parameter `index` into `out` (numel elements of the model's type,
  /// device memory).
  void decode(int index, void* out);
  /// Quantized: where frozen parameter `index` starts in its module's decoded buffer.
  std::int64_t decoded_offset(int index) const { return decoded_offset_[index]; }

 private:
  const EngineContext& context_;
  bool quantized_;
  /// Every frozen parameter: the model's type at frozen_offset, or each one's encoding at
  /// encoded_offset_, which starts on 4 bytes as the format's fp32 scales need.
  TrackedBuffer storage_;
  std::vector<std::int64_t> encoded_offset_;   ///< by parameter index, bytes
  std::vector<std::int64_t> decoded_offset_;   ///< by parameter index, elements
  std::vector<std::int64_t> module_elements_;  ///< by module
};

}  // namespace zeroshard::detail
