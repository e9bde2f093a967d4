// The models the memory benchmark trains: a synthetic one of equal tensors with synthetic
// gradients (any size, any precision), and the MLP example (a real forward and backward).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memory_sweep.h"
#include "zeroshard/engine.h"
#include "zeroshard/memory_estimator.h"

namespace zeroshard::bench {

/// A model whose parameters live in an engine. Constructing one registers them; a model that
/// cannot run a configuration throws UsageError saying why.
class BenchModel {
 public:
  virtual ~BenchModel() = default;
  /// Sets the initial parameters (collective at stage 3).
  virtual void initialize() = 0;
  /// One forward and backward that hands every gradient to the engine; the caller steps.
  virtual void micro_step(std::int64_t step) = 0;
  /// Element counts of the trainable tensors, in registration order (the estimator's input).
  virtual std::vector<std::int64_t> tensor_numels() const = 0;
  /// The estimator's activation inputs: bytes outside a chain of equal layers, and the chain
  /// (layer_activation_bytes, layers, checkpoint_every); layers 0 when the model is no such chain.
  virtual EstimateInput activation_input() const { return {}; }
  /// Seconds spent running forwards again in backward, since construction.
  virtual double recompute_seconds() const { return 0.0; }
};

/// The model `options` describe, registered with `engine`, checkpointing every
/// `checkpoint_every` layers (the MLP only).
std::unique_ptr<BenchModel> make_model(const BenchOptions& options, Engine& engine,
                                       int checkpoint_every = 0);

/// True when this build has the MLP example (examples/mlp) to benchmark.
bool mlp_available();

}  // namespace zeroshard::bench
