// Tests of the DeepSpeed-compatible config: defaults, aliases, "auto", the batch-size identity,
// every kind of bad input, the resolved dump, the zeroshard-config tool and the example configs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config_checks.h"  // check_config
#include "config/config_schema.h"
#include "config/key_suggestion.h"
#include "zeroshard/config.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

/// The ConfigError that parsing `text` raises; a test failure when it raises none.
ConfigError config_error(const std::string& text, int world_size = 1) {
  try {
    Config::from_json_string(text, world_size);
  } catch (const ConfigError& error) {
    return error;
  }
  ADD_FAILURE() << "no ConfigError for " << text;
  return ConfigError("", "");
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// --- defaults, "auto", numbers, aliases -----------------------------------------------------

TEST(Config, DefaultsEqualDeepSpeeds) {
  Config config = Config::from_json_string(R"({"train_micro_batch_size_per_gpu": 1})");
  const ZeroConfig& zero = config.zero_optimization;
  EXPECT_EQ(zero.stage, 0);
  EXPECT_TRUE(zero.contiguous_gradients);
  EXPECT_FALSE(zero.reduce_scatter) << "DeepSpeed's stage 0 all-reduces";
  EXPECT_EQ(zero.reduce_bucket_size, 500000000);
  EXPECT_TRUE(zero.allgather_partitions);
  EXPECT_EQ(zero.allgather_bucket_size, 500000000);
  EXPECT_FALSE(zero.overlap_comm);
  EXPECT_TRUE(zero.load_from_fp32_weights);
  EXPECT_EQ(zero.sub_group_size, 1000000000);
  EXPECT_EQ(zero.prefetch_bucket_size, 50000000);
  EXPECT_EQ(zero.param_persistence_threshold, 100000);
  EXPECT_EQ(zero.model_persistence_threshold, INT64_MAX);
  EXPECT_EQ(zero.max_live_parameters, 1000000000);
  EXPECT_EQ(zero.max_reuse_distance, 1000000000);
  EXPECT_FALSE(zero.gather_16bit_weights_on_model_save);
  EXPECT_TRUE(zero.ignore_unused_parameters);
  EXPECT_FALSE(zero.round_robin_gradients);
  EXPECT_EQ(zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(zero.offload_optimizer.buffer_count, 4);
  EXPECT_TRUE(zero.offload_optimizer.pin_memory);
  EXPECT_EQ(zero.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(zero.offload_param.buffer_count, 5);
  EXPECT_EQ(zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_TRUE(zero.offload_param.pin_memory);

  EXPECT_FALSE(config.fp16.enabled);
  EXPECT_EQ(config.fp16.loss_scale, 0.0);
  EXPECT_EQ(config.fp16.initial_scale_power, 16);
  EXPECT_EQ(config.fp16.loss_scale_window, 1000);
  EXPECT_EQ(config.fp16.hysteresis, 2);
  EXPECT_FALSE(config.fp16.consecutive_hysteresis);
  EXPECT_EQ(config.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(config.bf16.enabled);
  EXPECT_TRUE(config.bf16.check_grad_overflow);

  EXPECT_EQ(config.gradient_clipping, 1.0);
  EXPECT_EQ(config.steps_per_print, 0);
  EXPECT_FALSE(config.wall_clock_breakdown);
  EXPECT_FALSE(config.memory_breakdown);
  EXPECT_FALSE(config.prescale_gradients);
  EXPECT_EQ(config.gradient_predivide_factor, 1.0);
  EXPECT_EQ(config.communication_data_type, "");
  EXPECT_EQ(config.grad_accum_dtype, "");
  EXPECT_TRUE(config.optimizer.type.empty());
  EXPECT_TRUE(config.scheduler.type.empty());
  EXPECT_FALSE(config.activation_checkpointing.number_checkpoints.has_value());

  EXPECT_EQ(config.aio.block_size, 1048576);
  EXPECT_EQ(config.aio.queue_depth, 8);
  EXPECT_EQ(config.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(config.aio.single_submit);
  EXPECT_TRUE(config.aio.overlap_events);
  EXPECT_FALSE(config.aio.use_gds);
  EXPECT_TRUE(config.notices().empty());
}

TEST(Config, ResolvedDumpShowsEveryTableDefault) {
  Config config = Config::from_json_string(R"({"train_micro_batch_size_per_gpu": 1})");
  auto dump = nlohmann::json::parse(config.resolved_json());
  for (const detail::KeySpec& spec : detail::key_specs()) {
    if (spec.status == detail::KeyStatus::kAlias ||
        spec.status == detail::KeyStatus::kDeprecatedAlias ||
        spec.status == detail::KeyStatus::kNoEffect || spec.status == detail::KeyStatus::kRemoved ||
        spec.kind == detail::ValueKind::kSection || spec.path.starts_with("optimizer") ||
        spec.path.starts_with("scheduler") || spec.path.starts_with("train_") ||
        spec.path.starts_with("gradient_accumulation") ||
        spec.path == "zero_optimization.overlap_comm" ||
        spec.path == "zero_optimization.reduce_scatter") {
      continue;  // derived from the stage when absent
    }
    std::string pointer = "/" + spec.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    ASSERT_TRUE(dump.contains(nlohmann::json::json_pointer(pointer))) << spec.path;
    EXPECT_EQ(dump[nlohmann::json::json_pointer(pointer)], nlohmann::json::parse(spec.default_json))
        << spec.path;
  }
}

TEST(Config, AcceptsScientificNotationForIntegerKeys) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8,
                          "stage3_max_live_parameters": 1e9}})");
  EXPECT_EQ(config.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(config.zero_optimization.allgather_bucket_size, 200000000);
  EXPECT_EQ(config.zero_optimization.max_live_parameters, 1000000000);
}

TEST(Config, StepsPerPrintZeroOrNullMeansNever) {
  for (const char* value : {"0", "null"}) {
    Config config = Config::from_json_string(R"({"train_batch_size": 8, "steps_per_print": )" +
                                             std::string(value) + "}");
    EXPECT_EQ(config.steps_per_print, 0) << value;
    EXPECT_TRUE(nlohmann::json::parse(config.resolved_json())["steps_per_print"].is_null());
  }
  ConfigError error = config_error(R"({"train_batch_size": 8, "steps_per_print": -1})");
  EXPECT_EQ(error.key_path(), "steps_per_print");
  EXPECT_THAT(error.what(), HasSubstr("got -1, expected >= 0"));
}

TEST(Config, MapsDeprecatedAliasesAndSaysSo) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "bfloat16": {"enabled": true},
    "zero_optimization": {"stage": 3, "cpu_offload_use_pin_memory": false}})");
  const ZeroConfig& zero = config.zero_optimization;
  EXPECT_TRUE(config.bf16.enabled);
  EXPECT_FALSE(zero.offload_optimizer.pin_memory);
  EXPECT_FALSE(zero.offload_param.pin_memory);
  ASSERT_EQ(config.notices().size(), 2u);
  for (const std::string& notice : config.notices()) EXPECT_THAT(notice, HasSubstr("deprecated"));
  EXPECT_THAT(config.notices()[0], StartsWith("bfloat16: deprecated; read as bf16"));
}

TEST(Config, DeprecatedOffloadSwitchesTurnOnCpuOffload) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true}})");
  EXPECT_EQ(config.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(config.zero_optimization.offload_param.device, OffloadDevice::kCpu);
}

TEST(Config, DeprecatedSwitchesReachTheKeysTheyStandFor) {
  // Both old spellings set stage3_gather_16bit_weights_on_model_save.
  for (const char* key :
       {"stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"}) {
    const Config config = Config::from_json_string(
        std::string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, ")") + key +
        R"(": true}})");
    EXPECT_TRUE(config.zero_optimization.gather_16bit_weights_on_model_save) << key;
  }
}

TEST(Config, CpuOffloadFalseLeavesOffloadOff) {
  Config config = Config::from_json_string(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": false}})");
  EXPECT_EQ(config.zero_optimization.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(config.notices().size(), 1u);
}

TEST(Config, AcceptsTheShortNamesOfStage3Keys) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3, "prefetch_bucket_size": 123,
                          "param_persistence_threshold": 7, "model_persistence_threshold": 9,
                          "max_live_parameters": 11, "max_reuse_distance": 13}})");
  const ZeroConfig& zero = config.zero_optimization;
  EXPECT_EQ(zero.prefetch_bucket_size, 123);
  EXPECT_EQ(zero.param_persistence_threshold, 7);
  EXPECT_EQ(zero.model_persistence_threshold, 9);
  EXPECT_EQ(zero.max_live_parameters, 11);
  EXPECT_EQ(zero.max_reuse_distance, 13);
  EXPECT_TRUE(config.notices().empty());
}

TEST(Config, DerivesOverlapCommAndReduceScatterFromTheStage) {
  // zero_optimization with `keys` (a JSON fragment) at `stage`.
  const auto zero = [](int stage, const std::string& keys = "") {
    return Config::from_json_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                                    std::to_string(stage) + keys + "}}")
        .zero_optimization;
  };
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_EQ(zero(stage).overlap_comm, stage == 3) << "stage " << stage;
    EXPECT_EQ(zero(stage).reduce_scatter, stage != 0) << "stage " << stage;
  }
  EXPECT_FALSE(zero(3, R"(, "overlap_comm": false)").overlap_comm);
  EXPECT_TRUE(zero(1, R"(, "overlap_comm": true)").overlap_comm);
  EXPECT_TRUE(zero(0, R"(, "reduce_scatter": true)").reduce_scatter);
  EXPECT_FALSE(zero(2, R"(, "reduce_scatter": false)").reduce_scatter);
}

