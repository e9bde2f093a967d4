// zeroshard-step-floor: an engine step against its floor. For each ZeRO stage it times, with the
// model's arithmetic left out, the engine's work of one training iteration (stage-3 gathers,
// gradient hand-overs, step()) and, in the same run and on the same communicator, the work no
// engine can avoid: the stage's collectives, the norm's scalar all-reduce and one AdamW pass.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_median.h"
#include "comm/rank_counts.h"
#include "command_line.h"
#include "engine/engine_internals.h"  // the engine's step scalars, which the floor all-reduces too
#include "engine/engine_state.h"
#include "kernels/cpu/cpu_optimizer.h"  // cpu_optimizer::adam, active_isa: the update rule the engine runs
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::bench::median;

using zeroshard::Collective;
using zeroshard::Communicator;
using zeroshard::DType;
using zeroshard::Engine;
using zeroshard::ReduceOp;
using zeroshard::Request;
using Clock = std::chrono::steady_clock;
namespace cpu_optimizer = zeroshard::detail::cpu_optimizer;

constexpr const char* kDescription =
    "Each stage's engine step (model arithmetic left out) against its floor: the stage's "
    "collectives and one update pass, measured side by side. Run under mpirun, e.g.\n"
    "  OMP_NUM_THREADS=1 mpirun -np 2 zeroshard-step-floor";

// The engine's placement rule (src/engine/engine.cpp, kTensorAlignment): every tensor starts on a
// multiple of 16 elements and the total is padded to equal shards of such multiples. The program
// checks its copy of the layout against the engine's padded_numel() and shard_begin().
constexpr std::int64_t kAlignment = 16;

// Stage 3 with stage3_max_reuse_distance 0: a module's gathered copy is freed after its forward
// use and gathered again for backward, as for a model whose layers do not all stay gathered.
// The floor then has two all-gathers per module (DeepSpeed's default reuse distance would keep
// them all and halve that traffic).
constexpr int kReuseDistance = 0;

struct Options {
  std::int64_t params = 16777216;
  int layers = 8;
  std::int64_t bucket = 4194304;
  int iterations = 10;
  int warmup = 2;
  std::string stages = "0123";
  std::vector<DType> precisions = {DType::kFloat32};
  bool check = false;
  bool zeroed_grads = false;
  /// Stage 0 also with zero_optimization.reduce_scatter true: a reduce-scatter and an all-gather
  /// per bucket, beside its default all-reduce.
  bool stage0_reduce_scatter = false;
};

// "fp32,bf16": the precisions to measure, in order.
std::string parse_precisions(std::string_view value, std::vector<DType>& out) {
  out.clear();
  while (true) {
    const std::size_t comma = value.find(',');
    const std::string_view name = value.substr(0, comma);
    if (name == "fp32") {
      out.push_back(DType::kFloat32);
    } else if (name == "bf16") {
      out.push_back(DType::kBFloat16);
    } else if (name == "fp16") {
      out.push_back(DType::kFloat16);
    } else {
      return "expected fp32, bf16 or fp16, got '" + std::string(name) + "'";
    }
    if (comma == std::string_view::npos) return {};
    value.remove_prefix(comma + 1);
  }
}

void add_flags(CLI::App& app, Options& options) {
  using zeroshard::cli::add_integer;
  add_integer(app, "--params", options.params,
              "about P trainable parameters, as L layers of a W x 2W weight and a W bias, W a "
              "multiple of 64 (at least 64)",
              1, std::int64_t{1} << 31)
      ->type_name("P")
      ->capture_default_str();
  add_integer(app, "--layers", options.layers, "L, one module each", 1, 4096)
      ->type_name("L")
      ->capture_default_str();
  add_integer(app, "--bucket", options.bucket,
              "reduce_bucket_size and allgather_bucket_size in elements", 1, std::int64_t{1} << 31)
      ->type_name("B")
      ->capture_default_str();
  add_integer(app, "--iterations", options.iterations,
              "timed iterations of engine and floor each, alternated; medians are reported", 1,
              100000)
      ->capture_default_str();
  add_integer(app, "--warmup", options.warmup, "untimed iterations of each first", 1, 100000)
      ->capture_default_str();
  app.add_option("--stages", options.stages, "the ZeRO stages to measure, as digits")
      ->check(zeroshard::cli::stage_digits())
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--precision",
         [&options](const std::string& text) {
           const std::string problem = parse_precisions(text, options.precisions);
           if (!problem.empty()) throw CLI::ValidationError("--precision", problem);
         },
         "comma-separated list of fp32, bf16, fp16: one table each (default fp32)")
      ->type_name("LIST");
  app.add_flag("--zeroed-grads", options.zeroed_grads,
               "fetch gradients with raw_grad(), zeroed for a backward that adds them, instead of "
               "grad_target(), which hands them out unzeroed to a backward that writes them");
  app.add_flag("--stage0-reduce-scatter", options.stage0_reduce_scatter,
               "measure stage 0 a second time with zero_optimization.reduce_scatter true (a "
               "reduce-scatter and an all-gather per bucket, summing as stages 1-3 do) beside its "
               "default (one all-reduce per bucket, as DDP)");
  app.add_flag("--check", options.check,
               "exit 1 unless every stage gave a positive, finite ratio (for the test suite)");
}

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

