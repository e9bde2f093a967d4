// A small multi-module model for the distributed engine tests: gradients are a deterministic
// function of the (gathered) parameters, the rank and the step, quantised to multiples of 2^-10
// so that sums over ranks are exact and sharded runs can be compared with one unsharded rank.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>  // program_invocation_short_name
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "precision/half_conversion.h"
#include "zeroshard/zeroshard.h"

namespace zeroshard::testing {

/// The device the engine tests run on: the GPU the local rank picks when ZEROSHARD_TEST_DEVICE is
/// cuda (the gpu-labelled copies of these tests), the CPU otherwise.
inline Device test_device() {
  const char* value = std::getenv("ZEROSHARD_TEST_DEVICE");
  return value != nullptr && std::string_view(value) == "cuda" ? Device::from_environment()
                                                               : Device::cpu();
}

/// A directory for swap files under the test's working directory (the build tree), one per test
/// program and world size so that the MPI tests ctest runs side by side never share a file (a
/// rank's files are named by its rank); every rank of a run names the same one.
inline std::string nvme_test_directory() {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  const std::filesystem::path path =
      std::filesystem::current_path() / ("nvme_swap_" + std::string(program_invocation_short_name) +
                                         "_np" + std::string(world ? world : "1"));
  std::filesystem::create_directories(path);
  return path.string();
}

/// An engine on the test device, with the communicator that device needs.
inline Engine make_engine(Config config, std::unique_ptr<UpdateRule> rule) {
  const Device device = test_device();
  return Engine(std::move(config), device, Communicator::from_environment(device), std::move(rule));
}

/// Where the engine's buffers are counted in its memory report.
inline MemoryLocation engine_memory(const Engine& engine) {
  return engine.device().is_cuda() ? MemoryLocation::kDevice : MemoryLocation::kHost;
}

/// Working memory a GPU backend holds under communication beyond the engine's buckets: the two
/// all-reduced step scalars, CUB's reduction workspace and its result scalars. None on the CPU.
inline std::int64_t backend_workspace_allowance(const Engine& engine) {
  return engine.device().is_cuda() ? std::int64_t{1} << 20 : 0;
}

/// Host copies of engine memory, and back: the toy models compute on the host whatever the
/// engine's device.
inline std::vector<char> to_host(const Engine& engine, const void* source, std::size_t bytes) {
  std::vector<char> host(bytes);
  copy_to_host(engine.device(), host.data(), source, bytes, engine.compute_stream());
  return host;
}
inline std::vector<float> floats_to_host(const Engine& engine, const float* source,
                                         std::int64_t count) {
  std::vector<float> host(count);
  copy_to_host(engine.device(), host.data(), source, count * sizeof(float),
               engine.compute_stream());
  return host;
}
inline void from_host(const Engine& engine, void* destination, const void* host,
                      std::size_t bytes) {
  copy_from_host(engine.device(), destination, host, bytes, engine.compute_stream());
}

struct ToyTensor {
  std::string name;
  std::int64_t numel;
  bool trainable = true;
};

/// Registration order = module order; the frozen tensor sits between two trainable modules.
inline std::vector<ToyTensor> uneven_toy_tensors() {
  return {{"a.weight", 91}, {"a.bias", 7},  {"frozen.table", 15, false},
          {"b.weight", 77}, {"b.bias", 11}, {"c.weight", 33},
          {"c.bias", 3}};
}

inline float initial_value(int tensor, std::int64_t i) {
  return static_cast<float>(std::sin(0.37 * (tensor + 1) + 0.011 * static_cast<double>(i))) * 0.5f;
}

/// Exactly representable: a multiple of 2^-10 with magnitude at most 4.
inline float quantise(double x) {
  x = std::fmax(-4.0, std::fmin(4.0, x));
  return static_cast<float>(std::nearbyint(x * 1024.0) / 1024.0);
}

/// d loss / d param for one rank at one step: depends on the parameter value so that stage 3's
/// gathers are exercised, and on the rank so that the reduction matters.
inline float toy_gradient(float param, int tensor, std::int64_t i, int rank, std::int64_t step) {
  const double data =
      std::cos(0.5 * rank + 0.13 * static_cast<double>(step) + 0.07 * tensor + 0.003 * i);
  return quantise(0.75 * param + data);
}

/// Registers the tensors with `engine` (every trainable tensor goes to `group` when given for
/// module "b") and initialises them.
inline std::vector<Parameter> register_toy(Engine& engine, const std::vector<ToyTensor>& tensors,
                                           int b_group = 0) {
  std::vector<Parameter> handles;
  for (const ToyTensor& t : tensors) {
    ParamOptions options;
    options.trainable = t.trainable;
    if (t.name.rfind("b.", 0) == 0) options.group = b_group;
    handles.push_back(engine.register_parameter(t.name, {t.numel}, options));
  }
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    std::vector<float> values(tensors[k].numel);
    for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
      values[i] = initial_value(static_cast<int>(k), i);
    }
    handles[k].copy_from(values);
  }
  return handles;
}

