// The sweep's dimensions, the benchmark's command line, and the config of each configuration.
#include "memory_sweep.h"

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <string_view>

#include "zeroshard/error.h"
#include "zeroshard/quantity.h"

namespace zeroshard::bench {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

[[noreturn]] void unknown_value(const char* option, const std::string& value,
                                const char* expected) {
  throw UsageError(std::string(option) + ": got \"" + value + "\", expected " + expected);
}

void apply_offload(nlohmann::json& config, const char* section, const char* option,
                   const std::string& value) {
  if (value != "none" && value != "cpu" && value != "nvme") {
    unknown_value(option, value, "none, cpu or nvme");
  }
  if (value == "none") return;
  nlohmann::json& offload = config["zero_optimization"][section];
  offload["device"] = value;
  if (value == "nvme") {
    // Under the working directory (the build tree): a local file system that takes O_DIRECT,
    // apart from other checkouts' runs.
    const std::string path = "memory_bench_nvme_swap";
    std::filesystem::create_directories(path);
    offload["nvme_path"] = path;
    if (std::string_view(section) == "offload_param") {
      // DeepSpeed's max_in_cpu (1e9) would keep every shard here in memory, and its buffer_size
      // (1e8) would make each buffer larger than the shard: swap all of it in 1M-element tiles.
      offload["max_in_cpu"] = 0;
      offload["buffer_size"] = 1 << 20;
    }
  }
}

}  // namespace

const std::vector<Dimension>& dimensions() {
  // One row per axis of the sweep; a new axis is one more row here.
  static const std::vector<Dimension> kDimensions = {
      {"stage",
       "--stages",
       {"0", "1", "2", "3"},
       [](nlohmann::json& config, const std::string& value) {
         if (value.size() != 1 || value[0] < '0' || value[0] > '3') {
           unknown_value("--stages", value, "0, 1, 2 or 3");
         }
         config["zero_optimization"]["stage"] = value[0] - '0';
       }},
      {"precision",
       "--precisions",
       {"fp32", "fp16", "bf16"},
       [](nlohmann::json& config, const std::string& value) {
         if (value == "fp16" || value == "bf16") {
           config[value]["enabled"] = true;
         } else if (value != "fp32") {
           unknown_value("--precisions", value, "fp32, fp16 or bf16");
         }
       }},
      {"offload_optimizer",
       "--offload-optimizer",
       {"none", "cpu", "nvme"},
       [](nlohmann::json& config, const std::string& value) {
         apply_offload(config, "offload_optimizer", "--offload-optimizer", value);
       }},
      {"offload_param",
       "--offload-param",
       {"none", "cpu", "nvme"},
       [](nlohmann::json& config, const std::string& value) {
         apply_offload(config, "offload_param", "--offload-param", value);
       }},
      // A model option (the MLP checkpoints every K layers), not a config key; the config only
      // asks for the recompute to be timed.
      {"checkpoint_every",
       "--checkpoint-every",
       {"0"},
       [](nlohmann::json& config, const std::string& value) {
         const std::int64_t every = parse_count(value, "--checkpoint-every");
         if (every > 0) config["activation_checkpointing"]["profile"] = true;
       }},
  };
  return kDimensions;
}

std::string BenchOptions::model_description() const {
  if (gpt()) {
    return "GPT example: " + std::to_string(gpt_layers) + " blocks x " +
           std::to_string(gpt_channels) + " channels x " + std::to_string(gpt_heads) +
           " heads, context " + std::to_string(gpt_seq) + ", micro batch " +
           std::to_string(micro_batch) + " sequences";
  }
  if (mlp()) {
    return "MLP example: " + std::to_string(inputs) + " -> " + std::to_string(layers - 1) + " x " +
           std::to_string(width) + " -> " + std::to_string(classes) + ", micro batch " +
           std::to_string(micro_batch);
  }
  return "synthetic: " + format_count(params) + " parameters in " + std::to_string(tensors) +
         " tensors";
}

