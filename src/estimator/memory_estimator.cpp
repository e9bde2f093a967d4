// The memory estimator: one table of per-category rules, each saying how many bytes of one kind
// a rank holds and in which tier, so that a new dimension (a knob, an offload target) is one row.
#include "zeroshard/memory_estimator.h"

#include <algorithm>
#include <string>

#include "comm/quantized_reduce_scatter.h"  // quantized_reduce_scatter_bytes
#include "kernels/cpu/cpu_optimizer.h"      // tile_sums_bytes
#include "layout/host_staging_size.h"       // host_staging_half_bytes
#include "layout/quantized_block_format.h"  // quantized_units
#include "layout/shard_layout.h"
#include "offload/nvme_swapper.h"  // swap_record_bytes
#include "util/text.h"
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
  const std::string name = detail::ascii_lower(optimizer);
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

bool swaps_optimizer(const EstimateInput& in) {
  return in.offload_optimizer == OffloadDevice::kNvme;
}

/// Calls visit(numel, kept_whole) for each of `in.tensors` in registration order, kept_whole when
/// stage 3 keeps the tensor whole on every rank, as the engine chooses: below
/// stage3_param_persistence_threshold, up to model_persistence_threshold elements in all.
template <class Visit>
void for_each_tensor(const EstimateInput& in, Visit visit) {
  std::int64_t kept = 0;
  for (std::int64_t numel : in.tensors) {
    const bool whole =
        numel < in.param_persistence_threshold && kept + numel <= in.model_persistence_threshold;
    if (whole) kept += numel;
    visit(numel, whole);
  }
}

/// The quantities every rule is written in.
struct Terms {
  const EstimateInput& in;
  std::int64_t padded;      ///< P after the engine's padding
  std::int64_t shard;       ///< padded / N
  std::int64_t bucket;      ///< elements of the widest gradient bucket
  std::int64_t receive;     ///< elements of the largest share of a bucket one rank receives
  std::int64_t persistent;  ///< stage 3: elements kept whole
  std::int64_t d;           ///< bytes per model-precision element
  std::int64_t k;           ///< fp32 optimizer state arrays
  int stage;
  bool optimizer_offloaded;