const char* precision_json(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return R"(, "bf16": {"enabled": true})";
    case DType::kFloat16:
      return R"(, "fp16": {"enabled": true})";
    case DType::kFloat32:
    case DType::kFloat64:
      break;
  }
  return "";
}

std::string config_json(int stage, DType dtype, const Options& options, bool all_reduce) {
  // Stage 0 all-reduces unless reduce_scatter is given; the other stages reduce-scatter unless
  // it is false. Saying it every time keeps the rows' labels true whatever the defaults.
  const std::string bucket = std::to_string(options.bucket);
  std::string json =
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,)"
      R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},)"
      R"( "zero_optimization": {"stage": )" +
      std::to_string(stage) + R"(, "overlap_comm": true, "reduce_bucket_size": )" + bucket +
      R"(, "allgather_bucket_size": )" + bucket;
  if (stage == 3) json += R"(, "stage3_max_reuse_distance": )" + std::to_string(kReuseDistance);
  json += all_reduce ? R"(, "reduce_scatter": false)" : R"(, "reduce_scatter": true)";
  return json + "}" + precision_json(dtype) + "}";
}

// The model: `layers` modules of a [width, 2 width] weight and a [width] bias, in registration
// order, and the engine's flat layout of them.
struct Model {
  int layers = 0;
  std::int64_t width = 0;
  std::vector<std::int64_t> numels;   // per tensor, registration order
  std::vector<std::int64_t> offsets;  // flat offset of each tensor
  std::int64_t total = 0;             // trainable elements, without padding
  std::int64_t padded = 0;
  std::int64_t shard = 0;
  int world = 1;

  Model(const Options& options, int world_size) : layers(options.layers), world(world_size) {
    const double per_layer = static_cast<double>(options.params) / options.layers;
    width = std::max<std::int64_t>(64, std::llround(std::sqrt(per_layer / 2.0) / 64.0) * 64);
    std::int64_t cursor = 0;
    for (int l = 0; l < layers; ++l) {
      for (std::int64_t n : {2 * width * width, width}) {
        cursor = round_up(cursor, kAlignment);
        offsets.push_back(cursor);
        numels.push_back(n);
        cursor += n;
        total += n;
      }
    }
    padded = round_up(cursor, kAlignment * world);
    shard = padded / world;
  }

  /// Stage 3 keeps a tensor whole, outside its module's gathers, when it is small (the engine's
  /// rule, with stage3_param_persistence_threshold and stage3_model_persistence_threshold).
  std::vector<bool> persistent(std::int64_t param_threshold, std::int64_t model_threshold) const {
    std::vector<bool> result;
    std::int64_t kept = 0;
    for (std::int64_t n : numels) {
      const bool keep = n < param_threshold && kept + n <= model_threshold;
      if (keep) kept += n;
      result.push_back(keep);
    }
    return result;
  }

  std::int64_t module_begin(int layer) const { return offsets[2 * layer]; }
  std::int64_t module_end(int layer) const {
    return offsets[2 * layer + 1] + numels[2 * layer + 1];
  }

  /// Elements of [begin, end) each rank owns (rank r owns [r shard, (r + 1) shard)).
  std::vector<std::int64_t> rank_counts(std::int64_t begin, std::int64_t end) const {
    std::vector<std::int64_t> counts(world);
    for (int r = 0; r < world; ++r) {
      counts[r] =
          std::max<std::int64_t>(0, std::min(end, (r + 1) * shard) - std::max(begin, r * shard));
    }
    return counts;
  }
};

