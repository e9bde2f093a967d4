// zeroshard-estimate: per-rank device, host and NVMe memory a ZeRO configuration needs, for one
// stage or every stage side by side, without running anything; and the largest model that fits.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/command_line.h"
#include "tools/config_override_flags.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"
#include "zeroshard/memory_estimator.h"
#include "zeroshard/quantity.h"

namespace {

using zeroshard::DType;
using zeroshard::EstimateInput;
using zeroshard::MemoryCategory;
using zeroshard::MemoryEstimate;
using zeroshard::MemoryTier;
using zeroshard::OffloadDevice;
using zeroshard::UsageError;

constexpr const char* kDescription =
    "Per-rank memory a ZeRO configuration needs, computed from the engine's allocation rules.\n"
    "Decimal GB (10^9 bytes, as the ZeRO paper counts) beside GiB (2^30 bytes). Exit status 2 "
    "for a bad command line or config.";

struct Options {
  std::optional<std::int64_t> params;
  std::string config_path;
  std::optional<int> ranks;
  std::optional<int> nodes;
  std::optional<int> stage;  ///< empty: every stage
  bool stage_given = false;
  std::optional<DType> precision;
  std::optional<std::string> optimizer;
  std::optional<OffloadDevice> offload_optimizer;
  std::optional<OffloadDevice> offload_param;
  std::optional<double> offload_ratio;
  std::optional<std::int64_t> reduce_bucket_size;
  std::optional<std::int64_t> largest_tensor;
  std::optional<std::int64_t> persistent_params;
  std::optional<std::int64_t> frozen_params;
  std::optional<std::int64_t> largest_frozen_module;
  std::optional<std::int64_t> fit_memory;
  bool json = false;
  zeroshard::ConfigOverrides overrides;  ///< "auto" values of the config
};

int parse_int(std::string_view text, std::string_view option, int low, int high) {
  const std::int64_t value = zeroshard::parse_count(text, option);
  if (value < low || value > high) {
    throw UsageError(std::string(option) + ": got " + std::string(text) + ", expected " +
                     std::to_string(low) + ".." + std::to_string(high));
  }
  return static_cast<int>(value);
}

DType parse_precision(std::string_view text) {
  if (text == "fp32") return DType::kFloat32;
  if (text == "fp16") return DType::kFloat16;
  if (text == "bf16") return DType::kBFloat16;
  throw UsageError("--precision: got \"" + std::string(text) + "\", expected fp32, fp16 or bf16");
}

OffloadDevice parse_offload(std::string_view text, std::string_view option) {
  if (text == "none") return OffloadDevice::kNone;
  if (text == "cpu") return OffloadDevice::kCpu;
  if (text == "nvme") return OffloadDevice::kNvme;
  throw UsageError(std::string(option) + ": got \"" + std::string(text) +
                   "\", expected none, cpu or nvme");
}

double parse_share(std::string_view text, std::string_view option) {
  double value = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || !(value > 0.0 && value <= 1.0)) {
    throw UsageError(std::string(option) + ": got " + std::string(text) +
                     ", expected a share in (0, 1]");
  }
  return value;
}

