// Activation checkpointing: keeps each block's input (as given, in pinned host memory, in one
// contiguous buffer, or this rank's part of it) and runs the block's forward again in backward.
// In pinned host memory the copies run on the backend's copy stream: a kept input goes out while
// the next block's forward runs, and comes back while the block after it in backward runs.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_internals.h"
#include "memory/memory_tracker.h"
#include "util/log.h"
#include "zeroshard/activation_checkpointing.h"
#include "zeroshard/error.h"

namespace zeroshard {

// --- BlockContext --------------------------------------------------------------------------------

float* BlockContext::allocate(std::size_t bytes) {
  activations_.push_back(engine_->allocate_activations(bytes));
  return activations_.back().data();
}

float* BlockContext::activation(int index) const {
  if (index < 0 || index >= activation_count()) {
    throw UsageError("BlockContext::activation(" + std::to_string(index) + "): the block has " +
                     std::to_string(activation_count()) + " activations");
  }
  return activations_[static_cast<std::size_t>(index)].data();
}

std::size_t BlockContext::activation_bytes(int index) const {
  activation(index);  // checks the index
  return activations_[static_cast<std::size_t>(index)].bytes();
}

// --- ActivationCheckpointer ----------------------------------------------------------------------

namespace {

constexpr const char* kContiguousKey = "activation_checkpointing.number_checkpoints";

using Clock = std::chrono::steady_clock;

std::int64_t as_bytes(std::size_t bytes) { return static_cast<std::int64_t>(bytes); }

}  // namespace

struct ActivationCheckpointer::Impl {
  /// One block's kept input and what its recompute needs.
  struct Kept {
    ActivationBuffer whole;       ///< the input as given (nothing moves it)
    detail::TrackedBuffer copy;   ///< its own copy: in pinned host memory, or a partition
    std::int64_t slot = -1;       ///< contiguous_memory_optimization: its slot
    std::size_t bytes = 0;        ///< the whole input
    std::size_t part_offset = 0;  ///< this rank's part of it, in bytes
    std::size_t part_bytes = 0;
    bool on_host = false;
    std::vector<std::vector<std::byte>> random;
    BlockFunction forward;
  };

  /// cpu_checkpointing: the next block's input being brought back in backward.
  struct Prefetch {
    ActivationBuffer buffer;
    std::size_t index = 0;  ///< the stack entry it belongs to
  };

  Impl(Engine& engine, Communicator* model_parallel)
      : engine(engine),
        state(detail::EngineInternals::state(engine)),
        config(engine.config().activation_checkpointing) {
    if (config.cpu_checkpointing) {
      outgoing_done = state.backend().make_copy_event();
      incoming_done = state.backend().make_copy_event();
    }
    if (config.partition_activations) {
      if (model_parallel == nullptr || model_parallel->size() == 1) {
        if (engine.rank() == 0) {
          ZEROSHARD_LOG(
              kProgress,
              "activation_checkpointing.partition_activations: no model-parallel group of "
              "more than one rank was given, so there is nothing to split; kept inputs "
              "stay whole");
        }
      } else {
        const bool device_buffers = engine.device().is_cuda();
        if ((model_parallel->buffer_device() != DeviceType::kCpu) != device_buffers) {
          throw UsageError("ActivationCheckpointer: the model-parallel communicator (" +
                           model_parallel->backend() +
                           ") does not take buffers on the engine's device");
        }
        partition = model_parallel;
      }
    }
  }

  /// Where kept copies live: pinned host memory with cpu_checkpointing, else the device.
  detail::MemoryResource& kept_resource() {
    return config.cpu_checkpointing ? state.backend().pinned_host_memory()
                                    : state.backend().memory();
  }

  bool keeps_as_given() const {
    return !config.cpu_checkpointing && !config.contiguous_memory_optimization &&
           partition == nullptr;
  }

  void boundary() {
    if (config.synchronize_checkpoint_boundary) state.backend().synchronize();
  }

  ~Impl() {
    // The copy stream may still read or write buffers that are freed after this body.
    try {
      settle();
    } catch (const std::exception& error) {
      ZEROSHARD_LOG(kWarning,
                    "a kept input's copy failed while the activation checkpointer was "
                    "being destroyed: "
                        << error.what());
    }
  }

  /// Element counts of a float buffer's parts over the model-parallel ranks.
  std::vector<std::int64_t> part_counts(std::size_t bytes) const {
    const auto elements = static_cast<std::int64_t>(bytes / sizeof(float));
    const int ranks = partition->size();
    std::vector<std::int64_t> counts(static_cast<std::size_t>(ranks), elements / ranks);
    for (int r = 0; r < elements % ranks; ++r) ++counts[static_cast<std::size_t>(r)];
    return counts;
  }