/// The module walk of one micro-step, as a model makes it: forward gathers every module in
/// order, backward gathers them again in reverse; inside each, `add_gradient(k)` writes trainable
/// tensor k's gradient, which is then handed over (unless `hand_over_each` is false: a model that
/// hands every gradient over at the end).
inline void toy_backward(Engine& engine, const std::vector<ToyTensor>& tensors,
                         const std::vector<Parameter>& handles,
                         const std::function<void(std::size_t)>& add_gradient,
                         bool hand_over_each = true) {
  std::vector<ModuleId> order;
  for (const Parameter& p : handles) {
    if (order.empty() || order.back() != p.module()) order.push_back(p.module());
  }
  for (ModuleId m : order) {
    auto guard = engine.gathered(m);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto guard = engine.gathered(*it);
    for (std::size_t k = tensors.size(); k-- > 0;) {
      if (handles[k].module() != *it || !tensors[k].trainable) continue;
      add_gradient(k);
      if (hand_over_each) engine.grad_ready(handles[k]);
    }
  }
}

/// Adds the toy gradient of trainable tensor k, computed from its current values, into its
/// gradient buffer.
inline void add_toy_gradient(Engine& engine, const Parameter& handle, std::size_t k,
                             std::int64_t step) {
  const std::int64_t n = handle.numel();
  const std::vector<float> w = floats_to_host(engine, handle.data(), n);
  float* grad = handle.grad();
  std::vector<float> g = floats_to_host(engine, grad, n);
  for (std::int64_t i = 0; i < n; ++i) {
    g[i] += toy_gradient(w[i], static_cast<int>(k), i, engine.rank(), step);
  }
  from_host(engine, grad, g.data(), n * sizeof(float));
}

/// One fp32 training micro-step with the toy gradients.
inline void toy_micro_step(Engine& engine, const std::vector<ToyTensor>& tensors,
                           const std::vector<Parameter>& handles, std::int64_t step) {
  toy_backward(engine, tensors, handles,
               [&](std::size_t k) { add_toy_gradient(engine, handles[k], k, step); });
}

/// A term added to the toy gradients: called once per trainable tensor k, before its values are
/// read, it returns the term of each element i.
using GradientTerm = std::function<std::function<float(std::int64_t)>(std::size_t)>;

/// One micro-step of the toy model in the engine's precision: each gradient is computed from the
/// values the model sees (plus `extra`'s term, when given), multiplied by the loss scale and added
/// into the gradient buffer in its type.
inline void toy_micro_step_any_precision(Engine& engine, const std::vector<ToyTensor>& tensors,
                                         const std::vector<Parameter>& handles, std::int64_t step,
                                         const GradientTerm& extra = {}) {
  const DType dtype = engine.model_dtype();
  const auto scale = static_cast<float>(engine.loss_scale());
  toy_backward(engine, tensors, handles, [&](std::size_t k) {
    const std::function<float(std::int64_t)> term = extra ? extra(k) : nullptr;
    const std::int64_t n = tensors[k].numel;
    const std::size_t bytes = n * size_of(dtype);
    const std::vector<char> raw_param = to_host(engine, handles[k].raw_data(), bytes);
    void* grad_buffer = handles[k].raw_grad();
    std::vector<char> raw_grad = to_host(engine, grad_buffer, bytes);
    std::vector<float> w(n);
    std::vector<float> g(n);
    detail::convert_to_float(raw_param.data(), dtype, w.data(), n);
    detail::convert_to_float(raw_grad.data(), dtype, g.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const float toy = toy_gradient(w[i], static_cast<int>(k), i, engine.rank(), step);
      g[i] += term ? scale * (toy + term(i)) : scale * toy;
    }
    detail::convert_from_float(g.data(), raw_grad.data(), dtype, n);
    from_host(engine, grad_buffer, raw_grad.data(), bytes);
  });
}