TEST(Config, ReadsOptimizerAndSchedulerSections) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                                              "amsgrad": true, "adam_w_mode": false}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100,
                                                 "warmup_type": "linear"}}})");
  EXPECT_EQ(config.optimizer.type, "adamw");
  EXPECT_EQ(config.optimizer.params.at("lr"), 1e-3);
  EXPECT_EQ(config.optimizer.params.at("amsgrad"), 1.0);
  EXPECT_EQ(config.optimizer.params.at("adam_w_mode"), 0.0);
  EXPECT_EQ(config.optimizer.array_params.at("betas"), (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(config.scheduler.type, "WarmupLR");
  EXPECT_EQ(config.scheduler.params.at("warmup_num_steps"), 100.0);
  EXPECT_EQ(config.scheduler.string_params.at("warmup_type"), "linear");
}

TEST(Config, AcceptsPythonSideIntegrationsWithANotice) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "wandb": {"enabled": true, "project": "p"}, "flops_profiler": {"enabled": true}})");
  ASSERT_EQ(config.notices().size(), 2u);
  EXPECT_EQ(config.notices()[0],
            "wandb: accepted, has no effect in zeroshard (a Python-side integration)");
}

TEST(Config, ReadsTheMonitorsAndTheCommsLoggerWithoutANotice) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "tensorboard": {"enabled": true, "output_path": "runs", "job_name": "gpt"},
    "csv_monitor": {"enabled": true}, "comms_logger": {"enabled": true, "verbose": true,
    "prof_all": false, "prof_ops": ["all_gather", "reduce_scatter"], "debug": true}})");
  EXPECT_TRUE(config.notices().empty());
  EXPECT_TRUE(config.tensorboard.enabled);
  EXPECT_EQ(config.tensorboard.output_path, "runs");
  EXPECT_EQ(config.tensorboard.job_name, "gpt");
  EXPECT_TRUE(config.csv_monitor.enabled);
  EXPECT_EQ(config.csv_monitor.output_path, "");
  EXPECT_EQ(config.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_TRUE(config.comms_logger.enabled && config.comms_logger.verbose &&
              config.comms_logger.debug);
  EXPECT_FALSE(config.comms_logger.prof_all);
  EXPECT_EQ(config.comms_logger.prof_ops,
            (std::vector<std::string>{"all_gather", "reduce_scatter"}));
  // The dump reads back as the same settings.
  const Config again = Config::from_json_string(config.resolved_json());
  EXPECT_EQ(again.comms_logger.prof_ops, config.comms_logger.prof_ops);
  EXPECT_EQ(again.tensorboard.job_name, "gpt");
  EXPECT_EQ(again.csv_monitor.output_path, "");
}

TEST(Config, RefusesMonitorKeysItDoesNotKnowAndOpsItCannotTime) {
  EXPECT_EQ(config_error(R"({"train_batch_size": 8, "csv_monitor": {"enable": true}})").key_path(),
            "csv_monitor.enable");
  const ConfigError error =
      config_error(R"({"train_batch_size": 8, "comms_logger": {"prof_ops": ["all_gater"]}})");
  EXPECT_EQ(error.key_path(), "comms_logger.prof_ops[0]");
  EXPECT_THAT(error.what(), HasSubstr("did you mean 'all_gather'?"));
  EXPECT_EQ(config_error(R"({"train_batch_size": 8, "comms_logger": {"prof_ops": "all_gather"}})")
                .key_path(),
            "comms_logger.prof_ops");
}

TEST(Config, AcceptsRefusedKeysAtTheirDefaults) {
  Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "gradient_allreduce_op": "MEAN", "torch_autocast": {"enabled": false, "dtype": "bfloat16"},
    "data_types": {"param_dtype": null},
    "zero_optimization": {"zero_hpz_partition_size": 1, "zero_quantized_weights": false,
    "zero_quantized_gradients": false, "compute_grad_norm": true, "parameter_alignment": false,
    "enable_sanity_checks": false, "save_muon_momentum_buffer_in_memory": false},
    "activation_checkpointing": {"partition_activations": false, "number_checkpoints": null},
    "checkpoint": {"tag_validation": "WARN"}})");
  EXPECT_EQ(config.zero_optimization.stage, 0);
}

TEST(Config, ResolvedJsonRoundTrips) {
  const std::string text = R"({"train_batch_size": 64, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5, "steps_per_print": 5, "communication_data_type": "FP32",
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e7,
                          "prefetch_bucket_size": 1000},
    "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.9, 0.99],
                                             "adam_w_mode": false}},
    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3,
                                                 "cycle_first_step_size": 10,
                                                 "cycle_momentum": false}},
    "aio": {"block_size": 262144}, "wandb": {"enabled": true}})";
  Config first = Config::from_json_string(text, 4);
  Config second = Config::from_json_string(first.resolved_json(), 4);
  EXPECT_EQ(second.resolved_json(), first.resolved_json());
  EXPECT_EQ(second.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(second.steps_per_print, 5);
  EXPECT_EQ(second.communication_data_type, "fp32");
  EXPECT_EQ(second.zero_optimization.prefetch_bucket_size, 1000);
  EXPECT_TRUE(second.zero_optimization.overlap_comm);
  EXPECT_EQ(second.optimizer.array_params, first.optimizer.array_params);
  EXPECT_EQ(second.optimizer.params, first.optimizer.params);
  EXPECT_EQ(second.scheduler.params, first.scheduler.params);
  EXPECT_TRUE(second.notices().empty());
}

TEST(Config, ResolvedJsonOfEveryIntegerKeyAtItsLargestParsesAgain) {
  for (const detail::KeySpec& spec : detail::key_specs()) {
    if (spec.kind != detail::ValueKind::kInteger ||
        std::holds_alternative<std::monostate>(spec.field)) {
      continue;
    }
    const bool narrow = std::holds_alternative<int& (*)(Config&)>(spec.field);
    const nlohmann::json largest = std::isfinite(spec.range.max)
                                       ? nlohmann::json(static_cast<std::int64_t>(spec.range.max))
                                   : narrow ? nlohmann::json(INT_MAX)
                                            : nlohmann::json(INT64_MAX);
    nlohmann::json document = {{"train_micro_batch_size_per_gpu", 1}};
    std::string pointer = "/" + spec.path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    document[nlohmann::json::json_pointer(pointer)] = largest;
    std::optional<Config> first;
    try {
      first = Config::from_json_string(document.dump());
    } catch (const ConfigError&) {
      continue;  // refused with a message (another key's rule, or the field's range)
    }
    try {
      const Config second = Config::from_json_string(first->resolved_json());
      EXPECT_EQ(second.resolved_json(), first->resolved_json()) << spec.path;
    } catch (const ConfigError& error) {
      ADD_FAILURE() << spec.path << " = " << largest
                    << ": the dump does not parse again: " << error.what();
    }
  }
}

TEST(Config, MinLossScaleIsRefusedWhereItsDoubleWouldRoundIt) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "fp16": {"min_loss_scale": 9223372036854775807}})");
  EXPECT_EQ(error.key_path(), "fp16.min_loss_scale");
  EXPECT_THAT(error.what(), HasSubstr("got 9223372036854775807, expected an integer up to 2^53"));
  const Config largest = Config::from_json_string(
      R"({"train_batch_size": 8, "fp16": {"min_loss_scale": 9007199254740992}})");
  EXPECT_EQ(largest.fp16.min_loss_scale, 9007199254740992.0);
  EXPECT_EQ(Config::from_json_string(largest.resolved_json()).resolved_json(),
            largest.resolved_json());
}

// --- bad input ------------------------------------------------------------------------------

TEST(ConfigValidation, UnknownKeySuggestsTheClosestKnownKey) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_sise": 5}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.reduce_bucket_sise");
  EXPECT_THAT(error.what(), HasSubstr("unknown key"));
  EXPECT_THAT(error.what(), HasSubstr("did you mean 'reduce_bucket_size'?"));
}

TEST(ConfigValidation, UnknownKeyWithoutACloseMatchListsTheKnownKeys) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "aio": {"xyz": 1}})");
  EXPECT_EQ(error.key_path(), "aio.xyz");
  EXPECT_THAT(error.what(), HasSubstr("expected one of: block_size, queue_depth"));
}

TEST(ConfigValidation, KeyAtTheWrongLevelNamesWhereItBelongs) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "offload_optimizer": {}})");
  EXPECT_EQ(error.key_path(), "offload_optimizer");
  EXPECT_THAT(error.what(), HasSubstr("'zero_optimization.offload_optimizer'"));
}

TEST(ConfigValidation, OffloadOptimizerHasNoBufferSize) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"buffer_size": 4}}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.offload_optimizer.buffer_size");
}

TEST(ConfigValidation, WrongJsonTypeSaysWhatWasFound) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"stage": "three"}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.stage");
  EXPECT_THAT(error.what(), HasSubstr("got string \"three\", expected an integer"));
}

TEST(ConfigValidation, BooleanIsNotANumber) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "gradient_clipping": true})");
  EXPECT_EQ(error.key_path(), "gradient_clipping");
  EXPECT_THAT(error.what(), HasSubstr("got true, expected a number"));
}