/// Adds the flags that fill `options`; each rejects a bad value with a message naming it.
void add_flags(CLI::App& app, Options& options) {
  using zeroshard::cli::add_read_option;
  const auto count = [](std::optional<std::int64_t>& field, const char* flag) {
    return [&field, flag](const std::string& text) { field = zeroshard::parse_count(text, flag); };
  };
  const auto integer = [](std::optional<int>& field, const char* flag) {
    return [&field, flag](const std::string& text) { field = parse_int(text, flag, 1, 1 << 24); };
  };
  const auto offload = [](std::optional<OffloadDevice>& field, const char* flag) {
    return [&field, flag](const std::string& text) { field = parse_offload(text, flag); };
  };
  add_read_option(app, "--params", count(options.params, "--params"),
                  "trainable parameters: 7500000000, 7.5e9, 7.5B, 1.3M")
      ->type_name("P")
      ->required();
  app.add_option("--config", options.config_path,
                 "a DeepSpeed-style JSON config: stage, precision, optimizer, offload and bucket "
                 "sizes come from it (the flags below override)")
      ->type_name("FILE");
  add_read_option(app, "--ranks", integer(options.ranks, "--ranks"),
                  "data-parallel world size (default 1)")
      ->type_name("N");
  add_read_option(app, "--nodes", integer(options.nodes, "--nodes"),
                  "nodes the ranks span; host memory is also shown per node (default 1)")
      ->type_name("K");
  add_read_option(
      app, "--stage",
      [&options](const std::string& text) {
        options.stage_given = true;
        if (text != "all") options.stage = parse_int(text, "--stage", 0, 3);
      },
      "ZeRO stage 0-3, or all side by side (default: all, or the config's)")
      ->type_name("S|all");
  add_read_option(
      app, "--precision",
      [&options](const std::string& text) { options.precision = parse_precision(text); },
      "parameter and gradient type; 16-bit adds fp32 master weights")
      ->type_name("fp32|fp16|bf16");
  add_read_option(
      app, "--optimizer",
      [&options](const std::string& text) {
        try {
          zeroshard::optimizer_state_arrays(text);  // rejects unknown names with the allowed ones
        } catch (const zeroshard::Error& error) {
          throw UsageError(std::string("--optimizer: ") + error.what());
        }
        options.optimizer = text;
      },
      "adamw|adam|sgd|lion|adagrad (default adamw)")
      ->type_name("NAME");
  add_read_option(app, "--offload-optimizer",
                  offload(options.offload_optimizer, "--offload-optimizer"),
                  "where the optimizer states live")
      ->type_name("none|cpu|nvme");
  add_read_option(
      app, "--offload-ratio",
      [&options](const std::string& text) {
        options.offload_ratio = parse_share(text, "--offload-ratio");
      },
      "share of each rank's optimizer shard offloaded, in (0, 1] (offload_optimizer.ratio; the "
      "rest stays on the device)")
      ->type_name("R");
  add_read_option(app, "--offload-param", offload(options.offload_param, "--offload-param"),
                  "where the parameters live (stage 3)")
      ->type_name("none|cpu|nvme");
  add_read_option(app, "--reduce-bucket-size",
                  count(options.reduce_bucket_size, "--reduce-bucket-size"),
                  "elements (default 5e8, DeepSpeed's)")
      ->type_name("N");
  add_read_option(app, "--largest-tensor", count(options.largest_tensor, "--largest-tensor"),
                  "elements of the largest parameter tensor (default: none is larger than a "
                  "bucket)")
      ->type_name("N");
  add_read_option(app, "--persistent-params",
                  count(options.persistent_params, "--persistent-params"),
                  "stage 3: elements kept whole on every rank (default 0)")
      ->type_name("N");
  add_read_option(app, "--frozen-params", count(options.frozen_params, "--frozen-params"),
                  "frozen (non-trainable) elements, whole on every rank; int8 blocks under the "
                  "config's zero_quantized_nontrainable_weights (default 0)")
      ->type_name("N");
  add_read_option(app, "--largest-frozen-module",
                  count(options.largest_frozen_module, "--largest-frozen-module"),
                  "with zero_quantized_nontrainable_weights: the most frozen elements gathered "
                  "at once, decoded (default: all of them)")
      ->type_name("N");
  add_read_option(
      app, "--fit-memory",
      [&options](const std::string& text) {
        options.fit_memory = zeroshard::parse_bytes(text, "--fit-memory");
      },
      "also print the largest model that fits in BYTES of device memory per rank, per stage: "
      "80GB, 80e9, 40GiB")
      ->type_name("BYTES");
  app.add_flag("--json", options.json,
               "print the estimates as a JSON array (one object per stage, bytes per rank) "
               "instead of the table, for scripts");
  zeroshard::tools::add_override_flags(app, options.overrides);
}

/// The input the options describe: the config's settings first, then every flag given.
EstimateInput make_input(const Options& options, std::vector<std::string>& notices) {
  const int ranks = options.ranks.value_or(1);
  EstimateInput in;
  if (!options.config_path.empty()) {
    const auto config =
        zeroshard::Config::from_json_file(options.config_path, ranks, options.overrides);
    notices = config.notices();
    in = zeroshard::estimate_input_from_config(config, *options.params, ranks);
    if (config.optimizer.type.empty() && !options.optimizer) {
      notices.push_back("the config names no optimizer; assuming adamw");
    }
  }
  in.params = *options.params;
  in.ranks = ranks;
  in.nodes = options.nodes.value_or(1);
  if (options.stage) in.stage = *options.stage;
  if (options.precision) in.precision = *options.precision;
  if (options.optimizer) {
    in.optimizer = *options.optimizer;
    in.optimizer_state_arrays = -1;
  }
  if (options.offload_optimizer) in.offload_optimizer = *options.offload_optimizer;
  if (options.offload_param) in.offload_param = *options.offload_param;
  if (options.offload_ratio) in.offload_ratio = *options.offload_ratio;
  if (options.reduce_bucket_size) in.reduce_bucket_size = *options.reduce_bucket_size;
  if (options.largest_tensor) in.largest_tensor = *options.largest_tensor;
  if (options.persistent_params) in.persistent_params = *options.persistent_params;
  if (options.frozen_params) in.frozen_params = *options.frozen_params;
  if (options.largest_frozen_module) in.largest_frozen_module = *options.largest_frozen_module;
  return in;
}