struct Bucket {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  int first_tensor = 0;  // the lowest tensor in it: its reduction may start once that is ready
};

// The engine's buckets (src/engine/grad_bucketer.cpp): they tile the flat buffer from the top,
// on tensor boundaries, each closing before it would exceed the limit.
std::vector<Bucket> plan_buckets(const Model& model, std::int64_t limit) {
  std::vector<Bucket> buckets;
  Bucket current{.begin = 0, .end = model.padded, .first_tensor = -1};
  for (int t = static_cast<int>(model.numels.size()) - 1; t >= 0; --t) {
    if (current.first_tensor >= 0 && current.end - model.offsets[t] > limit) {
      current.begin = model.offsets[current.first_tensor];
      buckets.push_back(current);
      current = Bucket{.begin = 0, .end = current.begin, .first_tensor = -1};
    }
    current.first_tensor = t;
  }
  current.begin = 0;
  buckets.push_back(current);
  return buckets;
}

// Requests in issue order, at most `limit` of them pending. The floor keeps two transfers in
// flight, the engine's bound for gradient reductions and parameter chunks; the engine's stage-3
// prefetch may start more gathers at once, which on CPU ranks buys nothing.
class InFlight {
 public:
  explicit InFlight(std::size_t limit) : limit_(limit) {}
  void push(Request request) {
    requests_.push_back(std::move(request));
    while (requests_.size() > limit_) {
      requests_.front().wait();
      requests_.pop_front();
    }
  }
  void drain() {
    for (Request& r : requests_) r.wait();
    requests_.clear();
  }

 private:
  std::size_t limit_;
  std::deque<Request> requests_;
};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The floor of one iteration: the collectives the engine's stage needs, with its bucket sizes and
// its in-flight bound, the scalar all-reduce of the gradient norm, and one AdamW pass over the
// elements this rank updates (all of them at stage 0, its shard otherwise), on arrays of its own,
// with the engine's arguments (the gradient in the model's type times a factor, and under 16 bits
// the rounded parameters written in the same pass), so the same kernel moves the same bytes. What
// it leaves out is what a perfect engine would fold into those passes: scaling the gradient by
// 1/world and the clip coefficient, scanning it for the norm, zeroing it and copying it between
// buffers.
//   stage 0: reduce-scatter of each gradient bucket, then the all-gather of its sums (with
//            reduce_scatter false: one all-reduce of each bucket).
//   stage 1, 2: reduce-scatter of each gradient bucket; all-gather of the parameters in
//            allgather_bucket_size chunks after the update.
//   stage 3: all-gather of each module for forward and again for backward (kReuseDistance), the
//            reduce-scatter of each bucket once backward has passed its lowest tensor, and after
//            the update an all-gather of each parameter kept whole (below
//            stage3_param_persistence_threshold: the biases; at tiny sizes every tensor, and then
//            a module holds none to gather).
class Floor {
 public:
  /// `step_scalars`: the floats of the engine's one scalar all-reduce per step (the norm, the
  /// overflow flag and the ranks' agreement digest).
  Floor(const Model& model, int stage, DType dtype, const zeroshard::ZeroConfig& zero,
        Communicator& comm, int step_scalars)
      : model_(model),
        step_scalars_(static_cast<std::size_t>(step_scalars)),
        stage_(stage),
        all_reduce_(stage == 0 && !zero.reduce_scatter),
        dtype_(dtype),
        gather_chunk_(std::max<std::int64_t>(zero.allgather_bucket_size, model.world)),
        persistent_(
            model.persistent(zero.param_persistence_threshold, zero.model_persistence_threshold)),
        comm_(comm),
        buckets_(plan_buckets(model, zero.reduce_bucket_size)) {
    const std::size_t dsize = zeroshard::size_of(dtype);
    update_size_ = stage == 0 ? model.padded : model.shard;
    grads_.assign(model.padded * dsize, std::byte{0});
    params_.assign(model.padded * dsize, std::byte{0});
    for (std::int64_t i = 0; i < model.padded; ++i) {
      // Any values do: the collectives' and the update's cost does not depend on them (stages
      // 0-1 reduce in place, so this rank's slice grows with every iteration).
      const float value = static_cast<float>(i % 13 - 6) * 1e-3f;
      zeroshard::convert(&value, DType::kFloat32, grads_.data() + i * dsize, dtype, 1);
    }
    std::int64_t widest = 0;
    for (const Bucket& b : buckets_) widest = std::max(widest, b.end - b.begin);
    if (stage >= 2) {
      for (std::vector<std::byte>& slot : recv_) slot.assign(widest * dsize, std::byte{0});
    }
    if (stage == 3) {
      for (int l = 0; l < model.layers; ++l) {
        gathered_.emplace_back((model.module_end(l) - model.module_begin(l)) * dsize);
      }
    }
    master_.assign(update_size_, 0.01f);
    grad32_.assign(update_size_, 1e-3f);
    exp_avg_.assign(update_size_, 0.0f);
    exp_avg_sq_.assign(update_size_, 0.0f);
  }

