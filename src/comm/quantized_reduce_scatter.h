// ZeRO++ qgZ: a reduce-scatter whose pieces travel block-quantized in two all-to-all hops, first
// among the ranks of a host, then across the hosts, so that each gradient element crosses the
// slow link once, as int4.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "backend/compute_backend.h"
#include "comm/node_groups.h"
#include "layout/quantized_block_format.h"  // QuantBits
#include "memory/memory_tracker.h"
#include "zeroshard/communicator.h"

namespace zeroshard::detail {

/// int8 inside a host: its links are fast, so the bytes matter little there and the eight bits
/// keep that hop's error at a / 254 per block instead of a / 14.
inline constexpr QuantBits kGradientWithinBits = QuantBits::kInt8;
/// int4 across hosts: 0.129x of fp32's bytes for large pieces, under issue #29's 0.15x, where
/// int8 would send 0.254x.
inline constexpr QuantBits kGradientAcrossBits = QuantBits::kInt4;

/// Bytes of the working memory one reduction of `counts` (elements of `dtype`) holds until it
/// completes, on the rank at place `index` of group `group`, where members[g][i] is the world
/// rank at place i of group g (NodeGroups::members): for the memory estimator.
std::int64_t quantized_reduce_scatter_bytes(std::span<const std::int64_t> counts, DType dtype,
                                            const std::vector<std::vector<int>>& members, int group,
                                            int index);

/// The two-hop reduction over `groups` (every rank of the world in one of them). It gives what
/// Communicator::reduce_scatter_async with the same counts and ReduceOp::kSum gives, up to the
/// quantization error: this rank's slice of the sum over all ranks. Each slice is summed in a
/// fixed order (the group's places, then the groups), so the result does not depend on timing.
///
/// A rank whose piece holds inf or NaN sends with it the count of such blocks (encoded as zeros);
/// a receiver that sees a non-zero count makes every sum that piece fed NaN, so the overflow
/// check finds a non-finite gradient as it would in an unquantized reduction.
class QuantizedReduceScatter {
 public:
  /// `backend`, `tracker` and `resource` (where the working memory lives: the backend's) must
  /// outlive this, and this every request it starts.
  QuantizedReduceScatter(NodeGroups groups, ComputeBackend& backend, MemoryTracker& tracker,
                         MemoryResource& resource);
  QuantizedReduceScatter(const QuantizedReduceScatter&) = delete;
  QuantizedReduceScatter& operator=(const QuantizedReduceScatter&) = delete;

  /// Collective over the world: `input` holds sum(counts) elements of `dtype` laid out world rank
  /// after world rank; `output` receives counts[world rank] elements of `dtype`, and may be this
  /// rank's slice of `input`. The first hop starts here; the request's test() and wait() run the
  /// rest, each reduction's second hop after those of the reductions started before it, so that
  /// requests may complete in any order. `input` must not change until the request completes.
  Request start(const void* input, void* output, std::span<const std::int64_t> counts, DType dtype);

  const NodeGroups& groups() const noexcept { return groups_; }

 private:
  NodeGroups groups_;
  ComputeBackend& backend_;
  MemoryTracker& tracker_;
  MemoryResource& resource_;
  /// The requests whose second hop has not started, oldest first: they start it in this order.
  std::deque<Request::Impl*> across_order_;
};

}  // namespace zeroshard::detail