TEST(ConfigValidation, FractionForAnIntegerKey) {
  ConfigError error = config_error(
      R"({"train_batch_size": 8, "zero_optimization": {"allgather_bucket_size": 1.5}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.allgather_bucket_size");
  EXPECT_THAT(error.what(), HasSubstr("got 1.5, expected an integer"));
}

TEST(ConfigValidation, StageOutsideZeroToThree) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.stage");
  EXPECT_THAT(error.what(), HasSubstr("got 4, expected 0..3"));
}

TEST(ConfigValidation, NegativeBucketSize) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": -5}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.reduce_bucket_size");
  EXPECT_THAT(error.what(), HasSubstr("got -5, expected > 0"));
}

TEST(ConfigValidation, ZeroReduceBucketSize) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 0}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.reduce_bucket_size");
  EXPECT_THAT(error.what(), HasSubstr("got 0, expected > 0"));
}

TEST(ConfigValidation, OffloadDeviceOutsideNoneCpuNvme) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.offload_optimizer.device");
  EXPECT_THAT(error.what(), HasSubstr("got \"gpu\", expected one of none, cpu, nvme"));
}

TEST(ConfigValidation, NvmeWithoutNvmePath) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.offload_optimizer.nvme_path");
  EXPECT_THAT(error.what(), HasSubstr("missing; required when device is \"nvme\""));
}

TEST(ConfigValidation, OptimizerStatesGoToNvmeParametersNotYet) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/local_nvme", "buffer_count": 3, "pipeline_read": true, "fast_init": true}}})");
  const OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  EXPECT_EQ(offload.device, OffloadDevice::kNvme);
  EXPECT_EQ(offload.nvme_path, "/local_nvme");
  EXPECT_EQ(offload.buffer_count, 3);
  EXPECT_TRUE(offload.pipeline_read);
  EXPECT_FALSE(offload.pipeline_write);
  EXPECT_TRUE(offload.fast_init);
  // Parameters on NVMe: with the optimizer on NVMe too, and not without it.
  const Config infinity = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 3,
        "buffer_size": 1000, "max_in_cpu": 10}}})");
  const OffloadConfig& params = infinity.zero_optimization.offload_param;
  EXPECT_EQ(params.device, OffloadDevice::kNvme);
  EXPECT_EQ(params.buffer_count, 3);
  EXPECT_EQ(params.buffer_size, 1000);
  EXPECT_EQ(params.max_in_cpu, 10);
  ConfigError error = config_error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu"},
    "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.offload_param.device");
  EXPECT_THAT(error.what(), HasSubstr("need the optimizer states on NVMe too"));
}

TEST(ConfigValidation, OffloadParamNeedsStage3) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.offload_param.device");
  EXPECT_THAT(error.what(), HasSubstr("needs stage 3"));
}

TEST(ConfigValidation, OffloadOptimizerNeedsAZeroStage) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.offload_optimizer.device");
  EXPECT_THAT(error.what(), HasSubstr("needs stage 1, 2 or 3"));
}

TEST(ConfigValidation, CpuOffloadAtStage3IsAccepted) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "pin_memory": false},
      "offload_param": {"device": "cpu", "max_in_cpu": 5000}}})");
  EXPECT_EQ(config.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_FALSE(config.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_EQ(config.zero_optimization.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(config.zero_optimization.offload_param.max_in_cpu, 5000);
}

TEST(ConfigValidation, NvmeOnlyKeysWithDeviceCpuAreRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("offload_optimizer": {"device": "cpu", "buffer_count": 8})",
       "zero_optimization.offload_optimizer.buffer_count"},
      {R"("offload_optimizer": {"device": "cpu", "pipeline_read": true})",
       "zero_optimization.offload_optimizer.pipeline_read"},
      {R"("offload_optimizer": {"device": "cpu", "pipeline_write": true})",
       "zero_optimization.offload_optimizer.pipeline_write"},
      {R"("offload_optimizer": {"device": "cpu", "fast_init": true})",
       "zero_optimization.offload_optimizer.fast_init"},
      {R"("offload_optimizer": {"device": "cpu", "nvme_path": "/nvme"})",
       "zero_optimization.offload_optimizer.nvme_path"},
      {R"("offload_param": {"device": "cpu", "buffer_count": 4})",
       "zero_optimization.offload_param.buffer_count"},
      {R"("offload_param": {"device": "cpu", "buffer_size": 1000})",
       "zero_optimization.offload_param.buffer_size"},
  };
  for (const auto& [offload, key] : cases) {
    ConfigError error =
        config_error(std::string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, )") +
                     offload + "}}");
    EXPECT_EQ(error.key_path(), key) << offload;
    EXPECT_THAT(error.what(), HasSubstr("applies to device \"nvme\" only")) << offload;
  }
  // At their defaults they are fine: configs that spell every key out still load.
  EXPECT_NO_THROW(Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "buffer_count": 4, "pipeline_read": false},
      "offload_param": {"device": "cpu", "buffer_count": 5, "buffer_size": 100000000}}})"));
}

TEST(ConfigValidation, PartialOffloadIsTakenAtStagesOneToThreeWithCpuOnly) {
  for (int stage : {1, 2, 3}) {
    const Config config = Config::from_json_string(
        R"({"train_batch_size": 8, "zero_optimization": {"stage": )" + std::to_string(stage) +
        R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.25}}})");
    EXPECT_EQ(config.zero_optimization.offload_optimizer.ratio, 0.25) << stage;
  }
  const ConfigError nvme = config_error(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "ratio": 0.5}}})");
  EXPECT_EQ(nvme.key_path(), "zero_optimization.offload_optimizer.ratio");
  EXPECT_THAT(nvme.what(), HasSubstr("got 0.5 with device \"nvme\""));
  const ConfigError none = config_error(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0}}})");
  EXPECT_EQ(none.key_path(), "zero_optimization.offload_optimizer.ratio");
  EXPECT_THAT(none.what(), HasSubstr("expected the share of the optimizer offloaded, in (0, 1]"));
}

TEST(ConfigValidation, Fp16AndBf16Together) {
  ConfigError error = config_error(
      R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_EQ(error.key_path(), "bf16.enabled");
  EXPECT_THAT(error.what(), HasSubstr("fp16.enabled and bf16.enabled are both true"));
}

TEST(ConfigValidation, NegativeLossScale) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "fp16": {"loss_scale": -1}})");
  EXPECT_EQ(error.key_path(), "fp16.loss_scale");
  EXPECT_THAT(error.what(), HasSubstr("got -1, expected >= 0"));
}

TEST(ConfigValidation, LossScaleThatOverflowsToInfinity) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "fp16": {"loss_scale": 1e999}})");
  EXPECT_EQ(error.key_path(), "fp16.loss_scale");
  EXPECT_THAT(error.what(), HasSubstr("expected a finite number"));
}

TEST(ConfigValidation, MinLossScaleNotPositive) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "fp16": {"min_loss_scale": 0}})");
  EXPECT_EQ(error.key_path(), "fp16.min_loss_scale");
  EXPECT_THAT(error.what(), HasSubstr("got 0, expected > 0"));
}

TEST(ConfigValidation, IntegerTooLargeForItsField) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "fp16": {"hysteresis": 1e10}})");
  EXPECT_EQ(error.key_path(), "fp16.hysteresis");
  EXPECT_THAT(error.what(), HasSubstr("fits in 32 bits"));
}

// The engine holds these 64-bit keys in an int (a group size, a buffer count): a value past
// 2^31 - 1 is refused by name rather than narrowed (2^32 would become 0, 2^31 negative).
TEST(ConfigValidation, KeysTheEngineHoldsInAnIntAreRefusedPastItsRange) {
  struct Case {
    std::string key;
    std::string section;  // what the key needs beside it to be read
  } cases[] = {
      {"zero_optimization.zero_hpz_partition_size", R"("stage": 3)"},
      {"zero_optimization.offload_optimizer.buffer_count",
       R"("stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp")"},
      {"zero_optimization.offload_param.buffer_count",
       R"("stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp")"},
  };
  for (const Case& c : cases) {
    const std::string name = c.key.substr(c.key.rfind('.') + 1);
    const bool nested = c.section.back() != '3';
    for (const char* value : {"2147483648", "4294967296", "4294967298"}) {
      const std::string text = R"({"train_batch_size": 8, "zero_optimization": {)" + c.section +
                               ", \"" + name + "\": " + value + (nested ? "}}}" : "}}");
      ConfigError error = config_error(text);
      EXPECT_EQ(error.key_path(), c.key) << text;
      EXPECT_THAT(error.what(), HasSubstr(std::string("got ") + value)) << text;
      EXPECT_THAT(error.what(), HasSubstr("2147483647")) << text;
    }
  }
}

TEST(ConfigValidation, AConfigBuiltInCodeIsRangeCheckedAsAParsedOneIs) {
  Config config =
      Config::from_json_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})");
  config.zero_optimization.hpz_partition_size = std::int64_t{1} << 32;
  try {
    check_config(config);
    ADD_FAILURE() << "2^32 was accepted";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.zero_hpz_partition_size");
    EXPECT_THAT(error.what(), HasSubstr("got 4294967296"));
  }
  config.zero_optimization.hpz_partition_size = 0;
  EXPECT_THROW(check_config(config), ConfigError);
  config.zero_optimization.hpz_partition_size = 1;
  EXPECT_NO_THROW(check_config(config));
}

