// qgZ's two hops: the layout of the encoded pieces, and the request that runs the second hop
// once the first has arrived.
#include "comm/quantized_reduce_scatter.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <utility>

#include "util/check.h"

namespace zeroshard::detail {

namespace {

constexpr std::int64_t kUnit = 4;  // bytes of one fp32 unit on the wire

// Where everything of one reduction lies, in fp32 units of one buffer. A piece for one peer is
// one non-finite block count per slice it carries (one unit each, together so that a receiver
// reads them in one copy), then one encoding per slice, each padded to whole units, so that no
// block straddles two slices.
struct Plan {
  int group_size = 1;                 // K
  int group_count = 1;                // H
  int self = 0;                       // this world rank
  std::int64_t own = 0;               // counts[self]
  std::vector<std::int64_t> counts;   // per world rank
  std::vector<std::int64_t> offsets;  // element offset of each world rank's slice in the input
  // The slices of the world ranks at this rank's place, one per group: what this rank sums in
  // the first hop (partial sums) and sends, one per group, in the second.
  std::vector<int> place_ranks;
  std::vector<std::int64_t> place_counts;
  std::vector<std::int64_t> place_offsets;  // in the partial sums
  std::int64_t partial_elements = 0;
  std::vector<std::int64_t> send_within;  // units per place
  std::int64_t within_piece = 0;          // units received from each place
  std::vector<std::int64_t> send_across;  // units per group
  std::int64_t across_piece = 0;          // units received from each group
  // Areas, in units from the buffer's start.
  std::int64_t send_within_at = 0;
  std::int64_t recv_within_at = 0;
  std::int64_t partials_at = 0;
  std::int64_t scratch_at = 0;
  std::int64_t send_across_at = 0;
  std::int64_t recv_across_at = 0;
  std::int64_t sum_at = 0;  // fp32 sum of the own slice, when the output is not fp32
  std::int64_t total = 0;

  bool has_within() const { return group_size > 1; }
  bool has_across() const { return group_count > 1; }
};

Plan make_plan(std::span<const std::int64_t> counts, DType dtype,
               const std::vector<std::vector<int>>& members, int group, int index) {
  Plan plan;
  plan.group_count = static_cast<int>(members.size());
  plan.group_size = static_cast<int>(members.front().size());
  const int world = plan.group_count * plan.group_size;
  ZEROSHARD_CHECK_USAGE(static_cast<int>(counts.size()) == world,
                        "quantized reduce-scatter: " << counts.size() << " counts for a world of "
                                                     << world << " ranks");
  plan.offsets.resize(world);
  std::int64_t offset = 0;
  for (int r = 0; r < world; ++r) {
    ZEROSHARD_CHECK_USAGE(counts[r] >= 0, "quantized reduce-scatter: negative count "
                                              << counts[r] << " for rank " << r);
    plan.offsets[r] = offset;
    offset += counts[r];
  }
  plan.counts.assign(counts.begin(), counts.end());
  plan.self = members[group][index];
  plan.own = counts[plan.self];
  std::int64_t widest = 0;
  for (int g = 0; g < plan.group_count; ++g) {
    const int rank = members[g][index];
    plan.place_ranks.push_back(rank);
    plan.place_counts.push_back(counts[rank]);
    plan.place_offsets.push_back(plan.partial_elements);
    plan.partial_elements += counts[rank];
    widest = std::max(widest, counts[rank]);
  }
  if (plan.has_within()) {
    for (int j = 0; j < plan.group_size; ++j) {
      std::int64_t units = plan.group_count;
      for (int g = 0; g < plan.group_count; ++g) {
        units += quantized_units(counts[members[g][j]], kGradientWithinBits);
      }
      plan.send_within.push_back(units);
    }
    plan.within_piece = plan.send_within[index];
  }
  if (plan.has_across()) {
    for (int g = 0; g < plan.group_count; ++g) {
      plan.send_across.push_back(1 + quantized_units(plan.place_counts[g], kGradientAcrossBits));
    }
    plan.across_piece = plan.send_across[group];
  }
  std::int64_t at = 0;
  const auto area = [&at](std::int64_t units) {
    const std::int64_t begin = at;
    at += units;
    return begin;
  };
  if (plan.has_within()) {
    std::int64_t sent = 0;
    for (std::int64_t units : plan.send_within) sent += units;
    plan.send_within_at = area(sent);
    plan.recv_within_at = area(plan.group_size * plan.within_piece);
    plan.partials_at = area(plan.partial_elements);
  }
  // Each piece after the first is decoded here and added to the sum.
  plan.scratch_at = area(plan.has_within() ? widest : plan.has_across() ? plan.own : 0);
  if (plan.has_across()) {
    std::int64_t sent = 0;
    for (std::int64_t units : plan.send_across) sent += units;
    plan.send_across_at = area(sent);
    plan.recv_across_at = area(plan.group_count * plan.across_piece);
    // An fp32 output is summed in place; 16-bit sums are rounded once, when stored.
    if (dtype != DType::kFloat32) plan.sum_at = area(plan.own);
  }
  plan.total = at;
  return plan;
}

class QuantizedReduceScatterRequest final : public Request::Impl {
 public:
  QuantizedReduceScatterRequest(const NodeGroups& groups, ComputeBackend& backend,
                                std::deque<Request::Impl*>& across_order, Plan plan,
                                TrackedBuffer buffer, const void* input, void* output, DType dtype)
      : groups_(groups),
        backend_(backend),
        across_order_(across_order),
        plan_(std::move(plan)),
        buffer_(std::move(buffer)),
        input_(static_cast<const char*>(input)),
        output_(output),
        dtype_(dtype) {}