namespace {

constexpr const char* kUsage = R"(usage: zeroshard-memory-bench [options]

Measures, per rank, the bytes the engine holds for parameters, gradients, master weights,
optimizer states, communication buffers and activations (current and peak), the process peak
RSS, the step time and the bytes sent per step, for every combination of ZeRO stage, precision
and world size, beside the figures of zeroshard-estimate. Launches itself under mpirun once per
world size.

model (the synthetic one by default):
  --params P              trainable parameters of the synthetic model (default 16M)
  --tensors T             equal tensors it is split into, one module each (default 16)
  --layers L --width W    the MLP example instead: L layers of width W (fp32 only)
  --inputs N --classes C --micro-batch B    its input size, classes, samples per step
  --gpt L,C,H,T           the GPT example instead: L blocks, C channels, H heads, context T
                          (byte vocabulary; --micro-batch sequences per step)

sweep:
  --world-sizes 1,2,3,4   ranks per run
  --stages 0,1,2,3
  --precisions fp32,fp16,bf16
  --offload-optimizer none,cpu,nvme
  --offload-param none,cpu,nvme   (combinations refused are left out: optimizer offload at
                          stage 0, parameter offload below stage 3, and parameters on NVMe
                          without the optimizer on NVMe; nvme rows swap the whole parameter
                          shard: max_in_cpu 0, buffer_size 1M)
  --checkpoint-every 0,K  MLP or GPT: activation checkpointing every K layers (0 = off); with
                          --inputs and --classes equal to --width the activations are checked
                          against estimate_activations, and the recompute is timed
  --reduce-bucket-size N  elements (default 5e8, DeepSpeed's)
  --persistence-threshold N   stage3_param_persistence_threshold (default 0: all sharded)
  --max-reuse-distance N      stage3_max_reuse_distance (default 0: re-gather for backward)
  --warmup N --steps N    untimed and timed steps per configuration (default 1 and 3)
  --quick                 1M parameters in 8 tensors, buckets of 250K, world sizes 1-4,
                          one warmup and two timed steps: under a minute on 2 cores

output:
  --out-dir DIR           JSON, CSV and plots (default memory_bench_results)
  --csv FILE --json FILE  override their paths
  --no-plot               skip gnuplot
  --mpirun CMD            launcher (default mpirun)
  --mpirun-flags "..."    its flags (default: as the test suite runs it)
)";

int to_int(const std::string& text, const char* option, int low) {
  const std::int64_t value = parse_count(text, option);
  if (value < low || value > (1 << 20)) {
    throw UsageError(std::string(option) + ": got " + text + ", expected at least " +
                     std::to_string(low));
  }
  return static_cast<int>(value);
}

}  // namespace

BenchOptions parse_options(int argc, char** argv) {
  BenchOptions o;
  for (const Dimension& d : dimensions()) o.values.push_back(d.defaults);
  for (int i = 0; i < argc; ++i) o.arguments.emplace_back(argv[i]);

  using Setter = std::function<void(const std::string&)>;
  struct Flag {
    const char* name;
    Setter set;
  };
  std::vector<Flag> flags = {
      {"--params", [&](const std::string& v) { o.params = parse_count(v, "--params"); }},
      {"--tensors", [&](const std::string& v) { o.tensors = to_int(v, "--tensors", 1); }},
      {"--layers", [&](const std::string& v) { o.layers = to_int(v, "--layers", 1); }},
      {"--width", [&](const std::string& v) { o.width = to_int(v, "--width", 1); }},
      {"--inputs", [&](const std::string& v) { o.inputs = to_int(v, "--inputs", 1); }},
      {"--classes", [&](const std::string& v) { o.classes = to_int(v, "--classes", 1); }},
      {"--gpt",
       [&](const std::string& v) {
         const std::vector<std::string> shape = split_list(v);
         if (shape.size() != 4) throw UsageError("--gpt: expected L,C,H,T, got '" + v + "'");
         o.gpt_layers = to_int(shape[0], "--gpt", 1);
         o.gpt_channels = to_int(shape[1], "--gpt", 1);
         o.gpt_heads = to_int(shape[2], "--gpt", 1);
         o.gpt_seq = to_int(shape[3], "--gpt", 1);
       }},
      {"--micro-batch",
       [&](const std::string& v) { o.micro_batch = to_int(v, "--micro-batch", 1); }},
      {"--world-sizes",
       [&](const std::string& v) {
         o.world_sizes.clear();
         for (const std::string& n : split_list(v)) {
           o.world_sizes.push_back(to_int(n, "--world-sizes", 1));
         }
       }},
      {"--reduce-bucket-size",
       [&](const std::string& v) {
         o.reduce_bucket_size = parse_count(v, "--reduce-bucket-size");
       }},
      {"--persistence-threshold",
       [&](const std::string& v) {
         o.persistence_threshold = parse_count(v, "--persistence-threshold");
       }},
      {"--max-reuse-distance",
       [&](const std::string& v) {
         o.max_reuse_distance = parse_count(v, "--max-reuse-distance");
       }},
      {"--warmup", [&](const std::string& v) { o.warmup_steps = to_int(v, "--warmup", 0); }},
      {"--steps", [&](const std::string& v) { o.timed_steps = to_int(v, "--steps", 1); }},
      {"--out-dir", [&](const std::string& v) { o.out_dir = v; }},
      {"--csv", [&](const std::string& v) { o.csv = v; }},
      {"--json", [&](const std::string& v) { o.json = v; }},
      {"--mpirun", [&](const std::string& v) { o.mpirun = v; }},
      {"--mpirun-flags", [&](const std::string& v) { o.mpirun_flags = v; }},
      {"--worker-dir", [&](const std::string& v) { o.worker_dir = v; }},
  };
  for (std::size_t d = 0; d < dimensions().size(); ++d) {
    flags.push_back(
        {dimensions()[d].option, [&o, d](const std::string& v) { o.values[d] = split_list(v); }});
  }

  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg == "--no-plot") {
      o.plot = false;
      continue;
    }
    if (arg == "--quick") {
      o.params = 1'000'000;
      o.tensors = 8;
      o.layers = 0;
      o.reduce_bucket_size = 250'000;
      o.world_sizes = {1, 2, 3, 4};
      o.warmup_steps = 1;
      o.timed_steps = 2;
      continue;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags) {
      if (arg == f.name) flag = &f;
    }
    if (flag == nullptr) throw UsageError("unknown option " + arg + " (see --help)");
    if (i + 1 >= argc) throw UsageError(arg + ": missing value (see --help)");
    flag->set(argv[++i]);
  }
  for (std::size_t d = 0; d < dimensions().size(); ++d) {
    if (o.values[d].empty()) {
      throw UsageError(std::string(dimensions()[d].option) + ": give at least one value");
    }
  }
  if (o.world_sizes.empty()) throw UsageError("--world-sizes: give at least one");
  if (!o.mlp() && !o.gpt() && o.params < o.tensors) {
    throw UsageError("--params: " + std::to_string(o.params) + " is fewer than --tensors " +
                     std::to_string(o.tensors));
  }
  if (o.csv.empty()) o.csv = o.out_dir + "/memory_bench.csv";
  if (o.json.empty()) o.json = o.out_dir + "/memory_bench.json";
  return o;
}