  /// Elements a per-element buffer has at this stage: whole below `sharded_from`, a shard after.
  std::int64_t elements(int sharded_from) const { return stage >= sharded_from ? shard : padded; }
  /// Elements of the flat buffer this rank updates: all of it at stage 0, its shard otherwise.
  std::int64_t updated() const { return elements(1); }
  /// updated() divided between the optimizer's host part (all of it at ratio 1) and its device
  /// part.
  detail::OptimizerSplit split() const {
    return detail::split_optimizer(optimizer_offloaded, in.offload_ratio, updated());
  }
  std::int64_t host_share() const { return split().host; }
  std::int64_t device_share() const { return split().device; }
  /// The engine's parts of the shard, as the engine splits it.
  bool has_host_part() const { return split().host_part; }
  bool has_device_part() const { return split().device_part; }
  /// Sets of master and states of the host's share: two with super_offload, whose update during
  /// backward writes the second while the first stays as it was until the step keeps or drops it.
  std::int64_t update_copies() const {
    return in.super_offload && in.offload_optimizer == OffloadDevice::kCpu ? 2 : 1;
  }
  /// Bytes per element of the reduced gradient shard, in the type gradients accumulate in
  /// wherever it lives: fp32 under grad_accum_dtype fp32, the model's type otherwise.
  std::int64_t grad_shard_element() const { return in.fp32_grad_accumulation ? 4 : d; }
  /// Stages 0-1 with 16-bit gradients and grad_accum_dtype fp32: an fp32 accumulator of the whole
  /// gradients beside the buffer the model writes, reduced as it is (DeepSpeed's BF16_Optimizer).
  bool accumulates_whole_in_fp32() const {
    return stage < 2 && in.fp32_grad_accumulation && d != 4;
  }
  /// The fp32 chunk 16-bit gradients are widened in, in a part of `elements` elements.
  std::int64_t scratch_bytes(std::int64_t elements) const {
    if (d == 4) return 0;
    return 4 *
           std::max<std::int64_t>(2, std::min({elements, sub_group(), kGradientScratchElements}));
  }
  /// offload_optimizer nvme: one record of a swap file whose slots hold `arrays` fp32 tiles of
  /// one sub-group each (the master's file has 1, the states' file k).
  std::int64_t swap_record(std::int64_t arrays) const {
    return detail::swap_record_bytes(arrays * 4 * swap_tile());
  }
  /// Elements of a sub-group: sub_group_size, or with 0 (DeepSpeed's one parameter per
  /// sub-group) the largest trainable tensor, the engine's bound for that case.
  std::int64_t sub_group() const {
    if (in.sub_group_size > 0) return in.sub_group_size;
    if (!in.tensors.empty()) return largest_tensor();
    return in.largest_tensor > 0 ? in.largest_tensor : in.params;
  }
  /// The largest trainable tensor the input knows of: of `tensors` when given, else
  /// `largest_tensor` (0: unknown).
  std::int64_t largest_tensor() const {
    if (in.tensors.empty()) return in.largest_tensor;
    return *std::max_element(in.tensors.begin(), in.tensors.end());
  }
  /// Elements per swap slot: a sub-group, or the whole updated range when that is smaller.
  std::int64_t swap_tile() const {
    return std::max<std::int64_t>(1, std::min(sub_group(), updated()));
  }
  /// hpZ: the elements of this rank's piece of every gathered tensor.
  std::int64_t secondary_partition() const {
    const std::int64_t k = in.hpz_partition_size;
    if (stage != 3 || k <= 1) return 0;
    if (in.tensors.empty()) return (in.params - persistent + k - 1) / k;
    std::int64_t total = 0;
    for_each_tensor(in, [&](std::int64_t numel, bool kept_whole) {
      if (!kept_whole) total += (numel + k - 1) / k;
    });
    return total;
  }
  /// offload_param nvme: shard elements past max_in_cpu, in the parameter swap file.
  std::int64_t params_swapped() const {
    if (stage != 3 || in.offload_param != OffloadDevice::kNvme) return 0;
    return std::max<std::int64_t>(0, shard - in.param_max_in_cpu);
  }
  std::int64_t param_tile() const {
    return std::max<std::int64_t>(1, std::min(in.param_buffer_size, params_swapped()));
  }
  std::int64_t param_tiles() const { return (params_swapped() + param_tile() - 1) / param_tile(); }
  std::int64_t param_record() const { return detail::swap_record_bytes(param_tile() * d); }
  /// The swap file: two records (the current generation and the one being written) per slot.
  std::int64_t swap_file(std::int64_t arrays) const {
    const std::int64_t tile = swap_tile();
    const std::int64_t slots = std::max<std::int64_t>(1, (updated() + tile - 1) / tile);
    return arrays == 0 ? 0 : 2 * slots * swap_record(arrays);
  }
};

ActivationEstimate chain_activations(const EstimateInput& in) {
  return estimate_activations(in.layer_activation_bytes, in.layers, in.checkpoint_every,
                              in.cpu_checkpointing);
}

struct Rule {
  MemoryCategory category;
  std::int64_t (*bytes)(const Terms&);
  MemoryTier (*tier)(const Terms&);
};

MemoryTier on_device(const Terms&) { return MemoryTier::kDevice; }
MemoryTier on_host(const Terms&) { return MemoryTier::kHost; }
MemoryTier where_optimizer_lives(const Terms& t) { return tier_of(t.in.offload_optimizer); }
// Under nvme the shard's first max_in_cpu elements stay in host memory; the swap rows hold the
// rest.
MemoryTier where_params_live(const Terms& t) {
  return t.in.offload_param == OffloadDevice::kNvme ? MemoryTier::kHost
                                                    : tier_of(t.in.offload_param);
}