  ~QuantizedReduceScatterRequest() override { std::erase(across_order_, this); }

  // Encodes this rank's pieces and starts the first hop (or, with one rank per group, the second).
  void start() {
    if (plan_.has_within()) {
      start_within();
      if (plan_.has_across()) across_order_.push_back(this);
    } else if (plan_.has_across()) {
      std::vector<std::int64_t> offsets;
      for (int rank : plan_.place_ranks) offsets.push_back(plan_.offsets[rank]);
      start_across(input_, dtype_, offsets);
    } else {
      store(input_ + plan_.offsets[plan_.self] * size_of(dtype_), dtype_);
      phase_ = Phase::kDone;
    }
  }

  void wait() override {
    // The reductions started before this one send their second hop first.
    while (!across_order_.empty() && across_order_.front() != this) {
      static_cast<QuantizedReduceScatterRequest*>(across_order_.front())->start_across_now();
    }
    start_across_now();
    if (phase_ == Phase::kAcross) {
      across_.wait();
      finish_across();
    }
  }

  bool test() override {
    if (phase_ == Phase::kWithin) {
      if (!within_.test()) return false;
      finish_within();
    }
    if (phase_ == Phase::kSummed) {
      if (across_order_.front() != this) return false;
      start_across_now();
    }
    if (phase_ == Phase::kAcross) {
      if (!across_.test()) return false;
      finish_across();
    }
    return true;
  }

 private:
  // kSummed: the partial sums are ready and wait for the reductions started earlier to start
  // their second hop, since every rank must issue the all-to-alls on `across` in one order,
  // whichever first hop completes first here.
  enum class Phase { kWithin, kSummed, kAcross, kDone };

  // Completes the first hop and starts the second, waiting where needed; only the oldest
  // reduction still before its second hop may.
  void start_across_now() {
    if (phase_ == Phase::kWithin) {
      within_.wait();
      finish_within();
    }
    if (phase_ != Phase::kSummed) return;
    across_order_.pop_front();
    start_across(floats_at(plan_.partials_at), DType::kFloat32, plan_.place_offsets);
  }

  char* at(std::int64_t units) const { return buffer_.as<char>() + units * kUnit; }
  float* floats_at(std::int64_t units) const { return reinterpret_cast<float*>(at(units)); }