TEST(ConfigValidation, UnknownOptimizer) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "optimizer": {"type": "AdamX"}})");
  EXPECT_EQ(error.key_path(), "optimizer.type");
  EXPECT_THAT(error.what(), HasSubstr("expected one of adam, adamw, sgd, lion, adagrad"));
}

TEST(ConfigValidation, DeepSpeedOnlyOptimizerIsNotImplemented) {
  for (const char* name : {"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdamW"}) {
    ConfigError error = config_error(R"({"train_batch_size": 8, "optimizer": {"type": ")" +
                                     std::string(name) + "\"}}");
    EXPECT_EQ(error.key_path(), "optimizer.type");
    EXPECT_THAT(error.what(), HasSubstr("not implemented in zeroshard")) << name;
  }
}

TEST(ConfigValidation, OptimizerParamOfTheWrongType) {
  ConfigError error = config_error(
      R"({"train_batch_size": 8, "optimizer": {"type": "sgd", "params": {"lr": "0.1"}}})");
  EXPECT_EQ(error.key_path(), "optimizer.params.lr");
  EXPECT_THAT(error.what(), HasSubstr("expected a number, a boolean or an array of numbers"));
  ConfigError array_error = config_error(R"({"train_batch_size": 8,
    "optimizer": {"type": "adam", "params": {"betas": [0.9, "x"]}}})");
  EXPECT_EQ(array_error.key_path(), "optimizer.params.betas");
}

TEST(ConfigValidation, OptimizerParamsAreCheckedAsTheEngineChecksThem) {
  // One validation path: what the update rule refuses when the engine builds it, parsing refuses.
  const std::pair<const char*, const char*> cases[] = {
      {R"({"betas": [0.9, 0.99, 0.999]})", "expected an array of two numbers, got 3"},
      {R"({"eps": -1})", "Invalid epsilon value: -1"},
      {R"({"foo": 1})", "unknown parameter for optimizer type 'adamw'"},
  };
  for (const auto& [params, message] : cases) {
    auto document = nlohmann::json::parse(R"({"train_batch_size": 8,
      "optimizer": {"type": "AdamW"}})");
    document["optimizer"]["params"] = nlohmann::json::parse(params);
    ConfigError error = config_error(document.dump());
    EXPECT_EQ(error.key_path(), "optimizer.params." + nlohmann::json::parse(params).begin().key());
    EXPECT_THAT(error.what(), HasSubstr(message)) << params;
  }
}

TEST(ConfigValidation, SchedulerParamsAreCheckedAsTheEngineChecksThem) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": -1}}})");
  EXPECT_EQ(error.key_path(), "scheduler.params.warmup_min_lr");
  EXPECT_THAT(error.what(), HasSubstr("got -1, expected a number >= 0"));
}

TEST(ConfigValidation, GradientTypesAreCheckedAsTheEngineChecksThem) {
  ConfigError comm = config_error(R"({"train_batch_size": 8, "communication_data_type": "bf16",
    "fp16": {"enabled": true}})");
  EXPECT_EQ(comm.key_path(), "communication_data_type");
  ConfigError accum = config_error(R"({"train_batch_size": 8, "bf16": {"enabled": true},
    "data_types": {"grad_accum_dtype": "fp16"}, "zero_optimization": {"stage": 2}})");
  EXPECT_EQ(accum.key_path(), "data_types.grad_accum_dtype");
  // Megatron-DeepSpeed's default: bf16 at stage 1 accumulating in fp32 (BF16_Optimizer).
  const Config megatron = Config::from_json_string(R"({"train_batch_size": 8,
    "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"},
    "zero_optimization": {"stage": 1}})");
  EXPECT_EQ(megatron.grad_accum_dtype, "fp32");
  ConfigError narrowed = config_error(R"({"train_batch_size": 8, "bf16": {"enabled": true},
    "communication_data_type": "bf16", "data_types": {"grad_accum_dtype": "fp32"},
    "zero_optimization": {"stage": 1}})");
  EXPECT_EQ(narrowed.key_path(), "communication_data_type");
  EXPECT_THAT(narrowed.what(), HasSubstr("reduce the fp32 sums"));
}

TEST(ConfigValidation, AioSettingsTheSwapperCannotUseAreRefused) {
  ConfigError block = config_error(R"({"train_batch_size": 8, "aio": {"block_size": 1000}})");
  EXPECT_EQ(block.key_path(), "aio.block_size");
  EXPECT_THAT(block.what(), HasSubstr("got 1000, expected a multiple of 4096"));
  ConfigError depth = config_error(
      R"({"train_batch_size": 8, "aio": {"queue_depth": 4096, "intra_op_parallelism": 2}})");
  EXPECT_EQ(depth.key_path(), "aio.intra_op_parallelism");
  ConfigError huge = config_error(
      R"({"train_batch_size": 8, "aio": {"intra_op_parallelism": 9223372036854775807}})");
  EXPECT_EQ(huge.key_path(), "aio.intra_op_parallelism") << "8 x 2^63 must not wrap around";
  ConfigError gds = config_error(R"({"train_batch_size": 8, "aio": {"use_gds": true}})");
  EXPECT_EQ(gds.key_path(), "aio.use_gds");
  EXPECT_THAT(gds.what(), HasSubstr("not implemented in zeroshard"));
}

TEST(ConfigValidation, OptimizerParamsWithoutAType) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 0.1}}})");
  EXPECT_EQ(error.key_path(), "optimizer.type");
  EXPECT_THAT(error.what(), HasSubstr("missing"));
}

TEST(ConfigValidation, UnknownScheduler) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "scheduler": {"type": "CosineAnnealing"}})");
  EXPECT_EQ(error.key_path(), "scheduler.type");
  EXPECT_THAT(error.what(), HasSubstr("WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle"));
}

TEST(ConfigValidation, UnknownSchedulerParam) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lrr": 0.1}}})");
  EXPECT_EQ(error.key_path(), "scheduler.params.warmup_max_lrr");
  EXPECT_THAT(error.what(), HasSubstr("unknown param of WarmupLR"));
  EXPECT_THAT(error.what(), HasSubstr("did you mean 'warmup_max_lr'?"));
}

TEST(ConfigValidation, ParamOfAnotherScheduler) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})");
  EXPECT_EQ(error.key_path(), "scheduler.params.total_num_steps");
  EXPECT_THAT(error.what(), HasSubstr("WarmupLR takes warmup_min_lr, warmup_max_lr"));
}

TEST(ConfigValidation, MissingRequiredSchedulerParam) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.1}}})");
  EXPECT_EQ(error.key_path(), "scheduler.params.total_num_steps");
  EXPECT_THAT(error.what(), HasSubstr("required by WarmupDecayLR"));
}

TEST(ConfigValidation, BothSpellingsOfAStage3Key) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "zero_optimization": {
    "stage3_prefetch_bucket_size": 10, "prefetch_bucket_size": 20}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.prefetch_bucket_size");
  EXPECT_THAT(error.what(), HasSubstr("another spelling of the same key"));
}