  struct Times {
    double comm_ms = 0.0;
    double update_ms = 0.0;
  };

  Times iterate() {
    Times times;
    const Clock::time_point start = Clock::now();
    InFlight pending(2);
    if (stage_ == 3) {
      for (int l = 0; l < model_.layers; ++l) {
        if (sharded(l)) pending.push(gather_module(l));
      }
      pending.drain();
      std::size_t next_bucket = 0;
      for (int l = model_.layers - 1; l >= 0; --l) {
        if (sharded(l)) pending.push(gather_module(l));
        // Backward has now produced the gradients of tensors 2l and above.
        while (next_bucket < buckets_.size() && buckets_[next_bucket].first_tensor >= 2 * l) {
          pending.push(reduce_bucket(next_bucket++));
        }
      }
      pending.drain();
    } else if (all_reduce_) {
      // One at a time: two MPI_Iallreduce in flight interleave their rounds and took 70 ms where
      // the same four took 38 ms one after the other (2 ranks, 16.8M fp32), and a floor takes
      // the faster order.
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const Bucket& bucket = buckets_[b];
        const std::size_t dsize = zeroshard::size_of(dtype_);
        comm_
            .all_reduce_async(grads_.data() + bucket.begin * dsize, bucket.end - bucket.begin,
                              dtype_, ReduceOp::kSum)
            .wait();
      }
    } else if (stage_ == 0) {
      // A bucket's sums are gathered back once its reduce-scatter is complete; the gather
      // overlaps the next bucket's reduce-scatter.
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        reduce_bucket(b).wait();
        pending.push(gather_bucket(b));
      }
      pending.drain();
    } else {
      for (std::size_t b = 0; b < buckets_.size(); ++b) pending.push(reduce_bucket(b));
      pending.drain();
    }
    std::vector<float> scalars(step_scalars_, 0.0f);
    comm_.all_reduce(scalars.data(), static_cast<std::int64_t>(scalars.size()), DType::kFloat32,
                     ReduceOp::kSum);
    const Clock::time_point update_start = Clock::now();
    update();
    times.update_ms = ms_since(update_start);
    const std::size_t dsize = zeroshard::size_of(dtype_);
    if (stage_ == 1 || stage_ == 2) {
      for (std::int64_t lo = 0; lo < model_.padded; lo += gather_chunk_) {
        const std::int64_t hi = std::min(model_.padded, lo + gather_chunk_);
        pending.push(comm_.all_gather_async(params_.data() + lo * dsize, model_.rank_counts(lo, hi),
                                            dtype_));
      }
    } else if (stage_ == 3) {
      for (std::size_t t = 0; t < model_.numels.size(); ++t) {
        if (!persistent_[t]) continue;
        const std::int64_t lo = model_.offsets[t];
        const std::int64_t hi = lo + model_.numels[t];
        // Into the tensor's place in params_, standing in for its persistent copy.
        std::vector<std::int64_t> counts = model_.rank_counts(lo, hi);
        pending.push(comm_.all_gather_async(params_.data() + lo * dsize, counts, dtype_));
      }
    }
    pending.drain();
    times.comm_ms = ms_since(start) - times.update_ms;
    return times;
  }

 private:
  bool sharded(int layer) const { return !persistent_[2 * layer] || !persistent_[2 * layer + 1]; }

  Request gather_module(int layer) {
    const std::int64_t lo = model_.module_begin(layer);
    const std::int64_t hi = model_.module_end(layer);
    return comm_.all_gather_async(gathered_[layer].data(), model_.rank_counts(lo, hi), dtype_);
  }

  Request reduce_bucket(std::size_t b) {
    const Bucket& bucket = buckets_[b];
    const std::size_t dsize = zeroshard::size_of(dtype_);
    const std::vector<std::int64_t> counts = model_.rank_counts(bucket.begin, bucket.end);
    std::byte* input = grads_.data() + bucket.begin * dsize;
    // As the engine: stages 0-1 reduce in place in the whole gradients, stages 2-3 into the
    // gradient shard (two receive areas here, one per reduction in flight).
    std::byte* output = recv_[b % 2].data();
    if (stage_ <= 1) {
      output = input + zeroshard::detail::offset_of(counts, comm_.rank()) *
                           static_cast<std::int64_t>(dsize);
    }
    return comm_.reduce_scatter_async(input, output, counts, dtype_, ReduceOp::kSum);
  }

  // Stage 0: every rank's sums of bucket b, gathered in place into the whole gradients.
  Request gather_bucket(std::size_t b) {
    const Bucket& bucket = buckets_[b];
    return comm_.all_gather_async(grads_.data() + bucket.begin * zeroshard::size_of(dtype_),
                                  model_.rank_counts(bucket.begin, bucket.end), dtype_);
  }

  void update() {
    ++step_;
    // AdamW's defaults with lr 1e-3 and weight decay 0.01, as in config_json().
    const double lr = 1e-3;
    const double beta1 = 0.9;
    const double beta2 = 0.999;
    const auto t = static_cast<double>(step_);
    const cpu_optimizer::AdamScalars scalars{
        .weight_factor = static_cast<float>(1.0 - lr * 0.01),
        .l2 = 0.0f,
        .beta1 = static_cast<float>(beta1),
        .one_minus_beta1 = static_cast<float>(1.0 - beta1),
        .beta2 = static_cast<float>(beta2),
        .one_minus_beta2 = static_cast<float>(1.0 - beta2),
        .step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t))),
        .inv_bias_correction2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(beta2, t))),
        .eps = 1e-8f,
    };
    float* states[2] = {exp_avg_.data(), exp_avg_sq_.data()};
    // The engine's call: the gradient read in the model's type times one factor (unscale x
    // average x clip), and under 16 bits the rounded parameters written in the same pass.
    const bool fp32 = dtype_ == DType::kFloat32;
    cpu_optimizer::adam(cpu_optimizer::active_isa(),
                        {.param = master_.data(),
                         .grad = fp32 ? static_cast<const void*>(grad32_.data()) : grads_.data(),
                         .states = states,
                         .grad_dtype = dtype_,
                         .grad_factor = 0.5f,
                         .param_copy = fp32 ? nullptr : params_.data(),
                         .param_copy_dtype = dtype_},
                        update_size_, scalars, false);
  }

  const Model& model_;
  std::size_t step_scalars_;
  int stage_;
  bool all_reduce_;  ///< stage 0 with reduce_scatter false
  DType dtype_;
  std::int64_t gather_chunk_;
  std::vector<bool> persistent_;  // per tensor, at stage 3
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  std::int64_t update_size_ = 0;
  std::int64_t step_ = 0;
  std::vector<std::byte> grads_;
  std::vector<std::byte> params_;
  std::array<std::vector<std::byte>, 2> recv_;
  std::vector<std::vector<std::byte>> gathered_;
  std::vector<float> master_;
  std::vector<float> grad32_;
  std::vector<float> exp_avg_;
  std::vector<float> exp_avg_sq_;
};