/// Runs `rule` over one whole tensor, as an unsharded optimizer would.
inline void apply_whole(const UpdateRule& rule, const ToyTensor& tensor, float* param,
                        const float* grad, std::vector<std::vector<float>>& state_arrays,
                        const StepContext& context) {
  std::vector<float*> states;
  for (auto& s : state_arrays) states.push_back(s.data());
  ShardSlice slice;
  slice.param_name = tensor.name;
  slice.param_numel = tensor.numel;
  slice.size = tensor.numel;
  slice.param = param;
  slice.grad = grad;
  slice.states = states;
  rule.apply(slice, context);
}

/// The trainable tensors' values, whole and in registration order, as
/// Engine::consolidated_parameters() returns them.
inline std::vector<float> trainable_concat(const std::vector<ToyTensor>& tensors,
                                           const std::vector<std::vector<float>>& values) {
  std::vector<float> result;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].trainable) result.insert(result.end(), values[k].begin(), values[k].end());
  }
  return result;
}

/// The 16-bit (or fp32) values the model sees, every trainable parameter gathered, as raw bytes.
inline std::vector<char> model_bytes(Engine& engine, const std::vector<ToyTensor>& tensors,
                                     const std::vector<Parameter>& handles) {
  std::vector<char> bytes;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    if (!tensors[k].trainable) continue;
    auto guard = engine.gathered(handles[k].module());
    const std::vector<char> data =
        to_host(engine, handles[k].raw_data(), tensors[k].numel * size_of(engine.model_dtype()));
    bytes.insert(bytes.end(), data.begin(), data.end());
  }
  return bytes;
}

/// The unsharded reference: one process, whole tensors, the same rule, the gradient of every
/// rank summed exactly and multiplied by the same factor the engine uses.
class ToyReference {
 public:
  ToyReference(const std::vector<ToyTensor>& tensors, const UpdateRule& rule, int world_size)
      : tensors_(tensors), rule_(rule), world_(world_size) {
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      std::vector<float> values(tensors[k].numel);
      for (std::int64_t i = 0; i < tensors[k].numel; ++i) {
        values[i] = initial_value(static_cast<int>(k), i);
      }
      params_.push_back(values);
      states_.emplace_back(rule.state_count(), std::vector<float>(tensors[k].numel, 0.0f));
    }
  }

  /// `lr_of(k)` gives tensor k's learning rate.
  void step(std::int64_t step, const std::function<double(std::size_t)>& lr_of,
            double weight_decay) {
    const float factor = static_cast<float>(1.0 / world_);
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      if (!tensors_[k].trainable) continue;
      std::vector<float> grad(tensors_[k].numel, 0.0f);
      for (std::int64_t i = 0; i < tensors_[k].numel; ++i) {
        for (int r = 0; r < world_; ++r) {
          grad[i] += toy_gradient(params_[k][i], static_cast<int>(k), i, r, step);
        }
        grad[i] *= factor;
      }
      StepContext context;
      context.step = step + 1;
      context.lr = lr_of(k);
      context.weight_decay = weight_decay;
      apply_whole(rule_, tensors_[k], params_[k].data(), grad.data(), states_[k], context);
    }
  }

  /// Trainable values, whole and in registration order, as Engine::consolidated_parameters().
  std::vector<float> trainable_values() const { return trainable_concat(tensors_, params_); }

 private:
  std::vector<ToyTensor> tensors_;
  const UpdateRule& rule_;
  int world_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<std::vector<float>>> states_;
};

/// Adds the parameter group "slow" (half the rule's learning rate) that register_toy puts the
/// "b." tensors in.
inline int add_slow_group(Engine& engine) {
  ParamGroupOptions slow;
  slow.name = "slow";
  slow.lr = engine.update_rule().default_lr() * 0.5;
  return engine.add_param_group(slow);
}

/// A built-in update rule, by name, built fresh for each engine or reference.
struct RuleCase {
  std::string name;
  std::function<std::unique_ptr<UpdateRule>()> make;
};