TEST(ConfigValidation, DeprecatedAndNewNameTogether) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "zero_optimization": {"stage3_gather_fp16_weights_on_model_save": true,
                          "stage3_gather_16bit_weights_on_model_save": true}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.stage3_gather_fp16_weights_on_model_save");
  EXPECT_THAT(
      error.what(),
      HasSubstr("given together with "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save, its new name"));
}

TEST(ConfigValidation, ZeroPlusPlusKeysAreAcceptedAtStageThreeOnly) {
  struct StageThreeKey {
    const char* name;
    const char* value;
    std::function<bool(const ZeroConfig&)> taken;
    const char* needs;
  };
  const StageThreeKey keys[] = {
      {"zero_hpz_partition_size", "8",
       [](const ZeroConfig& zero) { return zero.hpz_partition_size == 8; }, "needs stage 3"},
      {"zero_quantized_gradients", "true",
       [](const ZeroConfig& zero) { return zero.quantized_gradients; }, "needs stage 3"},
      {"zero_quantized_weights", "true",
       [](const ZeroConfig& zero) { return zero.quantized_weights; }, "need stage 3"},
      {"zero_quantized_nontrainable_weights", "true",
       [](const ZeroConfig& zero) { return zero.quantized_nontrainable_weights; }, "needs stage 3"},
  };
  for (const StageThreeKey& key : keys) {
    const auto json = [&key](int stage) {
      return R"({"train_batch_size": 8, "zero_optimization": {"stage": )" + std::to_string(stage) +
             R"(, ")" + key.name + R"(": )" + key.value + "}}";
    };
    EXPECT_TRUE(key.taken(Config::from_json_string(json(3)).zero_optimization)) << key.name;
    for (int stage : {0, 1, 2}) {
      ConfigError error = config_error(json(stage));
      EXPECT_EQ(error.key_path(), std::string("zero_optimization.") + key.name) << stage;
      EXPECT_THAT(error.what(), HasSubstr(key.needs)) << key.name << ", stage " << stage;
    }
  }
  // Below stage 3, hpZ's 1 (off, the default) is accepted; 0 is refused at any stage.
  EXPECT_EQ(Config::from_json_string(R"({"train_batch_size": 8, "zero_optimization": )"
                                     R"({"stage": 2, "zero_hpz_partition_size": 1}})")
                .zero_optimization.hpz_partition_size,
            1);
  EXPECT_EQ(config_error(R"({"train_batch_size": 8, "zero_optimization": )"
                         R"({"stage": 3, "zero_hpz_partition_size": 0}})")
                .key_path(),
            "zero_optimization.zero_hpz_partition_size");
}

TEST(ConfigValidation, UnimplementedPrecisionFlagsAreRefused) {
  for (const char* text :
       {R"({"fp16": {"auto_cast": true}})", R"({"fp16": {"fp16_master_weights_and_grads": true}})",
        R"({"bf16": {"immediate_grad_update": true}})"}) {
    auto document = nlohmann::json::parse(text);
    document["train_batch_size"] = 8;
    ConfigError error = config_error(document.dump());
    EXPECT_THAT(error.what(), HasSubstr("not implemented in zeroshard")) << text;
  }
}

// --- whole-config rules: the same for a parsed Config and one built in code ----------------

/// The ConfigError that check_config() raises for `config`; a test failure when it raises none.
ConfigError check_error(const Config& config) {
  try {
    check_config(config);
  } catch (const ConfigError& error) {
    return error;
  }
  ADD_FAILURE() << "no ConfigError from check_config";
  return ConfigError("", "");
}

TEST(ConfigRules, HoldForAConfigBuiltInCodeAsForAParsedOne) {
  struct Rule {
    const char* json;  // the zero_optimization section, or other top-level keys
    std::function<void(Config&)> change;
    const char* key;
    const char* says;
  };
  using Device = OffloadDevice;
  const Rule rules[] = {
      {R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}})",
       [](Config& c) {
         c.zero_optimization.stage = 2;
         c.zero_optimization.offload_param.device = Device::kCpu;
       },
       "zero_optimization.offload_param.device", "parameter offload needs stage 3"},
      {R"("zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}})",
       [](Config& c) {
         c.zero_optimization.stage = 1;
         c.zero_optimization.offload_param.device = Device::kCpu;
       },
       "zero_optimization.offload_param.device", "parameter offload needs stage 3"},
      {R"("zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}})",
       [](Config& c) { c.zero_optimization.offload_optimizer.device = Device::kCpu; },
       "zero_optimization.offload_optimizer.device", "optimizer offload needs stage 1, 2 or 3"},
      {R"("fp16": {"enabled": true}, "bf16": {"enabled": true})",
       [](Config& c) {
         c.fp16.enabled = true;
         c.bf16.enabled = true;
       },
       "bf16.enabled", "fp16.enabled and bf16.enabled are both true; enable at most one"},
      {R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}})",
       [](Config& c) {
         c.zero_optimization.stage = 3;
         c.zero_optimization.offload_optimizer.device = Device::kNvme;
       },
       "zero_optimization.offload_optimizer.nvme_path", "missing; required when device is"},
      {R"("zero_optimization": {"stage": 3,
         "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
         "offload_param": {"device": "nvme"}})",
       [](Config& c) {
         c.zero_optimization.stage = 3;
         c.zero_optimization.offload_optimizer.device = Device::kNvme;
         c.zero_optimization.offload_optimizer.nvme_path = "/local_nvme";
         c.zero_optimization.offload_param.device = Device::kNvme;
       },
       "zero_optimization.offload_param.nvme_path", "missing; required when device is"},
      {R"("zero_optimization": {"stage": 3,
         "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "ratio": 0.5}})",
       [](Config& c) {
         c.zero_optimization.stage = 3;
         c.zero_optimization.offload_optimizer.device = Device::kNvme;
         c.zero_optimization.offload_optimizer.nvme_path = "/x";
         c.zero_optimization.offload_optimizer.ratio = 0.5;
       },
       "zero_optimization.offload_optimizer.ratio", "offloaded to CPU memory only"},
      {R"("activation_checkpointing": {"contiguous_memory_optimization": true})",
       [](Config& c) { c.activation_checkpointing.contiguous_memory_optimization = true; },
       "activation_checkpointing.number_checkpoints", "required by contiguous_memory_optimization"},
      {R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.1}})",
       [](Config& c) {
         c.scheduler.type = "WarmupDecayLR";
         c.scheduler.params["warmup_max_lr"] = 0.1;
       },
       "scheduler.params.total_num_steps", "missing; required by WarmupDecayLR"},
  };
  for (const Rule& rule : rules) {
    Config built;
    rule.change(built);
    const ConfigError in_code = check_error(built);
    EXPECT_EQ(in_code.key_path(), rule.key) << rule.json;
    EXPECT_THAT(in_code.what(), HasSubstr(rule.says)) << rule.json;
    const ConfigError parsed =
        config_error(std::string(R"({"train_batch_size": 8, )") + rule.json + "}");
    EXPECT_EQ(parsed.key_path(), in_code.key_path()) << rule.json;
    EXPECT_STREQ(parsed.what(), in_code.what()) << rule.json;
  }
  EXPECT_NO_THROW(check_config(Config{}));
}

TEST(ConfigValidation, AutoOffloadRatioIsKeptThroughTrainerResolutionAndTheDump) {
  const std::string text = R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto",
      "offload_optimizer": {"device": "cpu", "ratio": "auto", "auto_ratio_margin": 0.2}}})";
  ConfigOverrides overrides;
  overrides.per_device_train_batch_size = 4;
  const Config config = Config::from_json_string(text, 2, overrides);
  const OffloadConfig& offload = config.zero_optimization.offload_optimizer;
  EXPECT_FALSE(offload.ratio.has_value());
  EXPECT_EQ(offload.auto_ratio_margin, 0.2);
  // The other "auto" took DeepSpeed's default with a notice; the ratio's own "auto" none.
  bool dropped_max_live = false;
  for (const std::string& notice : config.notices()) {
    dropped_max_live =
        dropped_max_live || notice.find("stage3_max_live_parameters") != std::string::npos;
    EXPECT_THAT(notice, ::testing::Not(HasSubstr("offload_optimizer.ratio"))) << notice;
  }
  const Config again = Config::from_json_string(config.resolved_json(), 2);
  EXPECT_FALSE(again.zero_optimization.offload_optimizer.ratio.has_value());
  EXPECT_THAT(config.resolved_json(), HasSubstr(R"("ratio": "auto")"));

  const ConfigError nvme = config_error(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "ratio": "auto"}}})");
  EXPECT_EQ(nvme.key_path(), "zero_optimization.offload_optimizer.ratio");
  EXPECT_THAT(nvme.what(), HasSubstr("got \"auto\" with device \"nvme\""));
  const ConfigError spelled = config_error(R"({"train_batch_size": 8, "zero_optimization": {
      "stage": 3, "offload_optimizer": {"device": "cpu", "ratio": "automatic"}}})");
  EXPECT_THAT(spelled.what(), HasSubstr(R"(expected a number 0..1 or "auto")"));
  for (double margin : {1.0, -0.1, std::nan("")}) {
    Config in_code;
    in_code.zero_optimization.offload_optimizer.auto_ratio_margin = margin;
    EXPECT_EQ(check_error(in_code).key_path(),
              "zero_optimization.offload_optimizer.auto_ratio_margin")
        << margin;
  }
}

TEST(ConfigRules, AnOffloadRatioOutsideZeroToOneIsRefusedInCode) {
  // The parser holds the ratio to 0..1; in code the rule holds it to (0, 1].
  for (double ratio : {0.0, -0.5, 1.5, std::nan("")}) {
    Config config;
    config.zero_optimization.offload_optimizer.ratio = ratio;
    EXPECT_EQ(check_error(config).key_path(), "zero_optimization.offload_optimizer.ratio") << ratio;
  }
  Config half;
  half.zero_optimization.stage = 2;
  half.zero_optimization.offload_optimizer.device = OffloadDevice::kCpu;
  half.zero_optimization.offload_optimizer.ratio = 0.5;
  EXPECT_NO_THROW(check_config(half));
}

// --- parity with DeepSpeed 0.19.8's parser ---------------------------------------------------

TEST(DeepSpeedParity, NewerKeysAreRefusedByNameWhenTheyAskForSomethingElse) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"zero_optimization": {"compute_grad_norm": false}})",
       "zero_optimization.compute_grad_norm"},
      {R"({"zero_optimization": {"save_muon_momentum_buffer_in_memory": true}})",
       "zero_optimization.save_muon_momentum_buffer_in_memory"},
      {R"({"zero_optimization": {"enable_sanity_checks": true}})",
       "zero_optimization.enable_sanity_checks"},
      {R"({"data_types": {"param_dtype": "bf16"}})", "data_types.param_dtype"},
      {R"({"torch_autocast": {"enabled": true, "dtype": "bfloat16"}})", "torch_autocast.enabled"},
      {R"({"gradient_allreduce_op": "sum"})", "gradient_allreduce_op"},
  };
  for (const auto& [text, key_path] : cases) {
    auto document = nlohmann::json::parse(text);
    document["train_batch_size"] = 8;
    ConfigError error = config_error(document.dump());
    EXPECT_EQ(error.key_path(), key_path) << text;
    EXPECT_THAT(error.what(), HasSubstr("not implemented in zeroshard")) << text;
  }
}

TEST(DeepSpeedParity, ParameterAlignmentIsASwitchAsInDeepSpeed) {
  // DeepSpeed 0.19.8's parameter_alignment is a bool (pydantic: 0/1 and "on" count); every
  // tensor of zeroshard starts 32 bytes or more apart, so both values hold.
  for (const auto& [text, expected] : std::vector<std::pair<std::string, bool>>{
           {"true", true}, {"false", false}, {"1", true}, {R"("on")", true}}) {
    const Config config = Config::from_json_string(
        R"({"train_batch_size": 8, "zero_optimization": {"parameter_alignment": )" + text + "}}");
    EXPECT_EQ(
        nlohmann::json::parse(config.resolved_json())["zero_optimization"]["parameter_alignment"],
        expected)
        << text;
  }
  ConfigError bytes =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"parameter_alignment": 16}})");
  EXPECT_EQ(bytes.key_path(), "zero_optimization.parameter_alignment");
  EXPECT_THAT(bytes.what(), HasSubstr("got 16, expected a boolean"));
}