  void* slot_data(std::int64_t slot) const {
    return static_cast<char*>(contiguous.data()) + static_cast<std::size_t>(slot) * slot_bytes;
  }

  /// Moves the block's input into kept storage (its own buffer, or a slot) and frees what the
  /// device no longer needs.
  void keep(Kept& kept, ActivationBuffer input) {
    kept.bytes = input.bytes();
    kept.part_offset = 0;
    kept.part_bytes = kept.bytes;
    if (partition != nullptr) {
      if (kept.bytes % sizeof(float) != 0) {
        throw UsageError(
            "ActivationCheckpointer: partition_activations splits fp32 elements; "
            "the input has " +
            std::to_string(kept.bytes) + " bytes");
      }
      const std::vector<std::int64_t> counts = part_counts(kept.bytes);
      std::int64_t before = 0;
      for (int r = 0; r < partition->rank(); ++r) before += counts[static_cast<std::size_t>(r)];
      kept.part_offset = static_cast<std::size_t>(before) * sizeof(float);
      kept.part_bytes =
          static_cast<std::size_t>(counts[static_cast<std::size_t>(partition->rank())]) *
          sizeof(float);
    }
    if (keeps_as_given()) {
      kept.whole = std::move(input);
      add_kept(kept, +1);
      return;
    }
    kept.on_host = config.cpu_checkpointing;
    void* destination = nullptr;
    if (config.contiguous_memory_optimization) {
      const std::int64_t slot = static_cast<std::int64_t>(stack.size());
      if (contiguous.empty()) {
        // Sized by the first kept input, as DeepSpeed sizes its buffer, and kept for good.
        slot_bytes = (kept.part_bytes + detail::kBufferAlignment - 1) / detail::kBufferAlignment *
                     detail::kBufferAlignment;
        contiguous = detail::TrackedBuffer(
            state.tracker(), MemoryCategory::kActivations,
            slot_bytes * static_cast<std::size_t>(*config.number_checkpoints), kept_resource());
        if (config.cpu_checkpointing) {
          kept_host += as_bytes(contiguous.bytes());
        } else {
          kept_device += as_bytes(contiguous.bytes());
        }
        update_peaks();
      }
      if (slot >= *config.number_checkpoints) {
        throw ConfigError(kContiguousKey, "checkpoint " + std::to_string(slot + 1) +
                                              " of this backward pass does not fit the " +
                                              std::to_string(*config.number_checkpoints) +
                                              " slots of the contiguous buffer");
      }
      if (kept.part_bytes > slot_bytes) {
        throw ConfigError("activation_checkpointing.contiguous_memory_optimization",
                          "a kept input of " + std::to_string(kept.part_bytes) +
                              " bytes does not fit a slot of the contiguous buffer (" +
                              std::to_string(slot_bytes) +
                              " bytes, sized by the first kept input); turn it off for blocks "
                              "whose inputs differ in size");
      }
      kept.slot = slot;
      destination = slot_data(slot);
    } else {
      kept.copy = detail::TrackedBuffer(state.tracker(), MemoryCategory::kActivations,
                                        kept.part_bytes, kept_resource());
      destination = kept.copy.data();
      add_kept(kept, +1);
    }
    const char* source = reinterpret_cast<const char*>(input.data()) + kept.part_offset;
    if (!config.cpu_checkpointing) {
      state.backend().copy(destination, source, kept.part_bytes);
      return;  // `input` is freed: nothing of it stays on the device but the part kept there
    }
    // The input stays on the device until its copy has left, one block later.
    state.backend().copy_to_host_async(destination, source, kept.part_bytes, *outgoing_done);
    outgoing = std::move(input);
  }

  /// The forward's last copy out has been queued long enough: later work on the compute stream
  /// waits for it (that is where freeing the input is ordered), and the input is freed.
  void release_outgoing() {
    if (outgoing.data() == nullptr) return;
    outgoing_done->order_compute_after();
    outgoing = ActivationBuffer();
  }

  /// Brings a kept input back whole onto the device, on the compute stream.
  ActivationBuffer restore(Kept& kept) {
    if (kept.whole.data() != nullptr) {
      add_kept(kept, -1);
      return std::move(kept.whole);
    }
    ActivationBuffer input = engine.allocate_activations(kept.bytes);
    const void* source = kept.slot >= 0 ? slot_data(kept.slot) : kept.copy.data();
    state.backend().copy(reinterpret_cast<char*>(input.data()) + kept.part_offset, source,
                         kept.part_bytes);
    gather_parts(kept, input);
    if (kept.slot < 0) add_kept(kept, -1);
    kept.copy.reset();
    return input;
  }

