// offload_optimizer.ratio "auto": after the first step, the largest share of the optimizer shard
// that fits the device memory that step left free moves from the host to the device.
#include <algorithm>
#include <iomanip>
#include <string>

#include "engine/engine_state.h"
#include "layout/shard_layout.h"
#include "util/log.h"
#include "util/text.h"
#include "zeroshard/error.h"
#include "zeroshard/memory_estimator.h"
#include "zeroshard/quantity.h"

namespace zeroshard::detail {

std::int64_t EngineState::auto_host_elements(std::int64_t owned, std::string& reason) {
  const OffloadConfig& offload = config_.zero_optimization.offload_optimizer;
  const std::optional<DeviceMemoryUse> device = backend_->device_memory();
  if (!device) {
    reason = "the device has no memory limit (CPU ranks; ZEROSHARD_DEVICE_MEMORY rehearses one)";
    return owned;
  }
  // What the first step held at once: the engine's own peak, which on CPU ranks shares host
  // memory with the optimizer's host part, or all the driver counts in use now (caching
  // allocators keep their peak), whichever is more.
  const MemoryLocation where = backend_->memory().location();
  std::int64_t engine_peak = tracker_.counted(rank_, world_).total_peak[static_cast<int>(where)];
  if (where == MemoryLocation::kHost) engine_peak -= optimizer_->host_bytes();
  const std::int64_t in_use = std::max(engine_peak, device->in_use);
  const auto usable = static_cast<std::int64_t>(static_cast<double>(device->total) *
                                                (1.0 - offload.auto_ratio_margin));
  const std::int64_t spare = usable - in_use;
  EstimateInput in = estimate_input_from_config(config_, 0, world_);
  for (int t = 0; t < layout_.tensor_count(); ++t) in.tensors.push_back(layout_.numel(t));
  in.optimizer_state_arrays = rule_->state_count();
  const double ratio = smallest_offload_ratio(spare, in);
  reason = "the first step's peak " + format_binary_bytes(in_use) + " of the device's " +
           format_binary_bytes(device->total) + ", less auto_ratio_margin " +
           format_number(offload.auto_ratio_margin) + ", leaves " +
           format_binary_bytes(std::max<std::int64_t>(0, spare));
  return split_optimizer(true, ratio, owned).host;
}

void EngineState::settle_auto_offload_ratio() {
  settles_offload_ratio_ = false;
  const std::int64_t owned = optimizer_->owned_end() - optimizer_->owned_begin();
  std::string reason;
  std::int64_t host = auto_host_elements(owned, reason);
  // Every rank keeps the most any rank needs on the host, so that they step alike; and at least
  // one aligned run, so that the shard stays offloaded as the rest of the engine was built for.
  for (const std::string& text : all_gather_text(std::to_string(host))) {
    host = std::max<std::int64_t>(host, std::stoll(text));
  }
  host = std::clamp(host, std::min(owned, kTensorAlignment), owned);
  if (host < owned) {
    try {
      optimizer_->keep_on_host(host);
    } catch (const OutOfMemoryError& error) {
      // This rank goes on at ratio 1, as it was: ranks may split differently, which changes no
      // result.
      ZEROSHARD_LOG(kWarning, "offload_optimizer.ratio \"auto\": rank "
                                  << rank_ << " keeps ratio 1, its device could not take "
                                  << owned - host << " elements: " << error.what());
    }
  }
  if (rank_ != 0) return;
  const double ratio =
      owned > 0 ? static_cast<double>(optimizer_->host_elements()) / static_cast<double>(owned)
                : 1.0;
  ZEROSHARD_LOG(kProgress, "offload_optimizer.ratio \"auto\": "
                               << std::setprecision(3) << ratio << " ("
                               << optimizer_->host_elements() << " of " << owned
                               << " owned elements on the host): " << reason);
}

}  // namespace zeroshard::detail