TEST(DeepSpeedParity, AioThreadCountIsIgnoredAsDeepSpeedIgnoresIt) {
  // DeepSpeed 0.19.8 reads only intra_op_parallelism (#7056 renamed thread_count).
  const Config config =
      Config::from_json_string(R"({"train_batch_size": 8, "aio": {"thread_count": 4}})");
  EXPECT_EQ(config.aio.intra_op_parallelism, 1);
  ASSERT_EQ(config.notices().size(), 1u);
  EXPECT_THAT(config.notices()[0], StartsWith("aio.thread_count: accepted, has no effect"));
  EXPECT_THAT(config.notices()[0], HasSubstr("aio.intra_op_parallelism"));
  const Config both = Config::from_json_string(
      R"({"train_batch_size": 8, "aio": {"thread_count": 4, "intra_op_parallelism": 2}})");
  EXPECT_EQ(both.aio.intra_op_parallelism, 2);
}

TEST(DeepSpeedParity, AioNullTakesTheDefaults) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8, "aio": null})");
  EXPECT_EQ(config.aio.block_size, 1048576);
  EXPECT_EQ(config.aio.queue_depth, 8);
  EXPECT_TRUE(config.notices().empty());
}

TEST(DeepSpeedParity, CoercesValuesAsPydanticDoes) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": "2", "reduce_bucket_size": "500000000", "overlap_comm": 1,
      "contiguous_gradients": "true", "allgather_partitions": "Yes", "reduce_scatter": 0.0},
    "fp16": {"enabled": "true", "loss_scale_window": " 500 ", "loss_scale": "1e3"}})");
  EXPECT_EQ(config.zero_optimization.stage, 2);
  EXPECT_EQ(config.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_TRUE(config.zero_optimization.overlap_comm);
  EXPECT_TRUE(config.zero_optimization.contiguous_gradients);
  EXPECT_TRUE(config.zero_optimization.allgather_partitions);
  EXPECT_FALSE(config.zero_optimization.reduce_scatter);
  EXPECT_TRUE(config.fp16.enabled);
  EXPECT_EQ(config.fp16.loss_scale_window, 500);
  EXPECT_EQ(config.fp16.loss_scale, 1000.0);
  const Config bf16 =
      Config::from_json_string(R"({"train_batch_size": 8, "bf16": {"enabled": "on"}})");
  EXPECT_TRUE(bf16.bf16.enabled);
}

TEST(DeepSpeedParity, CoercionStopsWherePydanticStops) {
  // Pydantic takes 0 and 1 for a boolean, not 2; an integer string, not a fraction.
  ConfigError two =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"overlap_comm": 2}})");
  EXPECT_EQ(two.key_path(), "zero_optimization.overlap_comm");
  EXPECT_THAT(two.what(), HasSubstr("got 2, expected a boolean"));
  ConfigError fraction =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"stage": "2.5"}})");
  EXPECT_EQ(fraction.key_path(), "zero_optimization.stage");
  // Top-level keys are read with get_scalar_param in DeepSpeed: no coercion.
  ConfigError top = config_error(R"({"train_batch_size": "8"})");
  EXPECT_EQ(top.key_path(), "train_batch_size");
}

TEST(DeepSpeedParity, ReadsTheOldBooleanZeroSwitch) {
  const Config on = Config::from_json_string(
      R"({"train_batch_size": 8, "zero_optimization": true, "allgather_size": 2e8})");
  EXPECT_EQ(on.zero_optimization.stage, 1);
  EXPECT_EQ(on.zero_optimization.allgather_bucket_size, 200000000);
  ASSERT_EQ(on.notices().size(), 1u);
  EXPECT_THAT(on.notices()[0], HasSubstr("deprecated boolean form"));
  const Config off =
      Config::from_json_string(R"({"train_batch_size": 8, "zero_optimization": false})");
  EXPECT_EQ(off.zero_optimization.stage, 0);
  ConfigError stray = config_error(R"({"train_batch_size": 8, "allgather_size": 2e8})");
  EXPECT_EQ(stray.key_path(), "allgather_size");
}

TEST(DeepSpeedParity, AcceptsDeepSpeedsRangesWithItsMeaning) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "gradient_clipping": -1, "steps_per_print": 0,
    "zero_optimization": {"allgather_bucket_size": 0, "sub_group_size": 0},
    "fp16": {"hysteresis": 0}})");
  EXPECT_EQ(config.gradient_clipping, -1.0);
  EXPECT_EQ(config.steps_per_print, 0);
  EXPECT_EQ(config.zero_optimization.allgather_bucket_size, 0);
  EXPECT_EQ(config.zero_optimization.sub_group_size, 0);
  EXPECT_EQ(config.fp16.hysteresis, 0);
  ConfigError negative =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": -1}})");
  EXPECT_EQ(negative.key_path(), "zero_optimization.sub_group_size");
  EXPECT_THAT(negative.what(), HasSubstr("got -1"));
}

TEST(DeepSpeedParity, KeysRemovedInTheNewestDeepSpeedAreRejectedAtAnyValue) {
  for (const auto& [text, key_path] : std::vector<std::pair<std::string, std::string>>{
           {R"({"sparse_gradients": false})", "sparse_gradients"},
           {R"({"zero_optimization": {"mics_shard_size": -1}})",
            "zero_optimization.mics_shard_size"},
           {R"({"zero_optimization": {"mics_hierarchical_params_gather": false}})",
            "zero_optimization.mics_hierarchical_params_gather"},
           {R"({"zero_optimization": {"zeropp_loco_param": {"err_beta": 0.8}}})",
            "zero_optimization.zeropp_loco_param"}}) {
    auto document = nlohmann::json::parse(text);
    document["train_batch_size"] = 8;
    ConfigError error = config_error(document.dump());
    EXPECT_EQ(error.key_path(), key_path);
    EXPECT_THAT(error.what(), HasSubstr("removed in DeepSpeed 0.19.8"));
  }
}

TEST(DeepSpeedParity, MinLossScaleIsAnInteger) {
  ConfigError error = config_error(R"({"train_batch_size": 8, "fp16": {"min_loss_scale": 0.5}})");
  EXPECT_EQ(error.key_path(), "fp16.min_loss_scale");
  EXPECT_THAT(error.what(), HasSubstr("got 0.5, expected an integer"));
}

TEST(DeepSpeedParity, FlopsProfilerTurnsOnTheWallClockBreakdown) {
  const Config on = Config::from_json_string(
      R"({"train_batch_size": 8, "flops_profiler": {"enabled": true, "profile_step": 1}})");
  EXPECT_TRUE(on.wall_clock_breakdown);
  const Config off =
      Config::from_json_string(R"({"train_batch_size": 8, "flops_profiler": {"enabled": false}})");
  EXPECT_FALSE(off.wall_clock_breakdown);
}

TEST(Config, ActivationCheckpointingKeysAreRead) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
      "contiguous_memory_optimization": true, "number_checkpoints": 4,
      "synchronize_checkpoint_boundary": true, "profile": true}})");
  const ActivationCheckpointingConfig& c = config.activation_checkpointing;
  EXPECT_TRUE(c.partition_activations);
  EXPECT_TRUE(c.cpu_checkpointing);
  EXPECT_TRUE(c.contiguous_memory_optimization);
  EXPECT_EQ(c.number_checkpoints, 4);
  EXPECT_TRUE(c.synchronize_checkpoint_boundary);
  EXPECT_TRUE(c.profile);
}

TEST(ConfigValidation, ContiguousCheckpointsNeedTheirNumber) {
  ConfigError error = config_error(R"({"train_batch_size": 8,
    "activation_checkpointing": {"contiguous_memory_optimization": true}})");
  EXPECT_EQ(error.key_path(), "activation_checkpointing.number_checkpoints");
  EXPECT_THAT(error.what(), HasSubstr("required by contiguous_memory_optimization"));
}

TEST(ConfigValidation, NumberOfCheckpointsWithoutTheContiguousBufferIsRefused) {
  ConfigError error = config_error(
      R"({"train_batch_size": 8, "activation_checkpointing": {"number_checkpoints": 4}})");
  EXPECT_EQ(error.key_path(), "activation_checkpointing.number_checkpoints");
  EXPECT_THAT(error.what(), HasSubstr("applies only with contiguous_memory_optimization"));
}

TEST(ConfigValidation, ActivationCheckpointingTypesAreCheckedFirst) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "activation_checkpointing": {"profile": "yes"}})");
  EXPECT_EQ(error.key_path(), "activation_checkpointing.profile");
  EXPECT_THAT(error.what(), HasSubstr("expected a boolean"));
}

TEST(ConfigValidation, MistakesAreReportedBeforeRefusals) {
  ConfigError error = config_error(
      R"({"train_batch_size": 8, "dump_state": true, "zero_optimization": {"stage": 9}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.stage");
}

TEST(ConfigValidation, DuplicateKey) {
  ConfigError error =
      config_error(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 2}})");
  EXPECT_EQ(error.key_path(), "zero_optimization.stage");
  EXPECT_THAT(error.what(), HasSubstr("given twice"));
}