std::string Configuration::label() const {
  std::string text;
  for (std::size_t d = 0; d < values.size(); ++d) {
    text += (d ? " " : "") + std::string(dimensions()[d].name) + "=" + values[d];
  }
  return text;
}

const std::string& Configuration::value(const char* dimension) const {
  for (std::size_t d = 0; d < dimensions().size(); ++d) {
    if (std::string(dimensions()[d].name) == dimension) return values[d];
  }
  throw UsageError(std::string("no sweep dimension named ") + dimension);
}

std::vector<Configuration> configurations(const BenchOptions& options) {
  std::vector<Configuration> result = {Configuration{}};
  for (const std::vector<std::string>& values : options.values) {
    std::vector<Configuration> next;
    for (const Configuration& partial : result) {
      for (const std::string& value : values) {
        Configuration c = partial;
        c.values.push_back(value);
        next.push_back(std::move(c));
      }
    }
    result = std::move(next);
  }
  // DeepSpeed's placement rules, and zeroshard's for parameters on NVMe: such a row would
  // measure nothing but the refusal.
  std::erase_if(result, [](const Configuration& c) {
    const bool stage0 = c.value("stage") == "0";
    const bool stage3 = c.value("stage") == "3";
    return (stage0 && c.value("offload_optimizer") != "none") ||
           (!stage3 && c.value("offload_param") != "none") ||
           (c.value("offload_param") == "nvme" && c.value("offload_optimizer") != "nvme");
  });
  // The synthetic model has no forward to checkpoint.
  if (!options.mlp() && !options.gpt()) {
    std::erase_if(result,
                  [](const Configuration& c) { return c.value("checkpoint_every") != "0"; });
  }
  return result;
}

nlohmann::json engine_config(const BenchOptions& options, const Configuration& configuration) {
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", options.micro_batch},
      {"gradient_accumulation_steps", 1},
      // Quiet: the worker's stdout carries its progress lines.
      {"steps_per_print", 1'000'000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"zero_optimization",
       {{"reduce_bucket_size", options.reduce_bucket_size},
        {"stage3_param_persistence_threshold", options.persistence_threshold},
        {"stage3_max_reuse_distance", options.max_reuse_distance}}},
  };
  for (std::size_t d = 0; d < dimensions().size(); ++d) {
    dimensions()[d].apply(config, configuration.values[d]);
  }
  return config;
}

}  // namespace zeroshard::bench