// One row per buffer the engine allocates (src/engine/engine.cpp finalize(),
// src/engine/grad_bucketer.cpp), plus DeepSpeed's offload placement. A new knob is a new row; no
// row looks at another.
constexpr Rule kRules[] = {
    // Model-precision parameters: whole below stage 3, this rank's shard at stage 3, where
    // offload_param puts them.
    {MemoryCategory::kParameters,
     [](const Terms& t) { return t.d * (t.elements(3) - t.params_swapped()); }, where_params_live},
    // Stage 3 also keeps tensors below the persistence threshold whole on every rank.
    {MemoryCategory::kParameters,
     [](const Terms& t) { return t.stage == 3 ? t.d * t.persistent : 0; }, on_device},
    // hpZ: the secondary partition, 1/K of every module gathered in the step, from its first
    // gather to the update, each module's range rounded up on its own. The input knows tensors,
    // not modules: this is exact for modules of one tensor each.
    {MemoryCategory::kParameters, [](const Terms& t) { return t.d * t.secondary_partition(); },
     on_device},
    // Frozen parameters: whole on every rank at every stage; under
    // zero_quantized_nontrainable_weights as int8 blocks, padded to 4 bytes (exact for one tensor:
    // the engine encodes each on its own).
    {MemoryCategory::kParameters,
     [](const Terms& t) -> std::int64_t {
       if (!t.in.quantized_nontrainable_weights || t.stage != 3) return t.d * t.in.frozen_params;
       if (t.in.frozen_params == 0) return 0;
       return detail::quantized_units(t.in.frozen_params, detail::QuantBits::kInt8) * 4;
     },
     on_device},
    // super_offload: the host's share of the parameters, as the update during backward rounds
    // them, copied in when the step keeps that update.
    {MemoryCategory::kParameters,
     [](const Terms& t) -> std::int64_t {
       return t.update_copies() == 2 && t.has_host_part() ? t.d * t.host_share() : 0;
     },
     on_host},
    // Gradients: whole below stage 2 (model precision, and their fp32 accumulator); from stage 2
    // the reduced shard's device share. The host's share lives beside the offloaded update (at
    // stage 1 too, beside the whole gradients).
    {MemoryCategory::kGradients,
     [](const Terms& t) -> std::int64_t {
       if (t.stage < 2) return (t.d + (t.accumulates_whole_in_fp32() ? 4 : 0)) * t.padded;
       return t.grad_shard_element() * t.device_share();
     },
     on_device},
    {MemoryCategory::kGradients,
     [](const Terms& t) { return t.grad_shard_element() * t.host_share(); }, on_host},
    // 16-bit gradients are widened to fp32 one chunk at a time for the update, in each part: a
    // bounded working buffer, counted under communication so that the model states are the
    // paper's figures.
    {MemoryCategory::kCommunication,
     [](const Terms& t) { return t.has_device_part() ? t.scratch_bytes(t.device_share()) : 0; },
     on_device},
    {MemoryCategory::kCommunication,
     [](const Terms& t) { return t.has_host_part() ? t.scratch_bytes(t.host_share()) : 0; },
     on_host},
    // fp32 master weights: needed beside 16-bit parameters, and as the copy an offloaded update
    // runs on; sharded from stage 1. The device's share of an fp32 model is the parameters.
    {MemoryCategory::kMasterWeights,
     [](const Terms& t) -> std::int64_t { return t.d != 4 ? 4 * t.device_share() : 0; }, on_device},
    {MemoryCategory::kMasterWeights,
     [](const Terms& t) -> std::int64_t {
       if (swaps_optimizer(t.in)) return t.swap_file(1);
       return t.update_copies() * 4 * t.host_share();
     },
     where_optimizer_lives},
    {MemoryCategory::kOptimizerStates, [](const Terms& t) { return 4 * t.k * t.device_share(); },
     on_device},
    {MemoryCategory::kOptimizerStates,
     [](const Terms& t) {
       return swaps_optimizer(t.in) ? t.swap_file(t.k)
                                    : t.update_copies() * 4 * t.k * t.host_share();
     },
     where_optimizer_lives},
    // Communication slots, at most two (one bucket reducing while the next fills): from stage 2
    // the bucket itself, as gradients go straight into it. Every reduce-scatter writes this
    // rank's part in place in what it sends (or into the gradient shard), so no slot has a
    // receive area.
    {MemoryCategory::kCommunication,
     [](const Terms& t) -> std::int64_t {
       const std::int64_t input = t.stage >= 2 ? t.bucket : 0;
       // communication_data_type fp32 with 16-bit gradients: an fp32 send area for the whole
       // bucket, unless they are summed in fp32 already.
       const bool widened = t.in.fp32_communication && t.d != 4 && !t.accumulates_whole_in_fp32();
       const std::int64_t send = widened ? t.bucket : 0;
       return 2 * (t.d * input + 4 * send);
     },
     on_device},
    // Offloaded update: two pinned staging halves, each a reduced bucket's share arriving (in the
    // type it is reduced in from stage 2, in the one it accumulates in below) or a tile of updated
    // parameters
    // leaving for the device (not with offload_param, which keeps them on the host); on either
    // backend, as the engine allocates them.
    {MemoryCategory::kCommunication,
     [](const Terms& t) -> std::int64_t {
       if (!t.has_host_part()) return 0;
       const bool widened =
           (t.stage >= 2 && t.in.fp32_communication && t.d != 4) || t.accumulates_whole_in_fp32();
       return 2 * detail::host_staging_half_bytes(t.receive * (widened ? 4 : t.d),
                                                  t.in.offload_param == OffloadDevice::kNone,
                                                  t.host_share(), t.in.sub_group_size, t.d);
     },
     on_host},
    // One micro-step per window: the offloaded scan's sums of the host share's whole tiles, taken
    // as their gradients land (a working buffer, as the device's norm reduction scratch is).
    {MemoryCategory::kCommunication,
     [](const Terms& t) -> std::int64_t {
       if (!t.has_host_part() || t.in.gradient_accumulation_steps != 1) return 0;
       return detail::cpu_optimizer::tile_sums_bytes(t.host_share());
     },
     on_host},
    // NVMe optimizer offload: buffer_count pinned records of each swap file (master, states).
    {MemoryCategory::kMasterWeights,
     [](const Terms& t) -> std::int64_t {
       return swaps_optimizer(t.in) ? t.in.optimizer_buffer_count * t.swap_record(1) : 0;
     },
     on_host},
    {MemoryCategory::kOptimizerStates,
     [](const Terms& t) -> std::int64_t {
       if (!swaps_optimizer(t.in) || t.k == 0) return 0;
       return t.in.optimizer_buffer_count * t.swap_record(t.k);
     },
     on_host},
    // NVMe parameter offload: pinned swap buffers of one tile each (no more than there are
    // tiles), and the file (two records per tile).
    {MemoryCategory::kParameters,
     [](const Terms& t) -> std::int64_t {
       return std::min(t.in.param_buffer_count, t.param_tiles()) * t.param_record();
     },
     on_host},
    {MemoryCategory::kParameters,
     [](const Terms& t) -> std::int64_t { return 2 * t.param_tiles() * t.param_record(); },
     [](const Terms&) { return MemoryTier::kNvme; }},
    {MemoryCategory::kActivations,
     [](const Terms& t) { return t.in.activation_bytes + chain_activations(t.in).device; },
     on_device},
    // cpu_checkpointing: the chain's kept inputs, in pinned host memory.
    {MemoryCategory::kActivations, [](const Terms& t) { return chain_activations(t.in).host; },
     on_host},
};

}  // namespace