TEST(ConfigValidation, InvalidJson) {
  ConfigError error = config_error(R"({"train_batch_size": 8,)");
  EXPECT_EQ(error.key_path(), "");
  EXPECT_THAT(error.what(), HasSubstr("invalid JSON"));
  EXPECT_THAT(config_error("[1, 2]").what(), HasSubstr("expected a JSON object"));
}

TEST(ConfigValidation, WorldSizeBelowOneIsAUsageError) {
  EXPECT_THROW(Config::from_json_string(R"({"train_batch_size": 8})", 0), UsageError);
}

TEST(ConfigValidation, UnreadableFileIsAnIoError) {
  EXPECT_THROW(Config::from_json_file("/nonexistent/zeroshard.json"), IoError);
}

// --- hostile input: deep nesting, huge keys and values, control bytes -----------------------

// `depth` nested arrays, `[[...]]`.
std::string nested_arrays(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// Messages go to terminals and logs: no control byte, nothing but ASCII, one short line.
void expect_printable_and_short(const ConfigError& error) {
  const std::string message = error.what();
  EXPECT_LT(message.size(), 1024u);
  EXPECT_TRUE(std::all_of(message.begin(), message.end(), [](char c) {
    return c >= 0x20 && c < 0x7f;
  })) << message.substr(0, 200);
}

TEST(ConfigInput, DeepNestingIsRefusedWhileParsing) {
  // 100,000 levels overflowed the stack when the value was copied (an alias is moved to its
  // target); the parser now stops at the 33rd level, before the value is built.
  const std::string deep = nested_arrays(100000);
  const struct {
    std::string text;
    std::string key_path;
  } cases[] = {
      {deep, ""},
      {R"({"train_batch_size": 8, "zero_optimization": {"cpu_offload": )" + deep + "}}",
       "zero_optimization.cpu_offload"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage3_max_live_parameters": )" + deep +
           "}}",
       "zero_optimization.stage3_max_live_parameters"},
      {R"({"train_batch_size": 8, "wandb": {"x": )" + deep + "}}", "wandb.x"},
      {R"({"optimizer": {"type": "adam", "params": {"betas": )" + deep + "}}}",
       "optimizer.params.betas"},
  };
  for (const auto& [text, key_path] : cases) {
    ConfigError error = config_error(text);
    EXPECT_EQ(error.key_path(), key_path);
    EXPECT_THAT(error.what(), HasSubstr("nested more than 32 deep"));
  }
}

TEST(ConfigInput, DeepObjectsNameTheKeysSoFar) {
  std::string text = R"({"train_batch_size": 8, )";
  for (int i = 0; i < 8000; ++i) text += R"("a": {)";
  text += std::string(8000, '}') + "}";
  ConfigError error = config_error(text);
  std::string path = "a";
  for (int i = 1; i < 32; ++i) path += ".a";
  EXPECT_EQ(error.key_path(), path);
}

TEST(ConfigInput, NestingUpToTheLimitIsAcceptedAndOneLevelMoreIsNot) {
  // wandb is not looked inside, so only the depth is checked: 1 + 1 + 30 = 32 levels.
  const auto nested = [](std::size_t arrays) {
    return R"({"train_batch_size": 8, "wandb": {"x": )" + nested_arrays(arrays) + "}}";
  };
  EXPECT_EQ(Config::from_json_string(nested(30)).train_batch_size, 8);
  ConfigError error = config_error(nested(31));
  EXPECT_EQ(error.key_path(), "wandb.x");
  EXPECT_THAT(error.what(), HasSubstr("nested more than 32 deep"));
}

TEST(ConfigInput, MegabyteUnknownKeyGivesAShortMessage) {
  const std::string key(1 << 20, 'x');
  ConfigError error = config_error(R"({"train_batch_size": 8, ")" + key + R"(": 1})");
  EXPECT_EQ(error.key_path(), std::string(64, 'x') + "...");
  EXPECT_THAT(error.what(), HasSubstr("unknown key"));
  expect_printable_and_short(error);
}

TEST(ConfigInput, TenMegabyteValuesGiveShortMessages) {
  const std::string big(10 << 20, 'x');
  ConfigError choice =
      config_error(R"({"train_batch_size": 8, "communication_data_type": ")" + big + R"("})");
  EXPECT_EQ(choice.key_path(), "communication_data_type");
  EXPECT_THAT(choice.what(), HasSubstr("got \"" + std::string(64, 'x') + "...\", expected one of"));
  expect_printable_and_short(choice);

  ConfigError type = config_error(R"({"train_batch_size": ")" + big + R"("})");
  EXPECT_THAT(type.what(), HasSubstr("got string \"xxx"));
  expect_printable_and_short(type);

  // nlohmann quotes the token it stopped in: here the whole unterminated string.
  ConfigError unterminated = config_error(R"({"train_batch_size": ")" + big);
  EXPECT_THAT(unterminated.what(), HasSubstr("invalid JSON"));
  expect_printable_and_short(unterminated);

  ConfigError overflow =
      config_error(R"({"gradient_clipping": 1)" + std::string(10 << 20, '0') + "}");
  EXPECT_EQ(overflow.key_path(), "gradient_clipping");
  EXPECT_THAT(overflow.what(), HasSubstr("expected a finite number"));
  expect_printable_and_short(overflow);
}

TEST(ConfigInput, ControlBytesInKeysAreEscaped) {
  // A NUL used to end the message early, so that "stage\u0000x" read as the valid "stage".
  const struct {
    const char* json_key;
    const char* shown;
  } cases[] = {{R"(stage\u0000x)", R"(stage\u0000x)"},
               {R"(sta\nge)", R"(sta\nge)"},
               {R"(\u001b[31mstage)", R"(\u001b[31mstage)"},
               {R"(st\u00e4ge)", R"(st\xc3\xa4ge)"},
               {R"(back\\slash)", R"(back\\slash)"}};
  for (const auto& [json_key, shown] : cases) {
    ConfigError error = config_error(R"({"train_batch_size": 8, "zero_optimization": {")" +
                                     std::string(json_key) + R"(": 1}})");
    EXPECT_EQ(error.key_path(), "zero_optimization." + std::string(shown));
    EXPECT_THAT(error.what(),
                StartsWith("zero_optimization." + std::string(shown) + ": unknown key"));
    expect_printable_and_short(error);
  }
  ConfigError twice = config_error(R"({"train_batch_size": 8, "a\u0000": 1, "a\u0000": 2})");
  EXPECT_EQ(twice.key_path(), R"(a\u0000)");
  ConfigError param = config_error(
      R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"x\n": 1}}})");
  EXPECT_EQ(param.key_path(), R"(scheduler.params.x\n)");
  expect_printable_and_short(param);
}

TEST(ConfigInput, ControlBytesInValuesAreEscaped) {
  ConfigError choice = config_error(
      R"({"train_batch_size": 8, "communication_data_type": "\u001b[31mfp\u0000\n16\u00e4"})");
  EXPECT_THAT(choice.what(), HasSubstr(R"(got "\u001b[31mfp\u0000\n16\xc3\xa4")"));
  expect_printable_and_short(choice);
  ConfigError type = config_error(R"({"train_batch_size": "8\u0000\n\u001b"})");
  EXPECT_THAT(type.what(), HasSubstr(R"(got string "8\u0000\n\u001b")"));
  expect_printable_and_short(type);
  // Bytes that are not UTF-8 are invalid JSON; nlohmann's message quotes them.
  ConfigError invalid = config_error("{\"train_batch_size\": \"8\xff\x1b\"}");
  EXPECT_THAT(invalid.what(), HasSubstr("invalid JSON"));
  expect_printable_and_short(invalid);
}

// --- the batch-size identity, with 4 ranks --------------------------------------------------

struct BatchCase {
  const char* given;
  std::int64_t train_batch_size;
  std::int64_t micro_batch;
  std::int64_t accumulation_steps;
};

class BatchSizeIdentity : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchSizeIdentity, SolvesTheMissingSizesWithFourRanks) {
  const BatchCase& batch = GetParam();
  Config config = Config::from_json_string(std::string("{") + batch.given + "}", 4);
  EXPECT_EQ(config.train_batch_size, batch.train_batch_size);
  EXPECT_EQ(config.train_micro_batch_size_per_gpu, batch.micro_batch);
  EXPECT_EQ(config.gradient_accumulation_steps, batch.accumulation_steps);
}

INSTANTIATE_TEST_SUITE_P(
    EveryCombination, BatchSizeIdentity,
    ::testing::Values(
        BatchCase{R"("train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                     "gradient_accumulation_steps": 4)",
                  64, 4, 4},
        BatchCase{R"("train_batch_size": 64, "train_micro_batch_size_per_gpu": 4)", 64, 4, 4},
        BatchCase{R"("train_batch_size": 64, "gradient_accumulation_steps": 2)", 64, 8, 2},
        BatchCase{R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3)", 24, 2,
                  3},
        BatchCase{R"("train_batch_size": 32)", 32, 8, 1},
        BatchCase{R"("train_micro_batch_size_per_gpu": 3)", 12, 3, 1}));

TEST(BatchSizeIdentityErrors, InconsistentSizesShowTheNumbersAndTheWorldSize) {
  ConfigError error = config_error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                                       "gradient_accumulation_steps": 2})",
                                   4);
  EXPECT_EQ(error.key_path(), "train_batch_size");
  EXPECT_THAT(error.what(), HasSubstr("got 30"));
  EXPECT_THAT(error.what(), HasSubstr("train_micro_batch_size_per_gpu 4 x "
                                      "gradient_accumulation_steps 2 x world size 4 = 32"));
}