const char* precision_description(DType precision) {
  switch (precision) {
    case DType::kFloat32:
      return "fp32 (parameters are the master weights)";
    case DType::kFloat16:
      return "fp16 parameters and gradients, fp32 master weights";
    case DType::kBFloat16:
      return "bf16 parameters and gradients, fp32 master weights";
    case DType::kFloat64:
      break;  // not a model precision: the estimator refuses it
  }
  return "?";
}

/// "   31.4 GB  29.25 GiB": the decimal figure the ZeRO paper prints, then the binary one.
std::string cell(std::int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%10s %11s", zeroshard::format_decimal_bytes(bytes).c_str(),
                bytes == 0 ? "" : zeroshard::format_binary_bytes(bytes).c_str());
  return text;
}

/// One line of the table: a figure of every estimate, shown when it is non-zero somewhere.
struct Row {
  std::string label;
  std::function<std::int64_t(const MemoryEstimate&)> bytes;
  bool always = false;
};

std::vector<Row> table_rows() {
  using Get = std::function<std::int64_t(const MemoryEstimate&)>;
  const auto category = [](MemoryCategory c, MemoryTier tier) -> Get {
    return [c, tier](const MemoryEstimate& e) { return e.at(c, tier); };
  };
  std::vector<Row> rows;
  for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme}) {
    const bool device = tier == MemoryTier::kDevice;
    rows.push_back(
        {std::string(zeroshard::to_string(tier)) + (device ? "" : " (offload)"), nullptr, true});
    rows.push_back({"  parameters", category(MemoryCategory::kParameters, tier), device});
    rows.push_back({"  gradients", category(MemoryCategory::kGradients, tier), device});
    rows.push_back({"  master weights", category(MemoryCategory::kMasterWeights, tier), device});
    rows.push_back(
        {"  optimizer states", category(MemoryCategory::kOptimizerStates, tier), device});
    rows.push_back({device ? "  model states (ZeRO paper)" : "  model states",
                    [tier](const MemoryEstimate& e) { return e.model_state_bytes(tier); }, device});
    rows.push_back(
        {"  communication buffers", category(MemoryCategory::kCommunication, tier), device});
    rows.push_back({"  activations (given)", category(MemoryCategory::kActivations, tier)});
    rows.push_back({"  total", [tier](const MemoryEstimate& e) { return e.total(tier); }, true});
    if (device) {
      rows.push_back({"  + stage-3 gathered (transient)",
                      [](const MemoryEstimate& e) { return e.transient_device_bytes; }});
      rows.push_back({"  peak", [](const MemoryEstimate& e) { return e.device_peak(); }, true});
    }
    if (tier == MemoryTier::kHost) {
      rows.push_back({"  per node", [](const MemoryEstimate& e) { return e.host_per_node(); }});
    }
  }
  rows.push_back({"sent per step (2P; 3P at stage 3)",
                  [](const MemoryEstimate& e) { return e.traffic_bytes_per_step; }, true});
  return rows;
}

void print_header(const EstimateInput& in) {
  std::cout << "zeroshard-estimate: " << zeroshard::format_count(in.params)
            << " trainable parameters (" << in.params << "), " << in.ranks
            << (in.ranks == 1 ? " rank" : " ranks") << " on " << in.nodes
            << (in.nodes == 1 ? " node" : " nodes") << "\n"
            << "  precision: " << precision_description(in.precision) << "\n"
            << "  optimizer: " << in.optimizer
            << ", offload_optimizer: " << zeroshard::to_string(in.offload_optimizer)
            << (in.offload_optimizer != OffloadDevice::kNone && in.offload_ratio < 1.0
                    ? " (ratio " + (std::ostringstream() << in.offload_ratio).str() + ")"
                    : std::string())
            << ", offload_param: " << zeroshard::to_string(in.offload_param) << "\n"
            << "  reduce_bucket_size: " << in.reduce_bucket_size << " elements, largest tensor: "
            << (in.largest_tensor > 0 ? std::to_string(in.largest_tensor) + " elements"
                                      : std::string("none larger than a bucket"))
            << "\n"
            << "  " << zeroshard::device_memory_meaning() << "\n"
            << "  bytes per rank; GB = 10^9 bytes (as the ZeRO paper counts), GiB = 2^30 bytes\n\n";
}

void print_line(const std::string& label, const std::vector<std::string>& cells) {
  constexpr int kLabel = 32;
  constexpr int kColumn = 24;
  char text[128];
  std::snprintf(text, sizeof text, "%-*s", kLabel, label.c_str());
  std::string line = text;
  for (const std::string& cell : cells) {
    std::snprintf(text, sizeof text, "%*s", kColumn, cell.c_str());
    line += text;
  }
  line.erase(line.find_last_not_of(' ') + 1);
  std::cout << line << "\n";
}

