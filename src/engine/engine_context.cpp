// Tier resources and copies between tiers for the engine's components.
#include "engine/engine_context.h"

#include <cstring>
#include <vector>

#include "precision/half_conversion.h"

namespace zeroshard::detail {

MemoryResource& EngineContext::resource(Tier tier) const {
  switch (tier) {
    case Tier::kDevice:
      return backend.memory();
    case Tier::kPinnedHost:
      return backend.pinned_host_memory();
    case Tier::kPageableHost:
      break;
  }
  return host_memory();
}

TrackedBuffer EngineContext::allocate(Tier tier, MemoryCategory category, std::size_t bytes) const {
  return TrackedBuffer(tracker, category, bytes, resource(tier));
}

void EngineContext::transfer(void* destination, MemoryLocation destination_location,
                             const void* source, MemoryLocation source_location,
                             std::size_t bytes) const {
  const bool to_device = destination_location == MemoryLocation::kDevice;
  const bool from_device = source_location == MemoryLocation::kDevice;
  if (to_device && from_device) {
    backend.copy(destination, source, bytes);
  } else if (to_device) {
    backend.copy_from_host(destination, source, bytes);
  } else if (from_device) {
    backend.copy_to_host(destination, source, bytes);
  } else if (bytes > 0 && destination != source) {
    std::memcpy(destination, source, bytes);
  }
}

void EngineContext::store_host_values(const float* values, void* destination,
                                      MemoryLocation location, std::int64_t count) const {
  if (dtype == DType::kFloat32) {
    transfer(destination, location, values, MemoryLocation::kHost, count * sizeof(float));
    return;
  }
  std::vector<char> rounded(count * dsize);
  convert_from_float(values, rounded.data(), dtype, count);
  transfer(destination, location, rounded.data(), MemoryLocation::kHost, rounded.size());
}

}  // namespace zeroshard::detail