  /// cpu_checkpointing: starts bringing stack entry `index`'s input back on the copy stream.
  Prefetch start_restore(std::size_t index) {
    const Kept& kept = stack[index];
    ActivationBuffer input = engine.allocate_activations(kept.bytes);
    const void* source = kept.slot >= 0 ? slot_data(kept.slot) : kept.copy.data();
    state.backend().copy_from_host_async(reinterpret_cast<char*>(input.data()) + kept.part_offset,
                                         source, kept.part_bytes, *incoming_done);
    return {std::move(input), index};
  }

  /// cpu_checkpointing: the input of the block whose backward runs now, from the prefetch when
  /// it is this block's. Then starts bringing back the next block's, which overlaps this one's
  /// recompute and backward. The host copy stays until the backward pass ends (retire()).
  ActivationBuffer restore_ahead() {
    const std::size_t top = stack.size() - 1;
    if (incoming.buffer.data() != nullptr && incoming.index != top) {
      // A checkpoint came between two backwards: the prefetch is of another block.
      incoming_done->order_compute_after();
      incoming.buffer = ActivationBuffer();
    }
    if (incoming.buffer.data() == nullptr) incoming = start_restore(top);
    ActivationBuffer input = std::move(incoming.buffer);
    // The recompute reads what the copy writes: the compute stream waits on the device.
    incoming_done->order_compute_after();
    gather_parts(stack[top], input);
    if (top > 0) incoming = start_restore(top - 1);
    return input;
  }

  /// partition_activations: this rank's part is in position in `input`; the others' parts arrive
  /// around it, in place.
  void gather_parts(const Kept& kept, ActivationBuffer& input) {
    if (partition == nullptr) return;
    const std::vector<std::int64_t> counts = part_counts(kept.bytes);
    partition->all_gather(input.data(), counts, DType::kFloat32);
  }

  /// cpu_checkpointing: a backpropagated block's host copy may still be read by a copy in flight;
  /// the copies are waited for, and the host copies freed, when the backward pass ends.
  void retire(Kept kept) {
    retired.push_back(std::move(kept));
    if (!stack.empty()) return;
    settle();
  }

  /// Waits for every copy in flight, then frees the device inputs they used and the host copies
  /// of backpropagated blocks.
  void settle() {
    if (!config.cpu_checkpointing) return;
    outgoing_done->wait();
    incoming_done->wait();
    outgoing = ActivationBuffer();
    incoming.buffer = ActivationBuffer();
    for (const Kept& kept : retired) add_kept(kept, -1);
    retired.clear();
  }

  void add_kept(const Kept& kept, int sign) {
    const std::int64_t bytes = sign * as_bytes(kept.slot >= 0 ? 0 : kept.part_bytes);
    if (kept.on_host) {
      kept_host += bytes;
    } else {
      kept_device += bytes;
    }
    update_peaks();
  }

  void update_peaks(std::int64_t transient_device = 0) {
    memory.kept_device = kept_device;
    memory.kept_host = kept_host;
    memory.peak_kept_device = std::max(memory.peak_kept_device, kept_device);
    memory.peak_kept_host = std::max(memory.peak_kept_host, kept_host);
    memory.peak_device = std::max(memory.peak_device, kept_device + transient_device);
  }

  static std::int64_t block_bytes(const BlockContext& context) {
    std::int64_t total = 0;
    for (int i = 0; i < context.activation_count(); ++i) {
      total += as_bytes(context.activation_bytes(i));
    }
    return total;
  }

  std::vector<std::vector<std::byte>> save_random() const {
    std::vector<std::vector<std::byte>> states;
    states.reserve(random.size());
    for (const RandomState* generator : random) states.push_back(generator->save());
    return states;
  }

  void restore_random(const std::vector<std::vector<std::byte>>& states) {
    for (std::size_t i = 0; i < random.size(); ++i) random[i]->restore(states[i]);
  }