  // Hop 1: to the group-mate at place j go the slices of the world ranks at place j of every
  // group, each encoded on its own.
  void start_within() {
    const auto dsize = static_cast<std::int64_t>(size_of(dtype_));
    char* send = at(plan_.send_within_at);
    // Zeroes the counters and the padding after each encoding, which travel too.
    backend_.zero(send,
                  static_cast<std::size_t>(plan_.recv_within_at - plan_.send_within_at) * kUnit);
    for (int j = 0; j < plan_.group_size; ++j) {
      int* nonfinite = reinterpret_cast<int*>(send);
      char* encoded = send + plan_.group_count * kUnit;
      for (int g = 0; g < plan_.group_count; ++g) {
        const int rank = groups_.members[g][j];
        const std::int64_t count = plan_.counts[rank];
        if (count > 0) {
          backend_.quantize_blocks(input_ + plan_.offsets[rank] * dsize, dtype_, count,
                                   kGradientWithinBits, encoded, nonfinite + g);
        }
        encoded += quantized_units(count, kGradientWithinBits) * kUnit;
      }
      send += plan_.send_within[j] * kUnit;
    }
    const std::vector<std::int64_t> receive(plan_.group_size, plan_.within_piece);
    groups_.within->set_compute_stream(backend_.stream());
    within_ = groups_.within->all_to_all_async(at(plan_.send_within_at), plan_.send_within,
                                               at(plan_.recv_within_at), receive, DType::kFloat32);
    phase_ = Phase::kWithin;
  }

  // Sums, slice by slice, the group-mates' encodings in place order into the partial sums (or, as
  // the only group, stores this rank's).
  void finish_within() {
    float* partials = floats_at(plan_.partials_at);
    float* scratch = floats_at(plan_.scratch_at);
    const std::vector<bool> nonfinite = nonfinite_slices(plan_.recv_within_at, plan_.within_piece,
                                                         plan_.group_size, plan_.group_count);
    std::int64_t slice_at = plan_.group_count;  // units into each received piece
    for (int g = 0; g < plan_.group_count; ++g) {
      const std::int64_t count = plan_.place_counts[g];
      if (count > 0) {
        float* sum = partials + plan_.place_offsets[g];
        for (int i = 0; i < plan_.group_size; ++i) {
          const char* encoded = at(plan_.recv_within_at + i * plan_.within_piece + slice_at);
          add_decoded(encoded, kGradientWithinBits, count, sum, scratch, i == 0);
        }
        if (nonfinite[g]) poison(sum, count);
      }
      slice_at += quantized_units(count, kGradientWithinBits);
    }
    if (plan_.has_across()) {
      phase_ = Phase::kSummed;
    } else {
      store(reinterpret_cast<const char*>(partials), DType::kFloat32);
      phase_ = Phase::kDone;
    }
  }

  // Hop 2: the sum of the slice of the world rank at this place of group g goes to across rank g.
  // `source` holds group g's slice at element offsets[g]: the partial sums, or the input itself
  // when each group is one rank.
  void start_across(const void* source, DType dtype, const std::vector<std::int64_t>& offsets) {
    const auto dsize = static_cast<std::int64_t>(size_of(dtype));
    char* send = at(plan_.send_across_at);
    backend_.zero(send,
                  static_cast<std::size_t>(plan_.recv_across_at - plan_.send_across_at) * kUnit);
    for (int g = 0; g < plan_.group_count; ++g) {
      const std::int64_t count = plan_.place_counts[g];
      if (count > 0) {
        backend_.quantize_blocks(static_cast<const char*>(source) + offsets[g] * dsize, dtype,
                                 count, kGradientAcrossBits, send + kUnit,
                                 reinterpret_cast<int*>(send));
      }
      send += plan_.send_across[g] * kUnit;
    }
    const std::vector<std::int64_t> receive(plan_.group_count, plan_.across_piece);
    groups_.across->set_compute_stream(backend_.stream());
    across_ = groups_.across->all_to_all_async(at(plan_.send_across_at), plan_.send_across,
                                               at(plan_.recv_across_at), receive, DType::kFloat32);
    phase_ = Phase::kAcross;
  }

