// The sweep's dimensions, the benchmark's command line, and the config of each configuration.
#include "memory_sweep.h"

#include <filesystem>
#include <functional>
#include <sstream>
#include <string_view>
#include <utility>

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
    std::filesystem::create_directories(kNvmeSwapFolder);
    offload["nvme_path"] = kNvmeSwapFolder;
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

int to_int(const std::string& text, const char* option, int low) {
  const std::int64_t value = parse_count(text, option);
  if (value < low || value > (1 << 20)) {
    throw UsageError(std::string(option) + ": got " + text + ", expected at least " +
                     std::to_string(low));
  }
  return static_cast<int>(value);
}

}  // namespace

void add_flags(CLI::App& app, BenchOptions& o, int argc, char** argv) {
  for (const Dimension& d : dimensions()) o.values.push_back(d.defaults);
  for (int i = 0; i < argc; ++i) o.arguments.emplace_back(argv[i]);
  app.description(
      "Measures, per rank, the bytes the engine holds for parameters, gradients, master weights, "
      "optimizer states, communication buffers and activations (current and peak), the process "
      "peak RSS, the step time and the bytes sent per step, for every combination of ZeRO stage, "
      "precision and world size, beside the figures of zeroshard-estimate. Launches itself under "
      "mpirun once per world size.");
  // Options run in the order they are added: --quick first, so that flags given with it win.
  app.add_flag_callback(
         "--quick",
         [&o] {
           o.params = 1'000'000;
           o.tensors = 8;
           o.layers = 0;
           o.reduce_bucket_size = 250'000;
           o.world_sizes = {1, 2, 3, 4};
           o.warmup_steps = 1;
           o.timed_steps = 2;
         },
         "1M parameters in 8 tensors, buckets of 250K, world sizes 1-4, one warmup and two timed "
         "steps: under a minute on 2 cores (the other flags given override it)")
      ->group("sweep");

  // Adds `flag` to `group`, its text handed to `set`.
  const auto flag = [&app](const char* group, const char* name, const char* type,
                           std::function<void(const std::string&)> set, const char* description) {
    cli::add_read_option(app, name, std::move(set), description)->type_name(type)->group(group);
  };
  const auto integer = [](int& field, const char* name, int low) {
    return [&field, name, low](const std::string& v) { field = to_int(v, name, low); };
  };
  const auto count = [](std::int64_t& field, const char* name) {
    return [&field, name](const std::string& v) { field = parse_count(v, name); };
  };
  flag("model", "--params", "P", count(o.params, "--params"),
       "trainable parameters of the synthetic model (default 16M)");
  flag("model", "--tensors", "T", integer(o.tensors, "--tensors", 1),
       "equal tensors it is split into, one module each (default 16)");
  flag("model", "--layers", "L", integer(o.layers, "--layers", 1),
       "the MLP example instead: L layers of width --width (fp32 only)");
  flag("model", "--width", "W", integer(o.width, "--width", 1), "the MLP's width (default 1024)");
  flag("model", "--inputs", "N", integer(o.inputs, "--inputs", 1),
       "the MLP's input size (default 64)");
  flag("model", "--classes", "C", integer(o.classes, "--classes", 1),
       "the MLP's classes (default 10)");
  flag("model", "--micro-batch", "B", integer(o.micro_batch, "--micro-batch", 1),
       "samples (GPT: sequences) per step (default 32)");
  flag(
      "model", "--gpt", "L,C,H,T",
      [&o](const std::string& v) {
        const std::vector<std::string> shape = split_list(v);
        if (shape.size() != 4) throw UsageError("--gpt: expected L,C,H,T, got '" + v + "'");
        o.gpt_layers = to_int(shape[0], "--gpt", 1);
        o.gpt_channels = to_int(shape[1], "--gpt", 1);
        o.gpt_heads = to_int(shape[2], "--gpt", 1);
        o.gpt_seq = to_int(shape[3], "--gpt", 1);
      },
      "the GPT example instead: L blocks, C channels, H heads, context T (byte vocabulary)");

  flag(
      "sweep", "--world-sizes", "1,2,3,4",
      [&o](const std::string& v) {
        o.world_sizes.clear();
        for (const std::string& n : split_list(v)) {
          o.world_sizes.push_back(to_int(n, "--world-sizes", 1));
        }
      },
      "ranks per run");
  for (std::size_t d = 0; d < dimensions().size(); ++d) {
    std::string defaults;
    for (const std::string& value : dimensions()[d].defaults) {
      defaults += (defaults.empty() ? "" : ",") + value;
    }
    cli::add_read_option(
        app, dimensions()[d].option, [&o, d](const std::string& v) { o.values[d] = split_list(v); },
        std::string(dimensions()[d].name) + " values, comma-separated (default " + defaults + ")")
        ->type_name("LIST")
        ->group("sweep");
  }
  flag("sweep", "--reduce-bucket-size", "N", count(o.reduce_bucket_size, "--reduce-bucket-size"),
       "elements (default 5e8, DeepSpeed's)");
  flag("sweep", "--persistence-threshold", "N",
       count(o.persistence_threshold, "--persistence-threshold"),
       "stage3_param_persistence_threshold (default 0: all sharded)");
  flag("sweep", "--max-reuse-distance", "N", count(o.max_reuse_distance, "--max-reuse-distance"),
       "stage3_max_reuse_distance (default 0: re-gather for backward)");
  flag("sweep", "--warmup", "N", integer(o.warmup_steps, "--warmup", 0),
       "untimed steps per configuration (default 1)");
  flag("sweep", "--steps", "N", integer(o.timed_steps, "--steps", 1),
       "timed steps per configuration (default 3)");

  app.add_option("--out-dir", o.out_dir, "JSON, CSV and plots")
      ->type_name("DIR")
      ->capture_default_str()
      ->group("output");
  app.add_option("--csv", o.csv, "the CSV's path (default OUT_DIR/memory_bench.csv)")
      ->type_name("FILE")
      ->group("output");
  app.add_option("--json", o.json, "the JSON's path (default OUT_DIR/memory_bench.json)")
      ->type_name("FILE")
      ->group("output");
  app.add_flag_callback(
         "--no-plot", [&o] { o.plot = false; }, "skip gnuplot")
      ->group("output");
  app.add_option("--mpirun", o.mpirun, "launcher")
      ->type_name("CMD")
      ->capture_default_str()
      ->group("output");
  app.add_option("--mpirun-flags", o.mpirun_flags, "its flags (default: as the test suite runs it)")
      ->type_name("\"...\"")
      ->group("output");
  // Set by the driver when it launches itself as a worker; not for users.
  app.add_option("--worker-dir", o.worker_dir)->group("");
  app.callback([&o] {
    for (std::size_t d = 0; d < dimensions().size(); ++d) {
      if (o.values[d].empty()) {
        throw CLI::ValidationError(dimensions()[d].option, "give at least one value");
      }
    }
    if (o.world_sizes.empty()) throw CLI::ValidationError("--world-sizes", "give at least one");
    if (!o.mlp() && !o.gpt() && o.params < o.tensors) {
      throw CLI::ValidationError(
          "--params",
          std::to_string(o.params) + " is fewer than --tensors " + std::to_string(o.tensors));
    }
    if (o.csv.empty()) o.csv = o.out_dir + "/memory_bench.csv";
    if (o.json.empty()) o.json = o.out_dir + "/memory_bench.json";
  });
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