ActivationEstimate estimate_activations(std::int64_t layer_activation_bytes, int layers,
                                        int checkpoint_every, bool cpu_checkpointing) {
  if (layer_activation_bytes < 0 || layers < 0 || checkpoint_every < 0) {
    throw ConfigError("activation_checkpointing",
                      "estimate_activations: got layer bytes " +
                          std::to_string(layer_activation_bytes) + ", layers " +
                          std::to_string(layers) + ", checkpoint every " +
                          std::to_string(checkpoint_every) + "; expected none negative");
  }
  ActivationEstimate estimate;
  if (layers == 0) return estimate;
  const std::int64_t a = layer_activation_bytes;
  if (checkpoint_every == 0) {
    estimate.device = (layers + 1) * a;  // the input and every layer's output, kept for backward
    return estimate;
  }
  const std::int64_t block = std::min(checkpoint_every, layers);
  const std::int64_t kept = (layers + checkpoint_every - 1) / checkpoint_every;
  const std::int64_t last_block = layers - (kept - 1) * block;
  if (cpu_checkpointing) {
    // The running block's input and activations, and from the second block on one more input
    // with a copy in flight: the previous block's going out in forward, the next block's coming
    // back in backward (the first block has neither). The host keeps every input until the
    // backward pass ends.
    const std::int64_t later_block = kept >= 3 ? block : last_block;
    estimate.device = (kept == 1 ? 1 + block : std::max(1 + block, 2 + later_block)) * a;
    estimate.host = kept * a;
  } else {
    // While block j runs (its forward, or its recompute in backward) j + 1 inputs are kept: the
    // peak is the last block's, or the last full one's when the last is shorter.
    estimate.device = std::max(kept + last_block, kept - 1 + block) * a;
  }
  return estimate;
}