// The engine's part of one training iteration without the model's arithmetic: stage-3 gathers as
// forward and backward make them, every gradient handed over in reverse registration order (its
// buffer fetched as backward would fetch it), and step().
class EngineIteration {
 public:
  EngineIteration(Engine& engine, const Model& model, bool zeroed_grads)
      : engine_(engine), zeroed_grads_(zeroed_grads) {
    for (int l = 0; l < model.layers; ++l) {
      const std::string name = "layer" + std::to_string(l);
      params_.push_back(
          engine.register_parameter(name + ".weight", {model.width, 2 * model.width}));
      params_.push_back(engine.register_parameter(name + ".bias", {model.width}));
      modules_.push_back(engine.module(name));
    }
    engine.finalize();
    std::vector<float> values;
    for (const zeroshard::Parameter& p : params_) {
      values.assign(static_cast<std::size_t>(p.numel()), 0.01f);
      p.copy_from(values);
    }
  }

  struct Times {
    double backward_ms = 0.0;  // gathers and grad_ready calls
    double step_ms = 0.0;      // step() alone
  };

  /// The gradients are never written: the engine's work does not depend on their values, which
  /// stay the zeros the buffers start with (a sum of zeros, reduced in place or not, is zero), so
  /// no iteration overflows or meets a NaN whatever the precision and the iteration count.
  Times iterate() {
    Times times;
    const Clock::time_point start = Clock::now();
    for (zeroshard::ModuleId module : modules_) {
      const Engine::GatheredModule gathered = engine_.gathered(module);
    }
    for (std::size_t l = modules_.size(); l-- > 0;) {
      const Engine::GatheredModule gathered = engine_.gathered(modules_[l]);
      for (std::size_t p = 2 * l + 2; p-- > 2 * l;) {
        // A backward told to write a gradient (accumulate false) writes every element: that is
        // the model's arithmetic, left out as the adding into a zeroed one is.
        if (zeroed_grads_) {
          params_[p].raw_grad();
        } else {
          params_[p].grad_target();
        }
        engine_.grad_ready(params_[p]);
      }
    }
    const Clock::time_point step_start = Clock::now();
    times.backward_ms = std::chrono::duration<double, std::milli>(step_start - start).count();
    engine_.step();
    times.step_ms = ms_since(step_start);
    return times;
  }

