// The memory estimator: one table of per-category rules, each saying how many bytes of one kind
// a rank holds and in which tier, so that a new dimension (a knob, an offload target) is one row.
#include "zeroshard/memory_estimator.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard {

const char* to_string(MemoryTier tier) noexcept {
  switch (tier) {
    case MemoryTier::kDevice:
      return "device";
    case MemoryTier::kHost:
      return "host";
    case MemoryTier::kNvme:
      return "nvme";
  }
  return "unknown";
}

const char* device_memory_meaning() noexcept {
#ifdef ZEROSHARD_WITH_CUDA
  return "device = where the engine keeps its buffers: GPU memory for CUDA ranks, host memory "
         "for CPU ranks";
#else
  return "device = where the engine keeps its buffers; this build has CPU ranks only, so "
         "\"device\" is host memory";
#endif
}

std::int64_t MemoryEstimate::model_state_bytes(MemoryTier tier) const {
  return at(MemoryCategory::kParameters, tier) + at(MemoryCategory::kGradients, tier) +
         at(MemoryCategory::kMasterWeights, tier) + at(MemoryCategory::kOptimizerStates, tier);
}

std::int64_t MemoryEstimate::total(MemoryTier tier) const {
  std::int64_t sum = 0;
  for (std::int64_t b : bytes[static_cast<int>(tier)]) sum += b;
  return sum;
}

std::int64_t MemoryEstimate::host_per_node() const {
  return total(MemoryTier::kHost) * (input.ranks / input.nodes);
}

int optimizer_state_arrays(const std::string& optimizer) {
  std::string name = optimizer;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "adam" || name == "adamw") return 2;
  if (name == "lion" || name == "adagrad") return 1;
  if (name == "sgd") return 0;
  throw ConfigError("optimizer.type",
                    "got \"" + optimizer + "\", expected adam, adamw, sgd, lion or adagrad");
}

namespace {

MemoryTier tier_of(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return MemoryTier::kDevice;
    case OffloadDevice::kCpu:
      return MemoryTier::kHost;
    case OffloadDevice::kNvme:
      return MemoryTier::kNvme;
  }
  return MemoryTier::kDevice;
}

/// The quantities every rule is written in.
struct Terms {
  const EstimateInput& in;
  std::int64_t padded;  ///< P after padding
  std::int64_t shard;   ///< P/N, this rank's share of the padded flat buffer
  std::int64_t d;       ///< bytes per model-precision element
  std::int64_t k;       ///< fp32 optimizer state arrays
  int stage;
  bool optimizer_offloaded;

  /// Elements a per-element buffer has at this stage: whole below `sharded_from`, a shard after.
  std::int64_t elements(int sharded_from) const { return stage >= sharded_from ? shard : padded; }
  std::int64_t largest_tensor() const {
    return in.largest_tensor > 0 ? in.largest_tensor : std::min(in.params, in.reduce_bucket_size);
  }
};

struct Rule {
  MemoryCategory category;
  std::int64_t (*bytes)(const Terms&);
  MemoryTier (*tier)(const Terms&);
};

MemoryTier on_device(const Terms&) { return MemoryTier::kDevice; }
MemoryTier on_host(const Terms&) { return MemoryTier::kHost; }
MemoryTier where_optimizer_lives(const Terms& t) { return tier_of(t.in.offload_optimizer); }
MemoryTier where_params_live(const Terms& t) { return tier_of(t.in.offload_param); }

