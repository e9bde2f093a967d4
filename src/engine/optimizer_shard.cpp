// The optimizer shard's parts, and each call split at their boundary.
#include "engine/optimizer_shard.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace zeroshard::detail {

OptimizerShard::OptimizerShard(const EngineContext& context, const UpdateRule& rule,
                               ParamCoordinator& params, char* full_grads, DType grad_shard_dtype)
    : context_(context),
      rule_(rule),
      params_(params),
      full_grads_(full_grads),
      grad_shard_dtype_(grad_shard_dtype) {
  const FlatRange owned{context.update_begin(), context.update_end()};
  const OffloadConfig& offload = context.config.zero_optimization.offload_optimizer;
  // DeepSpeed offloads the first sub-groups and keeps the later ones on the device. "auto" starts
  // with all of them on the host.
  const OptimizerSplit split = split_optimizer(
      offload.device != OffloadDevice::kNone, offload.ratio.value_or(1.0), owned.end - owned.begin);
  const std::int64_t boundary = owned.begin + split.host;
  if (split.host_part) parts_.push_back(make_part({owned.begin, boundary}, PartPlacement::kHost));
  if (split.device_part) parts_.push_back(make_part({boundary, owned.end}, PartPlacement::kDevice));
}

std::unique_ptr<OptimizerPart> OptimizerShard::make_part(FlatRange range, PartPlacement placement,
                                                         OptimizerPart* predecessor) const {
  return std::make_unique<OptimizerPart>(context_, rule_, params_, full_grads_, grad_shard_dtype_,
                                         range, placement, predecessor);
}

void OptimizerShard::keep_on_host(std::int64_t host_elements) {
  // The whole part stays the shard until the device's part is built and filled: a device that
  // cannot hold it leaves the shard as it was.
  OptimizerPart* const whole = parts_.front().get();
  const std::int64_t begin = whole->owned_begin();
  const std::int64_t boundary = begin + host_elements;
  const std::int64_t end = whole->owned_end();
  std::unique_ptr<OptimizerPart> device = make_part({boundary, end}, PartPlacement::kDevice);
  // Bounded host chunks: the device part's arrays may be GPU memory.
  constexpr std::int64_t kChunk = std::int64_t{1} << 20;
  std::vector<float> chunk(static_cast<std::size_t>(std::min(kChunk, end - boundary)));
  for (int array = 0; array < array_count(); ++array) {
    for (std::int64_t flat = boundary; flat < end; flat += kChunk) {
      const std::int64_t count = std::min(kChunk, end - flat);
      whole->read_owned(array, flat, chunk.data(), count);
      device->write_owned(array, flat, chunk.data(), count);
    }
  }
  // The host part takes the whole part's arrays last, once the device's share is read from them.
  std::unique_ptr<OptimizerPart> host = make_part({begin, boundary}, PartPlacement::kHost, whole);
  parts_.clear();
  parts_.push_back(std::move(host));
  parts_.push_back(std::move(device));
  for (const auto& part : parts_) part->expect_deliveries(expected_elements_, expected_dtype_);
}

bool OptimizerShard::offloaded() const noexcept { return host_part().offloaded(); }

std::int64_t OptimizerShard::host_elements() const noexcept {
  return offloaded() ? host_part().owned_end() - host_part().owned_begin() : 0;
}

template <class Use>
void OptimizerShard::for_each_part(std::int64_t lo, std::int64_t hi, Use use) {
  for (const std::unique_ptr<OptimizerPart>& part : parts_) {
    const std::int64_t first = std::max(lo, part->owned_begin());
    const std::int64_t last = std::min(hi, part->owned_end());
    if (first < last) use(*part, first, last);
  }
}

void* OptimizerShard::reduce_target(std::int64_t lo, std::int64_t hi, DType dtype) {
  // A part that straddles the boundary is received and split in accept_reduced().
  for (const std::unique_ptr<OptimizerPart>& part : parts_) {
    if (lo >= part->owned_begin() && hi <= part->owned_end()) {
      return part->reduce_target(lo, hi, dtype);
    }
  }
  return nullptr;
}