TEST(BatchSizeIdentityErrors, TotalNotAMultipleOfTheRanks) {
  ConfigError error = config_error(R"({"train_batch_size": 30})", 4);
  EXPECT_EQ(error.key_path(), "train_batch_size");
  EXPECT_THAT(error.what(), HasSubstr("not a multiple of world size 4"));
}

TEST(BatchSizeIdentityErrors, NeedsTotalOrMicroBatch) {
  EXPECT_EQ(config_error(R"({"gradient_accumulation_steps": 2})").key_path(), "train_batch_size");
  EXPECT_THAT(config_error("{}").what(), HasSubstr("give train_batch_size or"));
}

// --- the zeroshard-config tool --------------------------------------------------------------

class ConfigTool : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tools = std::getenv("ZEROSHARD_TOOLS_DIR");
    if (tools == nullptr) GTEST_SKIP() << "ZEROSHARD_TOOLS_DIR is not set (run through ctest)";
    tool_ = std::filesystem::path(tools) / "zeroshard-config";
    dir_ = std::filesystem::temp_directory_path() /
           ("zeroshard_config_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::filesystem::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }

  /// Runs the tool with `arguments`; returns its exit code, leaving stdout and stderr in
  /// out_ and err_.
  int run(const std::string& arguments) {
    const std::string command = "'" + tool_.string() + "' " + arguments + " >'" +
                                (dir_ / "out").string() + "' 2>'" + (dir_ / "err").string() + "'";
    int status = std::system(command.c_str());
    out_ = read_text(dir_ / "out");
    err_ = read_text(dir_ / "err");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::filesystem::path tool_;
  std::filesystem::path dir_;
  std::string out_;
  std::string err_;
};

TEST_F(ConfigTool, PrintsTheResolvedConfigAndExitsZero) {
  auto file = write("ok.json", R"({"train_batch_size": 32, "zero_optimization": {"stage": 3},
                                   "wandb": {"enabled": true}})");
  ASSERT_EQ(run("'" + file.string() + "' --world-size 4"), 0) << err_;
  auto resolved = nlohmann::json::parse(out_);
  EXPECT_EQ(resolved["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(resolved["zero_optimization"]["overlap_comm"], true);
  EXPECT_THAT(err_, HasSubstr("wandb: accepted, has no effect in zeroshard"));
}

TEST_F(ConfigTool, ExitsOneOnAnInvalidConfig) {
  auto file = write("bad.json", R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})");
  EXPECT_EQ(run("'" + file.string() + "'"), 1);
  EXPECT_THAT(err_, HasSubstr("zeroshard-config: " + file.string() +
                              ": zero_optimization.stage: got 4, expected 0..3"));
}

TEST_F(ConfigTool, RefusesWhatTheEngineRefuses) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
          "params": {"betas": [0.9, 0.99, 0.999]}}})",
       ": optimizer.params.betas: expected an array of two numbers, got 3"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"eps": -1}}})",
       ": optimizer.params.eps: Invalid epsilon value: -1"},
      {R"({"train_batch_size": 8, "aio": {"block_size": 1000}})",
       ": aio.block_size: got 1000, expected a multiple of 4096"},
      {R"({"train_batch_size": 8, "aio": {"use_gds": true}})",
       ": aio.use_gds: got true; not implemented in zeroshard"},
  };
  for (const auto& [text, message] : cases) {
    auto file = write("refused.json", text);
    EXPECT_EQ(run("'" + file.string() + "'"), 1) << text;
    EXPECT_THAT(err_, HasSubstr(file.string() + message)) << text;
  }
}

TEST_F(ConfigTool, TakesTheTrainersDefaultWarmupOfZero) {
  auto file = write("warmup.json", R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}})");
  ASSERT_EQ(run("'" + file.string() + "' --warmup-steps 0"), 0) << err_;
  EXPECT_EQ(nlohmann::json::parse(out_)["scheduler"]["params"]["warmup_num_steps"], 0);
}

TEST_F(ConfigTool, ExitsOneOnAMissingFile) {
  auto file = dir_ / "missing.json";
  EXPECT_EQ(run("'" + file.string() + "'"), 1);
  EXPECT_THAT(err_, HasSubstr("No such file or directory"));
}

TEST_F(ConfigTool, ExitsTwoOnABadCommandLine) {
  EXPECT_EQ(run(""), 2);
  EXPECT_EQ(run("x.json --world-size zero"), 2);
}

// --- example configs and docs ---------------------------------------------------------------

std::filesystem::path source_dir() {
  const char* dir = std::getenv("ZEROSHARD_SOURCE_DIR");
  return dir == nullptr ? std::filesystem::path() : std::filesystem::path(dir);
}

TEST(ExampleConfigs, AllFourStagesParse) {
  if (source_dir().empty()) GTEST_SKIP() << "ZEROSHARD_SOURCE_DIR is not set (run via ctest)";
  for (int stage = 0; stage <= 3; ++stage) {
    auto path = source_dir() / "examples" / "configs" / ("zero" + std::to_string(stage) + ".json");
    Config config = Config::from_json_file(path.string(), 2);
    EXPECT_EQ(config.zero_optimization.stage, stage) << path;
    EXPECT_EQ(config.optimizer.type, "adamw");
    EXPECT_EQ(config.optimizer.params.at("lr"), 1e-3);
    EXPECT_EQ(config.optimizer.params.at("weight_decay"), 0.01);
    EXPECT_EQ(config.train_batch_size, 32);
    EXPECT_EQ(config.zero_optimization.prefetch_bucket_size, 50000);
    EXPECT_TRUE(config.notices().empty()) << path;
  }
}

TEST_F(ConfigTool, FillsAutoValuesFromFlags) {
  if (source_dir().empty()) GTEST_SKIP() << "ZEROSHARD_SOURCE_DIR is not set (run via ctest)";
  const std::string file =
      "'" + (source_dir() / "tests" / "configs" / "hf_zero3_auto.json").string() + "'";
  ASSERT_EQ(run(file + " --world-size 2 --per-device-train-batch-size 4 "
                       "--gradient-accumulation-steps=2 --max-grad-norm 1 --learning-rate 3e-4 "
                       "--adam-beta1 0.9 --adam-beta2 0.95 --adam-epsilon 1e-8 --weight-decay 0 "
                       "--num-training-steps 1000 --warmup-steps 10 --fp16 false --bf16 true "
                       "--hidden-size 1024"),
            0)
      << err_;
  auto resolved = nlohmann::json::parse(out_);
  EXPECT_EQ(resolved["train_batch_size"], 16);
  EXPECT_EQ(resolved["zero_optimization"]["stage3_prefetch_bucket_size"], 943718);
  EXPECT_EQ(resolved["optimizer"]["params"]["lr"], 3e-4);

  EXPECT_EQ(run(file), 1);
  EXPECT_THAT(err_, HasSubstr("train_micro_batch_size_per_gpu: \"auto\" needs the program's "
                              "value: pass ConfigOverrides::per_device_train_batch_size "
                              "(--per-device-train-batch-size)"));
  EXPECT_EQ(run(file + " --learning-rate fast"), 2);
  EXPECT_THAT(err_, HasSubstr("--learning-rate: got 'fast', expected a finite number"));
}

TEST(ConfigReference, DocsHoldTheGeneratedKeyReference) {
  if (source_dir().empty()) GTEST_SKIP() << "ZEROSHARD_SOURCE_DIR is not set (run via ctest)";
  std::string docs = read_text(source_dir() / "docs" / "config.md");
  EXPECT_THAT(docs, HasSubstr(config_reference_markdown()))
      << "regenerate the reference block of docs/config.md with zeroshard-config --reference";
}

TEST(ConfigReference, EveryImplementedScalarKeyHasAField) {
  for (const detail::KeySpec& spec : detail::key_specs()) {
    const bool scalar =
        spec.kind == detail::ValueKind::kBool || spec.kind == detail::ValueKind::kInteger ||
        spec.kind == detail::ValueKind::kNumber || spec.kind == detail::ValueKind::kString;
    if (scalar && spec.status == detail::KeyStatus::kImplemented) {
      EXPECT_FALSE(std::holds_alternative<std::monostate>(spec.field)) << spec.path;
    }
  }
}

TEST(KeySuggestion, WordsFarLongerThanEveryCandidateMatchNothing) {
  EXPECT_EQ(detail::closest_match(std::string(1 << 20, 'x'), {"stage", "xxxxxxxx"}), std::nullopt);
  EXPECT_EQ(detail::closest_match("reduce_bucket_sizeee", {"reduce_bucket_size"}),
            "reduce_bucket_size");
}

TEST(KeySuggestion, CountsASwapAsOneEdit) {
  EXPECT_EQ(detail::edit_distance("stgae", "stage"), 1u);
  EXPECT_EQ(detail::edit_distance("Stage", "stage"), 0u);
  EXPECT_EQ(detail::closest_match("bf61", {"fp16", "bf16"}), "bf16");
  EXPECT_EQ(detail::closest_match("foo", {"aio", "fp16"}), std::nullopt);
  EXPECT_EQ(detail::edit_distance("abcdef", "badcfe"), 3u);
  EXPECT_EQ(detail::edit_distance("", "abc"), 3u);
  EXPECT_EQ(detail::edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace zeroshard