  // Sums the groups' encodings of this rank's slice in group order into the output.
  void finish_across() {
    float* sum = dtype_ == DType::kFloat32 ? static_cast<float*>(output_) : floats_at(plan_.sum_at);
    if (plan_.own > 0) {
      for (int g = 0; g < plan_.group_count; ++g) {
        add_decoded(at(plan_.recv_across_at + g * plan_.across_piece + 1), kGradientAcrossBits,
                    plan_.own, sum, floats_at(plan_.scratch_at), g == 0);
      }
      if (nonfinite_slices(plan_.recv_across_at, plan_.across_piece, plan_.group_count, 1)[0]) {
        poison(sum, plan_.own);
      }
    }
    if (dtype_ != DType::kFloat32) backend_.narrow(sum, output_, dtype_, plan_.own);
    phase_ = Phase::kDone;
  }

  void add_decoded(const char* encoded, QuantBits bits, std::int64_t count, float* sum,
                   float* scratch, bool first) {
    if (first) {
      backend_.dequantize_blocks(encoded, bits, count, sum, DType::kFloat32);
      return;
    }
    backend_.dequantize_blocks(encoded, bits, count, scratch, DType::kFloat32);
    backend_.accumulate(sum, DType::kFloat32, scratch, DType::kFloat32, count);
  }

  // For each of the `slices` every piece carries, whether some sender met inf or NaN in it: the
  // counters that open each of the `pieces` received at `first` (each `piece` units). On a GPU
  // each piece's read waits for the compute stream.
  std::vector<bool> nonfinite_slices(std::int64_t first, std::int64_t piece, int pieces,
                                     int slices) const {
    std::vector<bool> any(slices, false);
    std::vector<int> counts(slices);
    for (int i = 0; i < pieces; ++i) {
      backend_.copy_to_host(counts.data(), at(first + i * piece), counts.size() * sizeof(int));
      for (int s = 0; s < slices; ++s) any[s] = any[s] || counts[s] != 0;
    }
    return any;
  }

  // The encodings carried zeros for the non-finite blocks; NaN in every sum they fed keeps the
  // overflow visible to the engine's check instead of a silently wrong gradient.
  void poison(float* sum, std::int64_t count) {
    backend_.scale(sum, DType::kFloat32, count, std::numeric_limits<float>::quiet_NaN());
  }

  void store(const char* sum, DType dtype) {
    if (plan_.own == 0 || sum == output_) return;
    if (dtype == dtype_) {
      backend_.copy(output_, sum, static_cast<std::size_t>(plan_.own) * size_of(dtype_));
    } else {
      backend_.narrow(reinterpret_cast<const float*>(sum), output_, dtype_, plan_.own);
    }
  }

  const NodeGroups& groups_;
  ComputeBackend& backend_;
  std::deque<Request::Impl*>& across_order_;
  Plan plan_;
  TrackedBuffer buffer_;
  const char* input_;
  void* output_;
  DType dtype_;
  Phase phase_ = Phase::kDone;
  Request within_;
  Request across_;
};

}  // namespace

std::int64_t quantized_reduce_scatter_bytes(std::span<const std::int64_t> counts, DType dtype,
                                            const std::vector<std::vector<int>>& members, int group,
                                            int index) {
  return make_plan(counts, dtype, members, group, index).total * kUnit;
}

QuantizedReduceScatter::QuantizedReduceScatter(NodeGroups groups, ComputeBackend& backend,
                                               MemoryTracker& tracker, MemoryResource& resource)
    : groups_(std::move(groups)), backend_(backend), tracker_(tracker), resource_(resource) {}

Request QuantizedReduceScatter::start(const void* input, void* output,
                                      std::span<const std::int64_t> counts, DType dtype) {
  Plan plan = make_plan(counts, dtype, groups_.members, groups_.group, groups_.index);
  // A world of one needs none: its slice is the input's.
  TrackedBuffer buffer =
      plan.total == 0
          ? TrackedBuffer()
          : TrackedBuffer::uninitialized(tracker_, MemoryCategory::kCommunication,
                                         static_cast<std::size_t>(plan.total * kUnit), resource_);
  auto request = std::make_unique<QuantizedReduceScatterRequest>(
      groups_, backend_, across_order_, std::move(plan), std::move(buffer), input, output, dtype);
  request->start();
  return Request(std::move(request));
}

}  // namespace zeroshard::detail