void OptimizerShard::accept_reduced(std::int64_t lo, std::int64_t hi, const void* data,
                                    DType dtype) {
  for_each_part(lo, hi, [&](OptimizerPart& part, std::int64_t first, std::int64_t last) {
    part.accept_reduced(first, last, static_cast<const char*>(data) + (first - lo) * size_of(dtype),
                        dtype);
  });
}

void OptimizerShard::expect_deliveries(std::int64_t elements, DType dtype) {
  expected_elements_ = elements;
  expected_dtype_ = dtype;
  for (const auto& part : parts_) part->expect_deliveries(elements, dtype);
}

void OptimizerShard::before_reuse() {
  for (const auto& part : parts_) part->before_reuse();
}

void OptimizerShard::micro_step_reduced() {
  for (const auto& part : parts_) part->micro_step_reduced();
}

void OptimizerShard::zero_gradients() {
  for (const auto& part : parts_) part->zero_gradients();
}

GradientScan OptimizerShard::scan(std::int64_t lo, std::int64_t hi) {
  GradientScan scan;
  for_each_part(lo, hi, [&](OptimizerPart& part, std::int64_t first, std::int64_t last) {
    part.scan(first, last, scan);
  });
  return scan;
}

void OptimizerShard::load_master(std::int64_t flat, const float* values, std::int64_t count) {
  for_each_part(flat, flat + count,
                [&](OptimizerPart& part, std::int64_t first, std::int64_t last) {
                  part.load_master(first, values + (first - flat), last - first);
                });
}

void OptimizerShard::copy_master_to(float* destination, std::int64_t lo, std::int64_t hi) {
  for (const auto& part : parts_) part->copy_master_to(destination, lo, hi);
}

const float* OptimizerShard::host_view(int array, std::int64_t flat, std::int64_t count) {
  for (const std::unique_ptr<OptimizerPart>& part : parts_) {
    if (flat >= part->owned_begin() && flat + count <= part->owned_end()) {
      return part->host_view(array, flat);
    }
  }
  return nullptr;
}

void OptimizerShard::read_owned(int array, std::int64_t flat, float* out, std::int64_t count) {
  for_each_part(flat, flat + count,
                [&](OptimizerPart& part, std::int64_t first, std::int64_t last) {
                  part.read_owned(array, first, out + (first - flat), last - first);
                });
}

void OptimizerShard::write_owned(int array, std::int64_t flat, const float* values,
                                 std::int64_t count) {
  for_each_part(flat, flat + count,
                [&](OptimizerPart& part, std::int64_t first, std::int64_t last) {
                  part.write_owned(array, first, values + (first - flat), last - first);
                });
}

TrackedBuffer OptimizerShard::staging_for(int array) {
  return parts_.size() == 1 ? parts_.front()->staging_for(array) : TrackedBuffer{};
}

void OptimizerShard::adopt_array(int array, TrackedBuffer staged) {
  parts_.front()->adopt_array(array, std::move(staged));
}

void OptimizerShard::refresh_params_from_master() {
  for (const auto& part : parts_) part->refresh_params_from_master();
}

void OptimizerShard::update(float grad_factor, const GroupContexts& contexts) {
  for (auto part = parts_.rbegin(); part != parts_.rend(); ++part) {
    (*part)->update(grad_factor, contexts);
  }
}

bool OptimizerShard::clears_whole_gradients() const noexcept {
  return std::all_of(parts_.begin(), parts_.end(),
                     [](const auto& part) { return part->clears_whole_gradients(); });
}

void OptimizerShard::leave_whole_gradients(bool leave) noexcept {
  for (const auto& part : parts_) part->leave_whole_gradients(leave);
}

void OptimizerShard::begin_overlapped_update(float grad_factor, GroupContexts contexts) {
  host_part().begin_overlapped_update(grad_factor, std::move(contexts));
}

void OptimizerShard::finish_overlapped_update() { host_part().finish_overlapped_update(); }

bool OptimizerShard::keep_overlapped_update(float grad_factor, const GroupContexts& contexts) {
  if (!host_part().keep_overlapped_update(grad_factor, contexts)) return false;
  for (std::size_t p = 1; p < parts_.size(); ++p) parts_[p]->update(grad_factor, contexts);
  return true;
}

void OptimizerShard::roll_back_update() {
  for (const auto& part : parts_) part->roll_back_update();
}

}  // namespace zeroshard::detail