  Engine& engine;
  detail::EngineState& state;
  const ActivationCheckpointingConfig& config;
  Communicator* partition = nullptr;  ///< the model-parallel group kept inputs are split over
  std::vector<RandomState*> random;
  std::vector<Kept> stack;
  std::vector<Kept> retired;  ///< cpu_checkpointing: backpropagated, host copies not yet freed
  std::unique_ptr<detail::CopyEvent> outgoing_done;  ///< the last kept input's copy to the host
  std::unique_ptr<detail::CopyEvent> incoming_done;  ///< the last prefetch's copy to the device
  // cpu_checkpointing: at most one block input on the device with a copy in flight, so at most
  // two at once with the running block's: in forward the previous block's, going out; in
  // backward the next block's, coming back.
  ActivationBuffer outgoing;
  Prefetch incoming;
  detail::TrackedBuffer contiguous;  ///< contiguous_memory_optimization's slots
  std::size_t slot_bytes = 0;
  std::int64_t kept_device = 0;
  std::int64_t kept_host = 0;
  CheckpointMemory memory;
  CheckpointProfile profile;
};

ActivationCheckpointer::ActivationCheckpointer(Engine& engine, Communicator* model_parallel)
    : impl_(std::make_unique<Impl>(engine, model_parallel)) {}

ActivationCheckpointer::~ActivationCheckpointer() = default;

void ActivationCheckpointer::register_random_state(RandomState& state) {
  if (!impl_->stack.empty()) {
    throw UsageError(
        "ActivationCheckpointer::register_random_state: " + std::to_string(impl_->stack.size()) +
        " checkpoints are pending; register generators before the first one");
  }
  impl_->random.push_back(&state);
}

ActivationBuffer ActivationCheckpointer::checkpoint(ActivationBuffer input, BlockFunction forward) {
  Impl& m = *impl_;
  if (input.data() == nullptr) {
    throw UsageError("ActivationCheckpointer::checkpoint: the block's input is empty");
  }
  const auto start = Clock::now();
  m.boundary();
  Impl::Kept kept;
  kept.random = m.save_random();
  BlockContext context(m.engine, input, /*recomputing=*/false);
  forward(context);
  if (context.activations_.empty()) {
    throw UsageError("ActivationCheckpointer::checkpoint: the block allocated no output");
  }
  m.update_peaks(as_bytes(input.bytes()) + Impl::block_bytes(context) +
                 as_bytes(m.outgoing.bytes()));
  ActivationBuffer output = std::move(context.activations_.back());
  context.activations_.clear();
  m.release_outgoing();
  m.keep(kept, std::move(input));
  kept.forward = std::move(forward);
  m.stack.push_back(std::move(kept));
  m.boundary();
  if (m.config.profile) {
    ++m.profile.checkpoints;
    m.profile.forward_seconds += detail::seconds_since(start);
  }
  return output;
}

void ActivationCheckpointer::backward(const BlockFunction& backward) {
  Impl& m = *impl_;
  if (m.stack.empty()) {
    throw UsageError("ActivationCheckpointer::backward: no checkpoint is pending");
  }
  Impl::Kept& kept = m.stack.back();
  const auto start = Clock::now();
  m.boundary();
  m.release_outgoing();
  ActivationBuffer input = m.config.cpu_checkpointing ? m.restore_ahead() : m.restore(kept);
  // The recompute draws what the first forward drew; the generators then go on from where the
  // program left them, so checkpointing changes no random number the rest of the model sees.
  const std::vector<std::vector<std::byte>> now = m.save_random();
  m.restore_random(kept.random);
  BlockContext context(m.engine, input, /*recomputing=*/true);
  kept.forward(context);
  m.restore_random(now);
  m.update_peaks(as_bytes(input.bytes()) + Impl::block_bytes(context) +
                 as_bytes(m.incoming.buffer.bytes()));
  if (m.config.profile) {
    m.boundary();
    m.profile.recompute_seconds += detail::seconds_since(start);
    ++m.profile.recomputes;
  }
  const auto backward_start = Clock::now();
  backward(context);
  Impl::Kept done = std::move(kept);
  m.stack.pop_back();
  if (m.config.cpu_checkpointing) {
    m.retire(std::move(done));
  }
  m.boundary();
  if (m.config.profile) {
    m.profile.backward_seconds += detail::seconds_since(backward_start);
    // Once per backward pass, on the steps_per_print cadence of the engine's own progress line.
    const std::int64_t every = m.engine.config().steps_per_print;
    const bool printing = every > 0 && (m.engine.global_step() + 1) % every == 0;
    if (m.stack.empty() && printing && m.engine.rank() == 0) {
      ZEROSHARD_LOG(kProgress, "activation checkpointing profile: "
                                   << m.profile.checkpoints << " checkpointed forwards "
                                   << m.profile.forward_seconds << " s, " << m.profile.recomputes
                                   << " recomputes " << m.profile.recompute_seconds << " s, "
                                   << "backwards " << m.profile.backward_seconds << " s");
    }
  }
}

int ActivationCheckpointer::pending() const noexcept {
  return static_cast<int>(impl_->stack.size());
}

void ActivationCheckpointer::clear() {
  impl_->settle();
  while (!impl_->stack.empty()) {
    impl_->add_kept(impl_->stack.back(), -1);
    impl_->stack.pop_back();
  }
}

CheckpointMemory ActivationCheckpointer::memory() const noexcept { return impl_->memory; }
CheckpointProfile ActivationCheckpointer::profile() const noexcept { return impl_->profile; }
void ActivationCheckpointer::reset_profile() noexcept { impl_->profile = CheckpointProfile{}; }

}  // namespace zeroshard