namespace {

void check_input(const EstimateInput& in) {
  const auto positive = [](const char* key, std::int64_t value, std::int64_t low) {
    if (value < low) {
      throw ConfigError(key,
                        "got " + std::to_string(value) + ", expected >= " + std::to_string(low));
    }
  };
  positive("params", in.params, 0);
  positive("frozen_params", in.frozen_params, 0);
  positive("largest_frozen_module", in.largest_frozen_module, 0);
  positive("ranks", in.ranks, 1);
  positive("zero_optimization.reduce_bucket_size", in.reduce_bucket_size, 1);
  positive("zero_optimization.zero_hpz_partition_size", in.hpz_partition_size, 1);
  for (std::int64_t numel : in.tensors) positive("tensors", numel, 0);
  if (in.nodes < 1 || in.ranks % in.nodes != 0) {
    throw ConfigError("nodes", "got " + std::to_string(in.nodes) +
                                   ", expected a divisor of the rank count " +
                                   std::to_string(in.ranks));
  }
  if (in.stage < 0 || in.stage > 3) {
    throw ConfigError("zero_optimization.stage",
                      "got " + std::to_string(in.stage) + ", expected 0..3");
  }
  if (in.precision == DType::kFloat64) {
    throw ConfigError("precision", "got fp64, expected fp32, fp16 or bf16 (a model precision)");
  }
  if (!(in.offload_ratio > 0.0 && in.offload_ratio <= 1.0)) {
    throw ConfigError("zero_optimization.offload_optimizer.ratio",
                      "got " + detail::format_number(in.offload_ratio) + ", expected (0, 1]");
  }
}

/// DeepSpeed's rules for where offload is allowed; empty when this combination is.
std::string offload_restriction(const EstimateInput& in) {
  if (in.offload_ratio < 1.0 && in.offload_optimizer == OffloadDevice::kNvme) {
    return "offload_optimizer.ratio below 1 needs offload_optimizer device cpu";
  }
  if (in.offload_optimizer != OffloadDevice::kNone && in.stage == 0) {
    return "offload_optimizer needs ZeRO stage 1, 2 or 3";
  }
  if (in.offload_param != OffloadDevice::kNone && in.stage != 3) {
    return "offload_param needs ZeRO stage 3";
  }
  if (in.offload_param == OffloadDevice::kNvme && in.offload_optimizer != OffloadDevice::kNvme) {
    return "offload_param nvme needs offload_optimizer nvme (zeroshard's rule: a failed write "
           "rolls the whole step back)";
  }
  return {};
}

struct BucketExtent {
  std::int64_t widest = 0;
  std::int64_t receive = 0;
  std::int64_t count = 0;  ///< buckets, when the tensors are known
};

/// Calls visit(begin, end) for each gradient bucket of the engine's plan (grad_bucketer.cpp):
/// buckets tile the flat buffer from the top, each closing before it would exceed `limit`, and a
/// tensor larger than that forms a bucket of its own.
template <class Visit>
void for_each_bucket(const detail::ShardLayout& layout, std::int64_t limit, Visit visit) {
  std::int64_t end = layout.padded_total();
  int lowest = -1;  // the last tensor added to the open bucket
  for (int t = layout.tensor_count() - 1; t >= 0; --t) {
    if (lowest >= 0 && end - layout.offset(t) > limit) {
      visit(layout.offset(lowest), end);
      end = layout.offset(lowest);
    }
    lowest = t;
  }
  visit(0, end);
}

/// The widest gradient bucket and the largest share of one that a rank receives. With the
/// tensors known this is the engine's own plan (for_each_bucket). Otherwise a bound: a bucket,
/// or the largest tensor with its alignment and the final padding.
BucketExtent bucket_extent(const EstimateInput& in, const detail::ShardLayout& layout) {
  const std::int64_t limit = in.reduce_bucket_size;
  BucketExtent extent;
  if (in.tensors.empty()) {
    const std::int64_t slack = detail::kTensorAlignment * in.ranks - 1;
    extent.widest = std::min(layout.padded_total(), std::max(limit, in.largest_tensor + slack));
    extent.receive = std::min(extent.widest, layout.shard_size());
    return extent;
  }
  const auto add = [&](std::int64_t begin, std::int64_t end) {
    ++extent.count;
    extent.widest = std::max(extent.widest, end - begin);
    for (std::int64_t share : layout.rank_counts(begin, end)) {
      extent.receive = std::max(extent.receive, share);
    }
  };
  for_each_bucket(layout, limit, add);
  return extent;
}

// qwZ: the bytes of the engine's encoded area for one gather of the largest tensor, taken as the
// largest module (param_coordinator.cpp start_gather): a non-finite counter (4 bytes), then each
// rank's int8 encoding of its piece padded to 4 bytes. Exact with the tensors' layout; without
// it, a bound over any split of the tensor into `ranks` pieces.
std::int64_t encoded_gather_bytes(const EstimateInput& in, const detail::ShardLayout& layout,
                                  std::int64_t largest) {
  const auto padded = [](std::int64_t count) {
    return detail::quantized_units(count, detail::QuantBits::kInt8) * 4;
  };
  std::int64_t bytes = 4;
  if (in.tensors.empty()) {
    // Each piece adds at most one short block's scale and 3 bytes of padding.
    return bytes + padded(largest) + in.ranks * (4 + 3);
  }
  const auto it = std::max_element(in.tensors.begin(), in.tensors.end());
  const std::int64_t begin = layout.offset(static_cast<int>(it - in.tensors.begin()));
  for (std::int64_t count : layout.rank_counts(begin, begin + *it)) bytes += padded(count);
  return bytes;
}

// qgZ: the working memory of one quantized reduction of the bucket that needs the most
// (comm/quantized_reduce_scatter.cpp), for ranks grouped by node as the engine groups them by
// host, on the first and the last group (the last holds the flat buffer's final padding). With
// the tensors unknown, a bucket of the widest extent at the top of the flat buffer stands for it.
std::int64_t quantized_reduction_bytes(const EstimateInput& in, const detail::ShardLayout& layout,
                                       std::int64_t widest) {
  const int per_node = in.ranks / in.nodes;
  std::vector<std::vector<int>> members(in.nodes);
  for (int g = 0; g < in.nodes; ++g) {
    for (int i = 0; i < per_node; ++i) members[g].push_back(g * per_node + i);
  }
  const DType dtype = in.fp32_communication ? DType::kFloat32 : in.precision;
  std::int64_t most = 0;
  const auto add = [&](std::int64_t begin, std::int64_t end) {
    const auto counts = layout.rank_counts(begin, end);
    for (int g : {0, in.nodes - 1}) {
      for (int i = 0; i < per_node; ++i) {
        most = std::max(most, detail::quantized_reduce_scatter_bytes(counts, dtype, members, g, i));
      }
    }
  };
  if (in.tensors.empty()) {
    add(layout.padded_total() - widest, layout.padded_total());
    return most;
  }
  for_each_bucket(layout, in.reduce_bucket_size, add);
  return most;
}

/// Stage 3's persistent elements: of the tensors kept whole when the tensors are known.
std::int64_t persistent_elements(const EstimateInput& in) {
  if (in.tensors.empty()) return in.persistent_params;
  std::int64_t total = 0;
  for_each_tensor(in, [&](std::int64_t numel, bool kept_whole) {
    if (kept_whole) total += numel;
  });
  return total;
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
  const std::vector<std::int64_t> one_tensor = {input.params};
  const std::vector<std::int64_t>& tensors = input.tensors.empty() ? one_tensor : input.tensors;
  const detail::ShardLayout layout(tensors, input.ranks, detail::kTensorAlignment);
  const BucketExtent buckets = bucket_extent(input, layout);
  const Terms terms{
      .in = input,
      .padded = layout.padded_total(),
      .shard = layout.shard_size(),
      .bucket = buckets.widest,
      .receive = buckets.receive,
      .persistent = input.stage == 3 ? persistent_elements(input) : 0,
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
  result.padded_params = terms.padded;
  result.shard_params = terms.shard;
  // Stage 3 gathers for forward, again for backward and, with activation checkpointing of the
  // chain, once more for the recompute.
  const bool recompute_gathers = input.stage == 3 && input.layers > 0 && input.checkpoint_every > 0;
  result.traffic_bytes_per_step =
      (input.stage == 3 ? (recompute_gathers ? 4 : 3) : 2) * terms.padded * terms.d;
  if (input.stage == 3) {
    // The budget bounds what is prefetched and kept; the module in use is gathered whatever its
    // size. The input knows no modules, so its largest tensor stands for the largest module.
    const std::int64_t gathered =
        std::min(terms.padded, std::max(input.max_live_parameters, terms.largest_tensor()));
    result.transient_device_bytes = terms.d * gathered;
    result.notes.push_back("gathered modules: at most stage3_max_live_parameters = " +
                           std::to_string(input.max_live_parameters) +
                           " elements at once, or the module in use when it is larger, in the "
                           "peak only");
    if (input.quantized_weights && terms.largest_tensor() > 0) {
      // Two prefetches in flight and the module asked for: at most three encoded areas at once
      // (param_coordinator.cpp, kMaxGathersInFlight + 1), no more than there are tensors.
      const std::int64_t in_flight =
          input.tensors.empty() ? 3 : std::min<std::int64_t>(3, input.tensors.size());
      result.transient_device_bytes +=
          in_flight * encoded_gather_bytes(input, layout, terms.largest_tensor());
      result.notes.push_back(
          "zero_quantized_weights: the int8 encodings of up to three gathers in flight, under "
          "communication, in the peak only");
    }
    if (input.quantized_nontrainable_weights && input.frozen_params > 0) {
      // Each gathered module's frozen parameters are decoded while it is gathered.
      const std::int64_t decoded = input.largest_frozen_module > 0
                                       ? std::min(input.largest_frozen_module, input.frozen_params)
                                       : input.frozen_params;
      result.transient_device_bytes += terms.d * decoded;
      result.notes.push_back(
          "zero_quantized_nontrainable_weights: frozen parameters as int8 blocks (exact for one "
          "frozen tensor; each further tensor adds at most 7 bytes of scale and padding), and "
          "the decoded copy of " +
          std::to_string(decoded) +
          " frozen elements gathered at once (give the largest frozen module with "
          "--largest-frozen-module), in the peak only");
    }
    if (input.quantized_gradients && input.ranks > 1) {
      // Up to two reductions in flight (grad_bucketer.cpp, kMaxInFlight), one per bucket.
      const std::int64_t in_flight =
          input.tensors.empty() ? 2 : std::min<std::int64_t>(2, buckets.count);
      result.transient_device_bytes +=
          in_flight * quantized_reduction_bytes(input, layout, buckets.widest);
      result.notes.push_back(
          "zero_quantized_gradients: the encodings and partial sums of up to two reductions in "
          "flight, under communication, in the peak only");
    }
  }
  if (input.tensors.empty() && input.largest_tensor == 0) {
    result.notes.push_back(
        "no tensor is assumed larger than a bucket (give the largest with --largest-tensor)");
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
  in.fp32_grad_accumulation = config.grad_accum_dtype == "fp32";
  in.fp32_communication = config.communication_data_type == "fp32";
  in.cpu_checkpointing = config.activation_checkpointing.cpu_checkpointing;
  if (!config.optimizer.type.empty()) {
    in.optimizer = config.optimizer.type;
    const auto& p = config.optimizer.params;
    const auto flag = [&p](const char* key) {
      const auto it = p.find(key);
      return it != p.end() && it->second != 0.0;
    };
    in.optimizer_state_arrays = optimizer_state_arrays(in.optimizer);
    if (in.optimizer_state_arrays == 2 && flag("amsgrad")) in.optimizer_state_arrays = 3;
    if (in.optimizer_state_arrays == 0 && flag("momentum")) in.optimizer_state_arrays = 1;
  }
  in.offload_optimizer = zero.offload_optimizer.device;
  // "auto" is chosen from a measured peak: the estimate is the first step's, at 1.
  in.offload_ratio = zero.offload_optimizer.ratio.value_or(1.0);
  in.super_offload = zero.offload_optimizer.super_offload;
  in.gradient_accumulation_steps = config.gradient_accumulation_steps;
  in.offload_param = zero.offload_param.device;
  in.reduce_bucket_size = zero.reduce_bucket_size;
  in.reduce_scatter = zero.reduce_scatter;
  in.param_persistence_threshold = zero.param_persistence_threshold;
  in.model_persistence_threshold = zero.model_persistence_threshold;
  in.max_live_parameters = zero.max_live_parameters;
  in.quantized_weights = zero.quantized_weights;
  in.quantized_nontrainable_weights = zero.quantized_nontrainable_weights;
  in.hpz_partition_size = zero.hpz_partition_size;
  in.quantized_gradients = zero.quantized_gradients;
  in.optimizer_buffer_count = zero.offload_optimizer.buffer_count;
  in.sub_group_size = zero.sub_group_size;
  in.param_buffer_count = zero.offload_param.buffer_count;
  in.param_buffer_size = zero.offload_param.buffer_size;
  in.param_max_in_cpu = zero.offload_param.max_in_cpu;
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
  in.tensors.clear();
  const auto fits = [&](std::int64_t params) {
    in.params = params;
    const MemoryEstimate e = estimate(in);
    return e.valid && e.device_peak() <= device_bytes_per_rank;
  };
  if (!fits(0)) return 0;
  // Device bytes never shrink as P grows, so bracket the answer by doubling, then bisect.
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

double smallest_offload_ratio(std::int64_t spare_device_bytes, const EstimateInput& base) {
  EstimateInput in = base;
  in.offload_ratio = 1.0;
  const MemoryEstimate all_on_host = estimate(in);
  const std::int64_t owned = in.stage == 0 ? all_on_host.padded_params : all_on_host.shard_params;
  if (!all_on_host.valid || owned == 0 || spare_device_bytes <= 0) return 1.0;
  // The ratio whose split puts `units` alignment steps on the host; 0 steps is a ratio above 0
  // that rounds to none, as the split rounds to the nearest step.
  const auto ratio_of = [owned](std::int64_t units) {
    return static_cast<double>(std::max<std::int64_t>(1, units * detail::kTensorAlignment)) /
           static_cast<double>(owned);
  };
  const auto fits = [&](std::int64_t units) {
    in.offload_ratio = std::min(1.0, ratio_of(units));
    return estimate(in).total() - all_on_host.total() <= spare_device_bytes;
  };
  // Device bytes never grow as the host's share does: bisect for the fewest host steps that fit.
  std::int64_t high = (owned + detail::kTensorAlignment - 1) / detail::kTensorAlignment;
  std::int64_t low = -1;  // below the range: "fits" is never asked of it
  while (high - low > 1) {
    const std::int64_t mid = low + (high - low) / 2;
    (fits(mid) ? high : low) = mid;
  }
  return std::min(1.0, ratio_of(high));
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