 private:
  Engine& engine_;
  bool zeroed_grads_;
  std::vector<zeroshard::Parameter> params_;
  std::vector<zeroshard::ModuleId> modules_;
};

// What one iteration sent through the engine's communicator: calls and elements per collective.
struct Traffic {
  std::array<std::int64_t, zeroshard::kCollectiveCount> calls{};
  std::array<std::int64_t, zeroshard::kCollectiveCount> elements{};
  bool operator==(const Traffic&) const = default;

  long long total_calls() const { return std::accumulate(calls.begin(), calls.end(), 0LL); }
  long long total_elements() const {
    return std::accumulate(elements.begin(), elements.end(), 0LL);
  }
  /// "all-reduce 1 x 2, reduce-scatter 4 x 16777216, ..." (calls x elements), nonzero ones only.
  std::string describe() const {
    std::string text;
    for (int c = 0; c < zeroshard::kCollectiveCount; ++c) {
      if (calls[c] == 0) continue;
      if (!text.empty()) text += ", ";
      text += std::string(zeroshard::to_string(static_cast<Collective>(c))) + " " +
              std::to_string(calls[c]) + " x " + std::to_string(elements[c]);
    }
    return text;
  }
};

Traffic traffic_since(const zeroshard::TrafficCounters& before,
                      const zeroshard::TrafficCounters& after) {
  Traffic t;
  for (int c = 0; c < zeroshard::kCollectiveCount; ++c) {
    t.calls[c] = after.calls[c] - before.calls[c];
    t.elements[c] = after.elements[c] - before.elements[c];
  }
  return t;
}

struct StageResult {
  int stage = 0;
  bool all_reduce = false;  ///< stage 0 with reduce_scatter false
  double step_ms = 0.0;
  double backward_ms = 0.0;
  double step_call_ms = 0.0;
  double floor_ms = 0.0;
  double floor_comm_ms = 0.0;
  double floor_update_ms = 0.0;
  // The median over iterations of step / floor of the same iteration, measured back to back: less
  // touched by a slow spell of the machine than the ratio of the medians.
  double paired_ratio = 0.0;
  Traffic engine_traffic;
  Traffic floor_traffic;
};