// The rows below are the engine's allocations (src/engine*.cpp) and DeepSpeed's offload
// semantics. Adding a knob means adding a row, never touching the others.
constexpr Rule kRules[] = {
    // Model-precision parameters: whole below stage 3, this rank's shard at stage 3, where
    // offload_param puts them.
    {MemoryCategory::kParameters, [](const Terms& t) { return t.d * t.elements(3); },
     where_params_live},
    // Stage 3 keeps tensors below the persistence threshold whole on every rank, on the device.
    {MemoryCategory::kParameters,
     [](const Terms& t) { return t.stage == 3 ? t.d * t.in.persistent_params : 0; }, on_device},
    // Model-precision gradients: whole below stage 2, a shard from stage 2, unless the offloaded
    // update keeps the reduced shard on the host instead (next row).
    {MemoryCategory::kGradients,
     [](const Terms& t) { return t.optimizer_offloaded && t.stage >= 2 ? 0 : t.d * t.elements(2); },
     on_device},
    // Offloaded update: it reads an fp32 gradient partition beside the master weights.
    {MemoryCategory::kGradients,
     [](const Terms& t) { return t.optimizer_offloaded ? 4 * t.shard : 0; }, where_optimizer_lives},
    // fp32 master weights: needed with 16-bit parameters, and as the host copy the offloaded
    // update runs on; sharded from stage 1.
    {MemoryCategory::kMasterWeights,
     [](const Terms& t) { return t.d != 4 || t.optimizer_offloaded ? 4 * t.elements(1) : 0; },
     where_optimizer_lives},
    {MemoryCategory::kOptimizerStates, [](const Terms& t) { return 4 * t.k * t.elements(1); },
     where_optimizer_lives},
    // Communication buffers (docs/architecture.md): stage 0 reduces in place; stage 1 receives
    // reduce-scatter results in at most two buckets; stages 2-3 fill two gradient buckets (one
    // filling, one in flight), each as large as a bucket or the largest tensor, plus the
    // receive area for their reduced shards.
    {MemoryCategory::kCommunication,
     [](const Terms& t) -> std::int64_t {
       if (t.stage == 0) return 0;
       const std::int64_t bucket = std::min(t.in.reduce_bucket_size, t.padded);
       if (t.stage == 1) return t.d * 2 * bucket;
       const std::int64_t slot = std::max(bucket, t.largest_tensor());
       return t.d * 2 * (slot + (slot + t.in.ranks - 1) / t.in.ranks);
     },
     on_device},
    // NVMe optimizer offload: pinned host swap buffers, one sub-group tile of fp32 each.
    {MemoryCategory::kOptimizerStates,
     [](const Terms& t) -> std::int64_t {
       if (t.in.offload_optimizer != OffloadDevice::kNvme) return 0;
       return t.in.optimizer_buffer_count * 4 * std::min(t.in.sub_group_size, t.shard);
     },
     on_host},
    // NVMe parameter offload: pinned host swap buffers of model-precision elements.
    {MemoryCategory::kParameters,
     [](const Terms& t) -> std::int64_t {
       if (t.in.offload_param != OffloadDevice::kNvme) return 0;
       return t.in.param_buffer_count * t.d * t.in.param_buffer_size;
     },
     on_host},
    {MemoryCategory::kActivations, [](const Terms& t) { return t.in.activation_bytes; }, on_device},
};

void check_input(const EstimateInput& in) {
  if (in.params < 0) {
    throw ConfigError("params", "got " + std::to_string(in.params) + ", expected >= 0");
  }
  if (in.ranks < 1) {
    throw ConfigError("ranks", "got " + std::to_string(in.ranks) + ", expected >= 1");
  }
  if (in.nodes < 1 || in.ranks % in.nodes != 0) {
    throw ConfigError("nodes", "got " + std::to_string(in.nodes) +
                                   ", expected a divisor of the rank count " +
                                   std::to_string(in.ranks));
  }
  if (in.stage < 0 || in.stage > 3) {
    throw ConfigError("zero_optimization.stage",
                      "got " + std::to_string(in.stage) + ", expected 0..3");
  }
  if (in.padded_params != 0 && in.padded_params < in.params) {
    throw ConfigError("padded_params", "got " + std::to_string(in.padded_params) +
                                           ", expected 0 or >= params " +
                                           std::to_string(in.params));
  }
}

/// DeepSpeed's rules for where offload is allowed; empty when this combination is.
std::string offload_restriction(const EstimateInput& in) {
  if (in.offload_optimizer != OffloadDevice::kNone && in.stage == 0) {
    return "offload_optimizer needs ZeRO stage 1, 2 or 3";
  }
  if (in.offload_optimizer == OffloadDevice::kNvme && in.stage != 3) {
    return "offload_optimizer to nvme needs ZeRO stage 3";
  }
  if (in.offload_param != OffloadDevice::kNone && in.stage != 3) {
    return "offload_param needs ZeRO stage 3";
  }
  return {};
}

}  // namespace

