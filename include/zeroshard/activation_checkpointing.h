// Activation (gradient) checkpointing: a block of the model's forward code keeps only its input;
// backward runs the block's forward again, just before the block's backward, to rebuild the
// activations it dropped, and frees them right after (DeepSpeed's `checkpointing` module).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <sstream>  // std::ostringstream, std::istringstream: StdRandomState's text state
#include <string>
#include <vector>

#include "zeroshard/communicator.h"
#include "zeroshard/engine.h"
#include "zeroshard/export.h"

namespace zeroshard {

/// The state of a random generator a checkpointed block draws from (dropout), so that the
/// recompute draws the same numbers as the first forward: save() before the forward, restore()
/// before the recompute, and the generator's own state put back after it.
class ZEROSHARD_API RandomState {
 public:
  virtual ~RandomState() = default;
  virtual std::vector<std::byte> save() const = 0;
  virtual void restore(std::span<const std::byte> state) = 0;
};

/// A standard library engine (std::mt19937, ...) through its stream operators. On a GPU, register
/// the state of the generator the model's kernels use (e.g. a Philox seed and offset) instead.
template <class Generator>
class StdRandomState final : public RandomState {
 public:
  explicit StdRandomState(Generator& generator) : generator_(&generator) {}
  std::vector<std::byte> save() const override {
    std::ostringstream text;
    text << *generator_;
    const std::string s = text.str();
    const auto* begin = reinterpret_cast<const std::byte*>(s.data());
    return std::vector<std::byte>(begin, begin + s.size());
  }
  void restore(std::span<const std::byte> state) override {
    std::istringstream text(std::string(reinterpret_cast<const char*>(state.data()), state.size()));
    text >> *generator_;
  }

 private:
  Generator* generator_;
};

/// What a block's forward and backward functions see.
class ZEROSHARD_API BlockContext {
 public:
  /// The block's input: in forward the buffer handed to checkpoint(), in backward the same bytes
  /// brought back from where they were kept.
  const ActivationBuffer& input() const noexcept { return *input_; }
  /// An activation of the block, `bytes` of zeroed memory on the engine's device charged to the
  /// memory report's activations. After forward only the last one allocated (the block's output)
  /// survives; the recompute allocates them again in the same order.
  float* allocate(std::size_t bytes);
  /// In backward: the `index`-th buffer the recompute allocated (its last is the output).
  float* activation(int index) const;
  std::size_t activation_bytes(int index) const;
  int activation_count() const noexcept { return static_cast<int>(activations_.size()); }
  /// True while the forward runs again inside backward().
  bool recomputing() const noexcept { return recomputing_; }

 private:
  friend class ActivationCheckpointer;
  BlockContext(Engine& engine, const ActivationBuffer& input, bool recomputing)
      : engine_(&engine), input_(&input), recomputing_(recomputing) {}
  Engine* engine_;
  const ActivationBuffer* input_;
  bool recomputing_;
  std::vector<ActivationBuffer> activations_;
};

/// A block's forward or backward: model code that reads ctx.input() and the parameters (gathering
/// its modules at stage 3 as it would without checkpointing) and writes ctx.allocate()d buffers.
using BlockFunction = std::function<void(BlockContext&)>;

/// Where the checkpointer's bytes are, current and peak, by where they live: "device" is the
/// engine's device memory (host memory on a CPU engine), "host" the pinned host memory that
/// cpu_checkpointing moves kept inputs to. Every byte is also in the memory report's activations.
struct CheckpointMemory {
  std::int64_t kept_device = 0;  ///< kept inputs (or this rank's part of them) on the device
  std::int64_t kept_host = 0;    ///< kept inputs in pinned host memory
  std::int64_t peak_kept_device = 0;
  std::int64_t peak_kept_host = 0;
  /// Kept inputs, restored inputs and the activations of the block running, on the device.
  std::int64_t peak_device = 0;
};

/// Time spent, with `activation_checkpointing.profile` (zero otherwise), since the last reset; the
/// totals are also logged after a backward pass on rank 0 every steps_per_print steps.
struct CheckpointProfile {
  std::int64_t checkpoints = 0;    ///< forwards run through checkpoint()
  std::int64_t recomputes = 0;     ///< forwards run again in backward()
  double forward_seconds = 0.0;    ///< first forwards, with keeping their inputs
  double recompute_seconds = 0.0;  ///< bringing inputs back and running forwards again
  double backward_seconds = 0.0;   ///< the blocks' backward functions
};

/// Runs blocks of a model's forward with checkpointing, as the engine's config's
/// `activation_checkpointing` section says (docs/activation-checkpointing.md). Blocks are
/// backpropagated in the reverse order of their forwards. Not copyable; destroy it before its
/// engine (its buffers come from the engine's allocator).
class ZEROSHARD_API ActivationCheckpointer {
 public:
  /// `model_parallel` (may be null, then partition_activations has nothing to split) is the group
  /// of ranks holding the same activations, over which partition_activations splits kept inputs;
  /// it must outlive the checkpointer and take buffers on the engine's device. Throws ConfigError
  /// naming a key the engine's device cannot honour.
  explicit ActivationCheckpointer(Engine& engine, Communicator* model_parallel = nullptr);
  ActivationCheckpointer(const ActivationCheckpointer&) = delete;
  ActivationCheckpointer& operator=(const ActivationCheckpointer&) = delete;
  ~ActivationCheckpointer();

  /// A generator whose state every checkpoint saves and every recompute restores. Must outlive
  /// the checkpointer.
  void register_random_state(RandomState& state);

  /// Runs `forward` on `input` (consumed), keeps the input and returns the block's output: the
  /// last buffer forward allocated; its other activations are freed. `forward` is kept to be run
  /// again. UsageError when forward allocates nothing or `input` is empty.
  ActivationBuffer checkpoint(ActivationBuffer input, BlockFunction forward);
  /// The backward of the latest checkpoint not yet backpropagated: brings its input back,
  /// restores the registered generators, runs its forward again, then `backward` with the rebuilt
  /// activations, and frees them all. UsageError when no checkpoint is pending.
  void backward(const BlockFunction& backward);
  /// Checkpoints not yet backpropagated.
  int pending() const noexcept;
  /// Drops every pending checkpoint (a forward that is not followed by backward, e.g. evaluation).
  void clear();

  CheckpointMemory memory() const noexcept;
  CheckpointProfile profile() const noexcept;
  void reset_profile() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zeroshard
