// Frozen parameter storage: plain, or int8 blocks encoded at store() and decoded on demand.
#include "engine/frozen_params.h"

#include <cmath>
#include <vector>

#include "layout/quantized_block_format.h"  // quantized_units, QuantBits
#include "precision/half_conversion.h"
#include "util/check.h"

namespace zeroshard::detail {

namespace {

// The bits qwZ gathers parameters in: an error of at most max|block| / 254 per element.
constexpr QuantBits kFrozenBits = QuantBits::kInt8;

// Each encoding starts on 4 bytes: its fp32 scales come first.
std::int64_t encoded_bytes(std::int64_t count) { return quantized_units(count, kFrozenBits) * 4; }

}  // namespace

FrozenParams::FrozenParams(const EngineContext& context, bool quantized)
    : context_(context),
      quantized_(quantized),
      encoded_offset_(context.params.size(), 0),
      decoded_offset_(context.params.size(), 0),
      module_elements_(context.modules.size(), 0) {
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < context_.params.size(); ++i) {
    const ParamInfo& p = context_.params[i];
    if (p.trainable) continue;
    if (!quantized_) {
      bytes =
          std::max(bytes, (p.frozen_offset + p.numel) * static_cast<std::int64_t>(context_.dsize));
      continue;
    }
    encoded_offset_[i] = bytes;
    bytes += encoded_bytes(p.numel);
    decoded_offset_[i] = module_elements_[p.module];
    module_elements_[p.module] += p.numel;
  }
  // Zero bytes encode zeros (scale 0), so an unset parameter reads 0 either way.
  storage_ = context_.allocate(Tier::kDevice, MemoryCategory::kParameters,
                               static_cast<std::size_t>(bytes));
}

void* FrozenParams::data(int index) {
  return storage_.as<char>() +
         context_.params[index].frozen_offset * static_cast<std::int64_t>(context_.dsize);
}

void FrozenParams::store(int index, const float* values) {
  const ParamInfo& p = context_.params[index];
  const MemoryLocation device = context_.backend.memory().location();
  if (!quantized_) {
    context_.store_host_values(values, data(index), device, p.numel);
    return;
  }
  // Checked on the host, in the model's type (a large fp32 value rounds to an fp16 inf), before
  // anything is written: the format encodes a block holding inf or NaN as zeros.
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  std::vector<char> rounded(static_cast<std::size_t>(p.numel * dsize));
  std::vector<float> widened(static_cast<std::size_t>(p.numel));
  convert_from_float(values, rounded.data(), context_.dtype, p.numel);
  convert_to_float(rounded.data(), context_.dtype, widened.data(), p.numel);
  std::int64_t nonfinite = 0;
  std::int64_t first = -1;
  for (std::int64_t i = 0; i < p.numel; ++i) {
    if (std::isfinite(widened[i])) continue;
    if (first < 0) first = i;
    ++nonfinite;
  }
  ZEROSHARD_CHECK_USAGE(nonfinite == 0,
                        "frozen parameter '"
                            << p.name << "' holds " << nonfinite << " inf or NaN value(s) (first "
                            << widened[first] << " at element " << first
                            << ") in the model's type; zero_quantized_nontrainable_weights "
                               "stores it as int8 blocks, which would turn them into zeros: "
                               "give it finite values, or turn the key off");
  // The encoder reads device memory and counts non-finite blocks into a device int, which the
  // check above has made zero.
  TrackedBuffer staging = TrackedBuffer::uninitialized(
      context_.tracker, MemoryCategory::kParameters,
      sizeof(float) + static_cast<std::size_t>(p.numel * dsize), context_.resource(Tier::kDevice));
  char* staged = staging.as<char>() + sizeof(float);
  context_.transfer(staged, device, rounded.data(), MemoryLocation::kHost, rounded.size());
  context_.backend.quantize_blocks(staged, context_.dtype, p.numel, kFrozenBits,
                                   storage_.as<char>() + encoded_offset_[index], staging.as<int>());
  // The staging buffer is freed on return, in stream order after the encoder that reads it.
}

void FrozenParams::read(int index, float* out) {
  const ParamInfo& p = context_.params[index];
  std::vector<char> raw(static_cast<std::size_t>(p.numel) * context_.dsize);
  if (!quantized_) {
    context_.backend.copy_to_host(raw.data(), data(index), raw.size());
  } else {
    TrackedBuffer decoded =
        TrackedBuffer::uninitialized(context_.tracker, MemoryCategory::kParameters, raw.size(),
                                     context_.resource(Tier::kDevice));
    decode(index, decoded.data());
    context_.backend.copy_to_host(raw.data(), decoded.data(), raw.size());
  }
  convert_to_float(raw.data(), context_.dtype, out, p.numel);
}

void FrozenParams::decode(int index, void* out) {
  context_.backend.dequantize_blocks(storage_.as<char>() + encoded_offset_[index], kFrozenBits,
                                     context_.params[index].numel, out, context_.dtype);
}

TrackedBuffer FrozenParams::decode_module(ModuleId module) {
  const auto dsize = static_cast<std::int64_t>(context_.dsize);
  // Every element is decoded into, so a zero fill would be a wasted pass.
  TrackedBuffer decoded = TrackedBuffer::uninitialized(
      context_.tracker, MemoryCategory::kParameters,
      static_cast<std::size_t>(module_elements_[module] * dsize), context_.resource(Tier::kDevice));
  for (std::size_t i = 0; i < context_.params.size(); ++i) {
    const ParamInfo& p = context_.params[i];
    if (p.trainable || p.module != module) continue;
    decode(static_cast<int>(i), decoded.as<char>() + decoded_offset_[i] * dsize);
  }
  return decoded;
}

}  // namespace zeroshard::detail