void print_estimates(const std::vector<MemoryEstimate>& estimates,
                     const std::optional<std::int64_t>& fit_memory) {
  print_header(estimates.front().input);
  std::vector<std::string> cells;
  for (const MemoryEstimate& e : estimates)
    cells.push_back("stage " + std::to_string(e.input.stage));
  print_line("", cells);
  for (const Row& row : table_rows()) {
    cells.clear();
    bool any = row.always;
    for (const MemoryEstimate& e : estimates) {
      if (!row.bytes) {
        cells.emplace_back();
      } else if (!e.valid) {
        cells.emplace_back("n/a");
      } else {
        any = any || row.bytes(e) != 0;
        cells.push_back(cell(row.bytes(e)));
      }
    }
    if (any) print_line(row.label, cells);
  }
  if (fit_memory) {
    cells.clear();
    for (const MemoryEstimate& e : estimates) {
      cells.push_back(
          e.valid
              ? zeroshard::format_count(zeroshard::largest_model(*fit_memory, e.input)) + " params"
              : "n/a");
    }
    print_line("largest model in " + zeroshard::format_decimal_bytes(*fit_memory), cells);
  }
  // Each note once, with the stages it applies to.
  std::vector<std::pair<std::string, std::string>> notes;
  const auto add_note = [&notes](int stage, const std::string& text) {
    for (auto& [stages, note] : notes) {
      if (note == text) {
        stages += ", " + std::to_string(stage);
        return;
      }
    }
    notes.emplace_back("stage " + std::to_string(stage), text);
  };
  for (const MemoryEstimate& e : estimates) {
    if (!e.valid) add_note(e.input.stage, "n/a: " + e.reason);
    for (const std::string& note : e.notes) add_note(e.input.stage, note);
  }
  if (!notes.empty()) std::cout << "\n";
  for (const auto& [stages, note] : notes) std::cout << "note (" << stages << "): " << note << "\n";
}

/// One estimate as JSON: bytes per category and tier, the totals the table prints, and the
/// largest model that fits in `fit_memory` when given.
nlohmann::json estimate_json(const MemoryEstimate& e,
                             const std::optional<std::int64_t>& fit_memory) {
  nlohmann::json out = {{"stage", e.input.stage}, {"valid", e.valid}};
  if (!e.valid) {
    out["reason"] = e.reason;
    return out;
  }
  for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kHost, MemoryTier::kNvme}) {
    nlohmann::json& bytes = out[zeroshard::to_string(tier)];
    for (int c = 0; c < zeroshard::kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      bytes[zeroshard::to_string(category)] = e.at(category, tier);
    }
    bytes["model_states"] = e.model_state_bytes(tier);
    bytes["total"] = e.total(tier);
  }
  out[zeroshard::to_string(MemoryTier::kDevice)]["transient"] = e.transient_device_bytes;
  out[zeroshard::to_string(MemoryTier::kDevice)]["peak"] = e.device_peak();
  out[zeroshard::to_string(MemoryTier::kHost)]["per_node"] = e.host_per_node();
  out["padded_params"] = e.padded_params;
  out["shard_params"] = e.shard_params;
  out["traffic_bytes_per_step"] = e.traffic_bytes_per_step;
  out["notes"] = e.notes;
  if (fit_memory) out["largest_model_params"] = zeroshard::largest_model(*fit_memory, e.input);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, "zeroshard-estimate");
  add_flags(app, options);
  if (const auto exit_code = zeroshard::cli::parse(app, argc, argv)) return *exit_code;
  try {
    std::vector<std::string> notices;
    const EstimateInput base = make_input(options, notices);
    for (const std::string& notice : notices) std::cerr << "notice: " << notice << "\n";
    // Every stage unless one was asked for (on the command line, or by the config file alone).
    const bool one_stage = options.stage || (!options.config_path.empty() && !options.stage_given);
    std::vector<MemoryEstimate> estimates;
    for (int stage = 0; stage <= 3; ++stage) {
      if (one_stage && stage != base.stage) continue;
      EstimateInput in = base;
      in.stage = stage;
      estimates.push_back(zeroshard::estimate(in));
    }
    if (options.json) {
      nlohmann::json out = nlohmann::json::array();
      for (const MemoryEstimate& e : estimates) out.push_back(estimate_json(e, options.fit_memory));
      std::cout << out.dump(2) << "\n";
      return 0;
    }
    print_estimates(estimates, options.fit_memory);
    return 0;
  } catch (const zeroshard::Error& error) {
    std::cerr << "zeroshard-estimate: " << error.what() << "\n";
    return 2;
  }
}
