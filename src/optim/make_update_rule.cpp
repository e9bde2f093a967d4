// Builds the update rule a config's `optimizer` section names, with DeepSpeed's type names,
// parameter names and per-type defaults.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>

#include "util/text.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"
#include "zeroshard/optimizer.h"

namespace zeroshard {
namespace {

std::string key_path(std::string_view param) { return "optimizer.params." + std::string(param); }

/// Reads `optimizer.params` for one optimizer type, after checking that every given key is one
/// that type accepts.
class OptimizerParams {
 public:
  OptimizerParams(const OptimizerConfig& config, std::string_view type_name,
                  std::initializer_list<std::string_view> allowed)
      : config_(config) {
    auto reject_unknown = [&](const std::string& key) {
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) return;
      std::string list;
      for (std::string_view name : allowed) list += (list.empty() ? "" : ", ") + std::string(name);
      throw ConfigError(key_path(key), "unknown parameter for optimizer type '" +
                                           std::string(type_name) + "'; allowed: " + list);
    };
    for (const auto& [key, value] : config.params) reject_unknown(key);
    for (const auto& [key, values] : config.array_params) reject_unknown(key);
  }

  double number(std::string_view key, double fallback) const {
    if (config_.array_params.contains(std::string(key))) {
      throw ConfigError(key_path(key), "expected a number, got an array");
    }
    const auto it = config_.params.find(std::string(key));
    return it == config_.params.end() ? fallback : it->second;
  }

  bool flag(std::string_view key, bool fallback) const {
    const double value = number(key, fallback ? 1.0 : 0.0);
    if (value != 0.0 && value != 1.0) {
      throw ConfigError(key_path(key),
                        "expected true or false, got " + detail::format_number(value));
    }
    return value == 1.0;
  }

  /// `betas`: exactly two numbers.
  void betas(double& beta1, double& beta2) const {
    if (config_.params.contains("betas")) {
      throw ConfigError(key_path("betas"), "expected an array of two numbers, got a number");
    }
    const auto it = config_.array_params.find("betas");
    if (it == config_.array_params.end()) return;
    if (it->second.size() != 2) {
      throw ConfigError(key_path("betas"), "expected an array of two numbers, got " +
                                               std::to_string(it->second.size()));
    }
    beta1 = it->second[0];
    beta2 = it->second[1];
  }

 private:
  const OptimizerConfig& config_;
};

/// DeepSpeed's `adam` and `adamw` (FusedAdam, or torch.optim's when torch_adam is set).
std::unique_ptr<UpdateRule> make_adam_family(const OptimizerConfig& config,
                                             const std::string& type) {
  const OptimizerParams params(config, type,
                               {"lr", "betas", "eps", "weight_decay", "amsgrad", "adam_w_mode",
                                "torch_adam", "bias_correction"});
  if (!params.flag("bias_correction", true)) {
    throw ConfigError(key_path("bias_correction"),
                      "false is not implemented; zeroshard's Adam always corrects the bias");
  }
  const bool torch_adam = params.flag("torch_adam", false);
  const bool adam_w_mode = params.flag("adam_w_mode", true);
  // DeepSpeed: the name adamw forces decoupled decay whatever adam_w_mode says.
  const bool decoupled = type == "adamw" || adam_w_mode;
  // FusedAdam and DeepSpeedCPUAdam default weight_decay to 0; only torch.optim.AdamW, picked with
  // torch_adam, defaults to 0.01.
  const double default_weight_decay = torch_adam && decoupled ? AdamWOptions{}.weight_decay : 0.0;
  AdamWOptions options;
  params.betas(options.beta1, options.beta2);
  options.lr = params.number("lr", options.lr);
  options.eps = params.number("eps", options.eps);
  options.weight_decay = params.number("weight_decay", default_weight_decay);
  options.amsgrad = params.flag("amsgrad", options.amsgrad);
  if (decoupled) return make_adamw(options);
  return make_adam({.lr = options.lr,
                    .beta1 = options.beta1,
                    .beta2 = options.beta2,
                    .eps = options.eps,
                    .weight_decay = options.weight_decay,
                    .amsgrad = options.amsgrad});
}

std::unique_ptr<UpdateRule> make_sgd_from(const OptimizerConfig& config) {
  const OptimizerParams params(config, "sgd",
                               {"lr", "momentum", "dampening", "weight_decay", "nesterov"});
  SgdOptions options;
  options.lr = params.number("lr", options.lr);
  options.momentum = params.number("momentum", options.momentum);
  options.dampening = params.number("dampening", options.dampening);
  options.weight_decay = params.number("weight_decay", options.weight_decay);
  options.nesterov = params.flag("nesterov", options.nesterov);
  return make_sgd(options);
}

/// DeepSpeed's `lion` is FusedLion (or DeepSpeedCPULion), whose defaults are lr 1e-3 and betas
/// (0.9, 0.999), not lion-pytorch's that LionOptions carries.
std::unique_ptr<UpdateRule> make_lion_from(const OptimizerConfig& config) {
  const OptimizerParams params(config, "lion", {"lr", "betas", "weight_decay"});
  LionOptions options{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .weight_decay = 0.0};
  params.betas(options.beta1, options.beta2);
  options.lr = params.number("lr", options.lr);
  options.weight_decay = params.number("weight_decay", options.weight_decay);
  return make_lion(options);
}

std::unique_ptr<UpdateRule> make_adagrad_from(const OptimizerConfig& config) {
  const OptimizerParams params(
      config, "adagrad", {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"});
  AdagradOptions options;
  options.lr = params.number("lr", options.lr);
  options.lr_decay = params.number("lr_decay", options.lr_decay);
  options.weight_decay = params.number("weight_decay", options.weight_decay);
  options.initial_accumulator_value =
      params.number("initial_accumulator_value", options.initial_accumulator_value);
  options.eps = params.number("eps", options.eps);
  return make_adagrad(options);
}

}  // namespace

std::unique_ptr<UpdateRule> make_update_rule(const Config& config) {
  const OptimizerConfig& optimizer = config.optimizer;
  if (optimizer.type.empty()) {
    throw ConfigError("optimizer",
                      "the config has no optimizer section; pass an update rule in code "
                      "(make_adamw(...) or your own UpdateRule) or add "
                      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {...}}");
  }
  const std::string type = detail::ascii_lower(optimizer.type);
  if (type == "adam" || type == "adamw") return make_adam_family(optimizer, type);
  if (type == "sgd") return make_sgd_from(optimizer);
  if (type == "lion") return make_lion_from(optimizer);
  if (type == "adagrad") return make_adagrad_from(optimizer);
  throw ConfigError("optimizer.type", "got '" + optimizer.type +
                                          "', expected one of adam, adamw, sgd, lion, adagrad "
                                          "(case-insensitive); for another optimizer pass your own "
                                          "UpdateRule in code");
}

}  // namespace zeroshard