// Times are each rank's, reduced to the slowest rank's: an iteration is as slow as its slowest
// rank. Every timed piece starts from a barrier on `host`, a communicator of the program's own.
StageResult measure(int stage, bool all_reduce, DType dtype, const Options& options,
                    const Model& model, Communicator& host) {
  const zeroshard::Config config = zeroshard::Config::from_json_string(
      config_json(stage, dtype, options, all_reduce), host.size());
  Engine engine(config, Communicator::from_environment());
  EngineIteration engine_iteration(engine, model, options.zeroed_grads);
  if (engine.padded_numel() != model.padded || engine.shard_begin() != model.shard * host.rank()) {
    throw zeroshard::UsageError(
        "the benchmark's copy of the engine's layout is out of date: padded " +
        std::to_string(engine.padded_numel()) + " vs " + std::to_string(model.padded));
  }
  Communicator& comm = engine.communicator();
  Floor floor(model, stage, dtype, config.zero_optimization, comm,
              2 + zeroshard::detail::EngineInternals::state(engine).step_agreement_floats());

  StageResult result;
  result.stage = stage;
  result.all_reduce = all_reduce;
  std::vector<double> step, backward, step_call, floor_total, floor_comm, floor_update;
  for (int i = 0; i < options.warmup + options.iterations; ++i) {
    const bool timed = i >= options.warmup;
    // Alternate which goes first, so that drifts in the machine's state touch both alike.
    for (int half = 0; half < 2; ++half) {
      const bool engine_turn = (half == 0) == (i % 2 == 0);
      host.barrier();
      const zeroshard::TrafficCounters before = comm.traffic();
      std::array<float, 3> t{};  // total, then its two parts
      if (engine_turn) {
        const EngineIteration::Times e = engine_iteration.iterate();
        t = {static_cast<float>(e.backward_ms + e.step_ms), static_cast<float>(e.backward_ms),
             static_cast<float>(e.step_ms)};
        result.engine_traffic = traffic_since(before, comm.traffic());
      } else {
        const Floor::Times f = floor.iterate();
        t = {static_cast<float>(f.comm_ms + f.update_ms), static_cast<float>(f.comm_ms),
             static_cast<float>(f.update_ms)};
        result.floor_traffic = traffic_since(before, comm.traffic());
      }
      host.all_reduce(t.data(), 3, DType::kFloat32, ReduceOp::kMax);
      if (!timed) continue;
      if (engine_turn) {
        step.push_back(t[0]);
        backward.push_back(t[1]);
        step_call.push_back(t[2]);
      } else {
        floor_total.push_back(t[0]);
        floor_comm.push_back(t[1]);
        floor_update.push_back(t[2]);
      }
    }
  }
  result.step_ms = median(step);
  result.backward_ms = median(backward);
  result.step_call_ms = median(step_call);
  result.floor_ms = median(floor_total);
  result.floor_comm_ms = median(floor_comm);
  result.floor_update_ms = median(floor_update);
  std::vector<double> ratios;
  for (std::size_t i = 0; i < step.size(); ++i) ratios.push_back(step[i] / floor_total[i]);
  result.paired_ratio = median(ratios);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, "zeroshard-step-floor");
  add_flags(app, options);
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  std::unique_ptr<Communicator> host;
  try {
    host = Communicator::from_environment();
    const bool print = host->rank() == 0;
    const Model model(options, host->size());
    if (print) {
      std::printf(
          "zeroshard-step-floor: %d rank(s), %d layers of a %lldx%lld weight and a %lld bias "
          "(%lld parameters), bucket %lld elements, AdamW, gradient_clipping 1.0, CPU update on "
          "%s; median of %d iterations after %d warm-up, engine and floor alternated, slowest "
          "rank\n"
          "  step:     the engine's iteration without the model: stage-3 gathers, grad_ready of "
          "each\n"
          "            parameter in reverse order (backward ms), step() (step() ms)\n"
          "  floor:    the stage's collectives on the engine's communicator and bucket sizes, "
          "the norm's\n"
          "            all-reduce (comm ms), and one AdamW pass over the updated elements "
          "(update ms)\n"
          "  paired:   the median of step / floor of the same iteration (the columns before it are "
          "medians\n"
          "            of their own, so step ms is not exactly backward ms + step() ms)\n"
          "  stage 3 runs with stage3_max_reuse_distance 0: each layer is gathered for forward and "
          "again\n"
          "  for backward; gradients are fetched with %s\n",
          host->size(), options.layers, static_cast<long long>(model.width),
          static_cast<long long>(2 * model.width), static_cast<long long>(model.width),
          static_cast<long long>(model.total), static_cast<long long>(options.bucket),
          cpu_optimizer::to_string(cpu_optimizer::active_isa()), options.iterations, options.warmup,
          options.zeroed_grads ? "raw_grad() (zeroed by the engine: a backward that adds)"
                               : "grad_target() (a backward that writes them, unzeroed)");
    }
    bool traffic_matches = true;
    bool sane = true;
    for (DType dtype : options.precisions) {
      if (print) {
        std::printf(
            "\n%s\nstage | step ms | backward ms | step() ms | floor ms | comm ms | update ms | "
            "step/floor | paired\n",
            zeroshard::to_string(dtype));
      }
      std::vector<StageResult> results;
      std::vector<std::pair<int, bool>> runs;
      for (char digit : options.stages) {
        runs.emplace_back(digit - '0', digit == '0');
        if (digit == '0' && options.stage0_reduce_scatter) runs.emplace_back(0, false);
      }
      for (const auto& [stage, all_reduce] : runs) {
        const StageResult r = measure(stage, all_reduce, dtype, options, model, *host);
        results.push_back(r);
        if (!(r.engine_traffic == r.floor_traffic)) traffic_matches = false;
        const double ratio = r.step_ms / r.floor_ms;
        sane = sane && std::isfinite(ratio) && ratio > 0.0 && std::isfinite(r.paired_ratio) &&
               r.paired_ratio > 0.0;
        if (print) {
          std::printf("%5s | %7.2f | %11.2f | %9.2f | %8.2f | %7.2f | %9.2f | %10.3f | %6.3f\n",
                      r.stage == 0 && !r.all_reduce ? "0 rs" : std::to_string(r.stage).c_str(),
                      r.step_ms, r.backward_ms, r.step_call_ms, r.floor_ms, r.floor_comm_ms,
                      r.floor_update_ms, ratio, r.paired_ratio);
          if (!(r.engine_traffic == r.floor_traffic)) {
            // The floor is then not this engine's floor: the benchmark needs updating.
            std::printf("      ^ traffic differs: engine %s; floor %s\n",
                        r.engine_traffic.describe().c_str(), r.floor_traffic.describe().c_str());
          }
          std::fflush(stdout);
        }
      }
      // Stage 0's two forms side by side: what summing as stages 1-3 do costs over DDP's form.
      const auto stage0 = [&results](bool all_reduce) -> const StageResult* {
        for (const StageResult& r : results) {
          if (r.stage == 0 && r.all_reduce == all_reduce) return &r;
        }
        return nullptr;
      };
      if (print && stage0(false) != nullptr && stage0(true) != nullptr) {
        std::printf(
            "stage 0, reduce-scatter + all-gather (\"reduce_scatter\": true) / all-reduce (the "
            "default): step %.3f, floor %.3f\n",
            stage0(false)->step_ms / stage0(true)->step_ms,
            stage0(false)->floor_ms / stage0(true)->floor_ms);
      }
      if (print) {
        std::printf(
            "csv,precision,stage,all_reduce,ranks,params,step_ms,backward_ms,step_call_ms,floor_ms,"
            "floor_comm_ms,floor_update_ms,ratio,paired_ratio,engine_calls,engine_elements,floor_"
            "calls,"
            "floor_elements\n");
        for (const StageResult& r : results) {
          std::printf(
              "csv,%s,%d,%d,%d,%lld,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%lld,%lld,%lld,%lld\n",
              zeroshard::to_string(dtype), r.stage, r.all_reduce ? 1 : 0, host->size(),
              static_cast<long long>(model.total), r.step_ms, r.backward_ms, r.step_call_ms,
              r.floor_ms, r.floor_comm_ms, r.floor_update_ms, r.step_ms / r.floor_ms,
              r.paired_ratio, r.engine_traffic.total_calls(), r.engine_traffic.total_elements(),
              r.floor_traffic.total_calls(), r.floor_traffic.total_elements());
        }
      }
    }
    if (print) {
      std::printf(traffic_matches
                      ? "\nEvery floor issued the engine's collectives (calls and elements).\n"
                      : "\nwarning: some floor's collectives differ from the engine's (above)\n");
    }
    if (options.check && !sane) {
      std::fprintf(stderr, "zeroshard-step-floor: a ratio was not positive and finite\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "zeroshard-step-floor: %s\n", error.what());
    if (host && host->size() > 1) host->abort(1);
    return 1;
  }
}