MemoryEstimate estimate(const EstimateInput& input) {
  check_input(input);
  MemoryEstimate result;
  result.input = input;
  result.reason = offload_restriction(input);
  if (!result.reason.empty()) {
    result.valid = false;
    return result;
  }
  const std::int64_t n = input.ranks;
  const std::int64_t padded =
      input.padded_params != 0 ? input.padded_params : (input.params + n - 1) / n * n;
  const Terms terms{
      .in = input,
      .padded = padded,
      .shard = (padded + n - 1) / n,
      .d = static_cast<std::int64_t>(size_of(input.precision)),
      .k = input.optimizer_state_arrays >= 0 ? input.optimizer_state_arrays
                                             : optimizer_state_arrays(input.optimizer),
      .stage = input.stage,
      .optimizer_offloaded = input.offload_optimizer != OffloadDevice::kNone,
  };
  for (const Rule& rule : kRules) {
    result.bytes[static_cast<int>(rule.tier(terms))][static_cast<int>(rule.category)] +=
        rule.bytes(terms);
  }
  if (input.stage == 3) {
    const std::int64_t gathered =
        input.gathered_params > 0 ? input.gathered_params : terms.largest_tensor();
    result.transient_device_bytes = terms.d * gathered;
    result.notes.push_back("gathers a module of " + std::to_string(gathered) +
                           " elements at a time (transient, in the device peak)");
  }
  if (input.offload_optimizer != OffloadDevice::kNone ||
      input.offload_param != OffloadDevice::kNone) {
    result.notes.push_back(
        "offload follows DeepSpeed's semantics; the engine does not implement it yet");
  }
  return result;
}

EstimateInput estimate_input_from_config(const Config& config, std::int64_t params, int ranks) {
  const ZeroConfig& zero = config.zero_optimization;
  EstimateInput in;
  in.params = params;
  in.ranks = ranks;
  in.stage = zero.stage;
  in.precision = config.fp16.enabled   ? DType::kFloat16
                 : config.bf16.enabled ? DType::kBFloat16
                                       : DType::kFloat32;
  if (!config.optimizer.type.empty()) {
    in.optimizer = config.optimizer.type;
    const auto& p = config.optimizer.params;
    const auto amsgrad = p.find("amsgrad");
    const auto momentum = p.find("momentum");
    in.optimizer_state_arrays = optimizer_state_arrays(in.optimizer);
    if (amsgrad != p.end() && amsgrad->second != 0.0 && in.optimizer_state_arrays == 2) {
      in.optimizer_state_arrays = 3;
    }
    if (momentum != p.end() && momentum->second != 0.0 && in.optimizer_state_arrays == 0) {
      in.optimizer_state_arrays = 1;
    }
  }
  in.offload_optimizer = zero.offload_optimizer.device;
  in.offload_param = zero.offload_param.device;
  in.reduce_bucket_size = zero.reduce_bucket_size;
  in.allgather_bucket_size = zero.allgather_bucket_size;
  in.optimizer_buffer_count = zero.offload_optimizer.buffer_count;
  in.sub_group_size = zero.sub_group_size;
  in.param_buffer_count = zero.offload_param.buffer_count;
  in.param_buffer_size = zero.offload_param.buffer_size;
  return in;
}

MemoryEstimate estimate_from_config(const Config& config, std::int64_t params, int ranks) {
  MemoryEstimate result = estimate(estimate_input_from_config(config, params, ranks));
  if (config.optimizer.type.empty()) {
    result.notes.push_back("the config names no optimizer; assumed adamw (2 state arrays)");
  }
  return result;
}

std::int64_t largest_model(std::int64_t device_bytes_per_rank, const EstimateInput& base) {
  EstimateInput in = base;
  in.padded_params = 0;
  const auto fits = [&](std::int64_t params) {
    in.params = params;
    const MemoryEstimate e = estimate(in);
    return e.valid && e.device_peak() <= device_bytes_per_rank;
  };
  if (!fits(0)) return 0;
  // Device bytes grow monotonically with P, so bracket the answer by doubling, then bisect.
  std::int64_t low = 0;
  std::int64_t high = 1;
  while (fits(high)) {
    low = high;
    if (high > (std::int64_t{1} << 61)) return high;
    high *= 2;
  }
  while (high - low > 1) {
    const std::int64_t mid = low + (high - low) / 2;
    (fits(mid) ? low : high) = mid;
  }
  return low;
}

std::int64_t largest_model(std::int64_t device_bytes_per_rank, int ranks, int stage,
                           DType precision, const std::string& optimizer) {
  EstimateInput in;
  in.ranks = ranks;
  in.stage = stage;
  in.precision = precision;
  in.optimizer = optimizer;
  return largest_model(device_bytes_per_rank, in);
}

}  // namespace zeroshard