/// Every built-in rule, with options that make weight decay and momentum matter.
inline std::vector<RuleCase> rule_cases() {
  return {
      {"adamw",
       [] {
         AdamWOptions o;
         o.lr = 1e-2;
         o.weight_decay = 0.1;
         return make_adamw(o);
       }},
      {"adam",
       [] {
         AdamOptions o;
         o.lr = 1e-2;
         o.weight_decay = 0.05;
         return make_adam(o);
       }},
      {"sgd",
       [] {
         SgdOptions o;
         o.lr = 1e-2;
         o.momentum = 0.9;
         o.nesterov = true;
         return make_sgd(o);
       }},
      {"lion",
       [] {
         LionOptions o;
         o.lr = 1e-3;
         o.weight_decay = 0.1;
         return make_lion(o);
       }},
      {"adagrad",
       [] {
         AdagradOptions o;
         o.lr = 1e-2;
         o.lr_decay = 0.01;
         return make_adagrad(o);
       }},
  };
}

/// AdamW with lr 0.01 and weight decay 0.1: the rule the quantization tests (ZeRO++) train with.
inline std::unique_ptr<UpdateRule> decayed_adamw() {
  AdamWOptions options;
  options.lr = 1e-2;
  options.weight_decay = 0.1;
  return make_adamw(options);
}

struct MasterDifference {
  double largest = 0.0;  ///< the largest |difference| of one fp32 master element
  int rank = 0;
  int world = 1;
};

/// Trains `tensors` for `steps` steps twice, with config(false) and with config(true), each
/// micro-step made by micro_step(engine, tensors, handles, step), and compares the two fp32
/// masters: a quantized mode against the run without it. Every step must update, and the second
/// run's master must stay finite.
template <class MakeConfig, class MicroStep>
MasterDifference largest_master_difference(MakeConfig config, MicroStep micro_step,
                                           const std::vector<ToyTensor>& tensors, int steps) {
  std::vector<std::vector<float>> masters;
  MasterDifference result;
  for (const bool second : {false, true}) {
    Engine engine = make_engine(config(second), decayed_adamw());
    result.rank = engine.rank();
    result.world = engine.world_size();
    const auto handles = register_toy(engine, tensors);
    for (int step = 0; step < steps; ++step) {
      micro_step(engine, tensors, handles, step);
      EXPECT_TRUE(engine.step().updated) << "step " << step;
    }
    masters.push_back(engine.consolidated_parameters());
  }
  EXPECT_EQ(masters[0].size(), masters[1].size());
  for (std::size_t i = 0; i < std::min(masters[0].size(), masters[1].size()); ++i) {
    EXPECT_TRUE(std::isfinite(masters[1][i])) << i;
    result.largest =
        std::max(result.largest, std::fabs(static_cast<double>(masters[1][i]) - masters[0][i]));
  }
  return result;
}

// Runs `call`, which must throw E, and returns the message.
template <typename E, typename Call>
std::string message_of(Call&& call) {
  try {
    call();
  } catch (const E& error) {
    return error.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return {};
}

/// A config for `stage` with small buckets so that several buckets and gathers happen.
inline Config toy_config(int stage) {
  Config config;
  config.train_micro_batch_size_per_gpu = 1;
  config.gradient_clipping = 0.0;
  config.steps_per_print = 0;
  config.zero_optimization.stage = stage;
  config.zero_optimization.reduce_bucket_size = 100;
  config.zero_optimization.allgather_bucket_size = 64;
  config.zero_optimization.overlap_comm = true;
  config.zero_optimization.prefetch_bucket_size = 120;
  config.zero_optimization.param_persistence_threshold = 10;
  return config;
}

/// toy_config(stage) in `dtype` with two micro-steps per window. 2^8 keeps the scaled toy
/// gradients (|g| <= 4, summed over 4 ranks and 2 micro-steps) finite in fp16.
inline Config toy_config(int stage, DType dtype) {
  Config config = toy_config(stage);
  config.fp16.enabled = dtype == DType::kFloat16;
  config.fp16.initial_scale_power = 8;
  config.bf16.enabled = dtype == DType::kBFloat16;
  config.gradient_accumulation_steps = 2;
  return config;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace zeroshard::testing
