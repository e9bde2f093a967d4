// The fp32 master values of the whole model on every rank, gathered one bounded chunk of the flat
// layout at a time, so that a checksum or an export never holds a full-size copy beside the
// model states (a 1.7B-parameter model would need 6.8 GB per copy).
#include <algorithm>
#include <exception>
#include <string>

#include "engine/engine_state.h"
#include "util/check.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

void EngineState::visit_consolidated(
    const std::function<void(const TensorPiece&, const float*)>& use, std::int64_t chunk_elements) {
  require_finalized();
  ZEROSHARD_CHECK_USAGE(chunk_elements > 0, "visit_consolidated_parameters: chunk_elements "
                                                << chunk_elements << ", expected at least 1");
  const std::int64_t padded = layout_.padded_total();
  const std::int64_t chunk = std::max<std::int64_t>(1, std::min(chunk_elements, padded));
  // Gathered in engine memory, where the communicator expects its buffers; read on the host.
  TrackedBuffer gathered = allocate(MemoryCategory::kCommunication, chunk * sizeof(float));
  TrackedBuffer host_copy;
  if (gathered.location() != MemoryLocation::kHost) {
    host_copy = context_->allocate(Tier::kPageableHost, MemoryCategory::kCommunication,
                                   chunk * sizeof(float));
  }
  const float* values = host_copy.empty() ? gathered.as<float>() : host_copy.as<float>();
  // Neither a failed read of this rank's shard (a swap file) nor a failing `use` stops the
  // gathers, in which the other ranks wait; visits stop at the first failure of either.
  std::exception_ptr read_failure;
  std::exception_ptr use_failure;
  for (std::int64_t lo = 0; lo < padded; lo += chunk) {
    const std::int64_t hi = std::min(padded, lo + chunk);
    try {
      if (!read_failure) optimizer_->copy_master_to(gathered.as<float>(), lo, hi);
    } catch (...) {
      read_failure = std::current_exception();
    }
    if (stage_ != 0) {
      comm_->all_gather(gathered.data(), layout_.rank_counts(lo, hi), DType::kFloat32);
    }
    if (read_failure || use_failure) continue;
    if (!host_copy.empty()) {
      backend_->copy_to_host(host_copy.data(), gathered.data(), (hi - lo) * sizeof(float));
    }
    try {
      for (const TensorPiece& piece : layout_.pieces(lo, hi)) {
        use(piece, values + (piece.flat_offset - lo));
      }
    } catch (...) {
      use_failure = std::current_exception();
    }
  }
  // A rank whose read failed sent what its buffer held: every rank learns that its visits saw
  // values that are not the model's.
  const std::string failed = failure_on_any_rank(read_failure);
  if (read_failure) std::rethrow_exception(read_failure);
  if (!failed.empty()) {
    throw IoError("gathering the consolidated parameters failed on " + failed +
                  "; the values handed over here are not the model's");
  }
  if (use_failure) std::rethrow_exception(use_failure);
}

std::vector<float> EngineState::consolidated_parameters() {
  require_finalized();
  // The pieces come in flat order, which is registration order: appending them drops the padding.
  std::vector<float> values;
  values.reserve(static_cast<std::size_t>(layout_.unpadded_total()));
  visit_consolidated(
      [&](const TensorPiece& piece, const float* data) {
        values.insert(values.end(), data, data + piece.size);
      },
      kConsolidationChunkElements);
  return values;
}

}  // namespace zeroshard::detail
