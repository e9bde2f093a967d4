// Tests of "auto" values: a Hugging Face ZeRO-3 style file with "auto" everywhere loads with the
// program's overrides exactly as transformers' HfTrainerDeepSpeedConfig fills it, and without
// them fails naming the key and the override.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "zeroshard/config.h"
#include "zeroshard/error.h"

namespace zeroshard {
namespace {

using ::testing::HasSubstr;

std::filesystem::path hf_zero3_file() {
  const char* source = std::getenv("ZEROSHARD_SOURCE_DIR");
  return std::filesystem::path(source == nullptr ? "" : source) / "tests" / "configs" /
         "hf_zero3_auto.json";
}

std::string hf_zero3_text() {
  std::ifstream in(hf_zero3_file());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// What a Trainer run with per_device_train_batch_size 4, gradient_accumulation_steps 2,
// learning_rate 3e-4, ... over a model of hidden size 1024 knows.
ConfigOverrides trainer_overrides() {
  ConfigOverrides overrides;
  overrides.per_device_train_batch_size = 4;
  overrides.gradient_accumulation_steps = 2;
  overrides.max_grad_norm = 0.5;
  overrides.learning_rate = 3e-4;
  overrides.adam_beta1 = 0.9;
  overrides.adam_beta2 = 0.95;
  overrides.adam_epsilon = 1e-8;
  overrides.weight_decay = 0.01;
  overrides.num_training_steps = 1000;
  overrides.warmup_steps = 100;
  overrides.fp16 = false;
  overrides.bf16 = true;
  overrides.hidden_size = 1024;
  return overrides;
}

ConfigError error_of(const std::string& text, const ConfigOverrides& overrides,
                     int world_size = 1) {
  try {
    Config::from_json_string(text, world_size, overrides);
  } catch (const ConfigError& error) {
    return error;
  }
  ADD_FAILURE() << "no ConfigError";
  return ConfigError("", "");
}

class HfZero3File : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("ZEROSHARD_SOURCE_DIR") == nullptr) {
      GTEST_SKIP() << "ZEROSHARD_SOURCE_DIR is not set (run through ctest)";
    }
  }
};

TEST_F(HfZero3File, LoadsWithTheTrainersValues) {
  const Config config = Config::from_json_file(hf_zero3_file().string(), 2, trainer_overrides());
  EXPECT_EQ(config.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(config.gradient_accumulation_steps, 2);
  EXPECT_EQ(config.train_batch_size, 16);  // world 2 x 4 x 2
  EXPECT_EQ(config.gradient_clipping, 0.5);
  EXPECT_EQ(config.optimizer.params.at("lr"), 3e-4);
  EXPECT_EQ(config.optimizer.array_params.at("betas"), (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(config.optimizer.params.at("eps"), 1e-8);
  EXPECT_EQ(config.optimizer.params.at("weight_decay"), 0.01);
  EXPECT_EQ(config.scheduler.params.at("warmup_min_lr"), 0.0);
  EXPECT_EQ(config.scheduler.params.at("warmup_max_lr"), 3e-4);
  EXPECT_EQ(config.scheduler.params.at("total_num_steps"), 1000);
  EXPECT_EQ(config.scheduler.params.at("warmup_num_steps"), 100);
  EXPECT_FALSE(config.fp16.enabled);
  EXPECT_TRUE(config.bf16.enabled);
  // hidden_size 1024: h*h, int(0.9*h*h), 10*h.
  EXPECT_EQ(config.zero_optimization.reduce_bucket_size, 1048576);
  EXPECT_EQ(config.zero_optimization.prefetch_bucket_size, 943718);
  EXPECT_EQ(config.zero_optimization.param_persistence_threshold, 10240);
  // The resolved dump holds no "auto" and reads back the same.
  const Config again = Config::from_json_string(config.resolved_json(), 2);
  EXPECT_EQ(again.resolved_json(), config.resolved_json());
}

TEST_F(HfZero3File, FailsWithoutOverridesNamingTheKeyAndTheOverride) {
  ConfigError error = error_of(hf_zero3_text(), {});
  EXPECT_EQ(error.key_path(), "train_micro_batch_size_per_gpu");
  EXPECT_THAT(error.what(), HasSubstr("ConfigOverrides::per_device_train_batch_size "
                                      "(--per-device-train-batch-size)"));
}

TEST_F(HfZero3File, EachMissingOverrideIsNamed) {
  struct Case {
    void (*drop)(ConfigOverrides&);
    const char* key_path;
    const char* override_named;
  };
  const Case cases[] = {
      {[](ConfigOverrides& o) { o.gradient_accumulation_steps.reset(); },
       "gradient_accumulation_steps", "--gradient-accumulation-steps"},
      {[](ConfigOverrides& o) { o.max_grad_norm.reset(); }, "gradient_clipping", "--max-grad-norm"},
      {[](ConfigOverrides& o) { o.learning_rate.reset(); }, "optimizer.params.lr",
       "--learning-rate"},
      {[](ConfigOverrides& o) { o.adam_beta2.reset(); }, "optimizer.params.betas", "--adam-beta2"},
      {[](ConfigOverrides& o) { o.adam_epsilon.reset(); }, "optimizer.params.eps",
       "--adam-epsilon"},
      {[](ConfigOverrides& o) { o.weight_decay.reset(); }, "optimizer.params.weight_decay",
       "--weight-decay"},
      {[](ConfigOverrides& o) { o.num_training_steps.reset(); }, "scheduler.params.total_num_steps",
       "--num-training-steps"},
      {[](ConfigOverrides& o) { o.warmup_steps.reset(); }, "scheduler.params.warmup_num_steps",
       "--warmup-steps"},
      {[](ConfigOverrides& o) { o.bf16.reset(); }, "bf16.enabled", "--bf16"},
  };
  for (const Case& c : cases) {
    ConfigOverrides overrides = trainer_overrides();
    c.drop(overrides);
    ConfigError error = error_of(hf_zero3_text(), overrides);
    EXPECT_EQ(error.key_path(), c.key_path);
    EXPECT_THAT(error.what(), HasSubstr(c.override_named)) << c.key_path;
  }
}

TEST(AutoValues, ANumberThatDiffersFromTheOverrideIsAnError) {
  ConfigOverrides overrides;
  overrides.learning_rate = 3e-4;
  ConfigError error = error_of(R"({"train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})",
                               overrides);
  EXPECT_EQ(error.key_path(), "optimizer.params.lr");
  EXPECT_THAT(error.what(), HasSubstr("ConfigOverrides::learning_rate (--learning-rate) is"));
}

TEST(AutoValues, StageThreeSizesKeepTheirDefaultsBelowStageThree) {
  // The Trainer leaves them "auto" and DeepSpeed drops them; reduce_bucket_size is still filled.
  ConfigOverrides overrides;
  overrides.hidden_size = 512;
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})",
                                                 1, overrides);
  EXPECT_EQ(config.zero_optimization.reduce_bucket_size, 512 * 512);
  EXPECT_EQ(config.zero_optimization.prefetch_bucket_size, 50000000);
  EXPECT_EQ(config.zero_optimization.param_persistence_threshold, 100000);
}

TEST(AutoValues, TrainBatchSizeFollowsTheOtherTwoFromTheFile) {
  const Config config = Config::from_json_string(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 3})",
      4);
  EXPECT_EQ(config.train_batch_size, 24);
}

TEST(AutoValues, TrainBatchSizeMustMatchTheOverridesAsTheTrainerChecks) {
  // The Trainer compares the file's train_batch_size with world x per_device_train_batch_size x
  // gradient_accumulation_steps (its default 1); a micro batch of 8 would silently be 4x the
  // program's.
  ConfigOverrides overrides;
  overrides.per_device_train_batch_size = 2;
  ConfigError error = error_of(R"({"train_batch_size": 8})", overrides);
  EXPECT_EQ(error.key_path(), "train_batch_size");
  EXPECT_THAT(error.what(), HasSubstr("got 8, but world size 1 x per_device_train_batch_size 2 x "
                                      "gradient_accumulation_steps 1 = 2"));
  const Config agrees = Config::from_json_string(
      R"({"train_batch_size": 8, "gradient_accumulation_steps": 4})", 1, overrides);
  EXPECT_EQ(agrees.train_micro_batch_size_per_gpu, 2);
  const Config filled = Config::from_json_string(R"({"train_batch_size": "auto"})", 2, overrides);
  EXPECT_EQ(filled.train_batch_size, 4);
  EXPECT_EQ(filled.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(filled.gradient_accumulation_steps, 1);
}

TEST(AutoValues, WarmupStepsZeroIsTheTrainersDefault) {
  ConfigOverrides overrides;
  overrides.warmup_steps = 0;
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
                                                      "warmup_num_steps": "auto"}}})",
                                                 1, overrides);
  EXPECT_EQ(config.scheduler.params.at("warmup_num_steps"), 0.0);
}

TEST(AutoValues, OffloadParamBufferSizeAutoIsDeepSpeedsDefault) {
  // The Trainer fills nothing there and DeepSpeed drops the "auto", taking 1e8.
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_size": "auto"}}})");
  EXPECT_EQ(config.zero_optimization.offload_param.buffer_size, 100000000);
  ASSERT_EQ(config.notices().size(), 1u);
  EXPECT_THAT(config.notices()[0],
              HasSubstr("zero_optimization.offload_param.buffer_size: \"auto\" is DeepSpeed's "
                        "default 100000000"));
}

TEST(AutoValues, AKeyNoOverrideFillsIsAnError) {
  ConfigError error = error_of(R"({"train_batch_size": 8, "steps_per_print": "auto"})", {});
  EXPECT_EQ(error.key_path(), "steps_per_print");
  EXPECT_THAT(error.what(), HasSubstr("no override fills this key"));
  ConfigError param = error_of(
      R"({"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"momentum": "auto"}}})",
      {});
  EXPECT_EQ(param.key_path(), "optimizer.params.momentum");
}

TEST(AutoValues, WarmupMinLrIsZeroAsTheTrainerFillsIt) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto"}}})");
  EXPECT_EQ(config.scheduler.params.at("warmup_min_lr"), 0.0);
}

// DeepSpeed reads zero_optimization, fp16, bf16 and the monitors through pydantic models that drop
// "auto" (DeepSpeedConfigModel), so a key the Trainer does not fill takes DeepSpeed's default
// there; zeroshard takes it too, with a notice naming the key and the value.
TEST(AutoValues, KeysTheTrainerDoesNotFillTakeDeepSpeedsDefaultWithANotice) {
  struct Case {
    const char* json;  ///< the file, with one "auto"
    const char* path;
    const char* default_text;
    bool (*holds_default)(const Config&);
  };
  const Case cases[] = {
      {R"("zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto"})",
       "zero_optimization.stage3_max_live_parameters", "1000000000",
       [](const Config& c) { return c.zero_optimization.max_live_parameters == 1000000000; }},
      {R"("zero_optimization": {"stage": 3, "stage3_max_reuse_distance": "auto"})",
       "zero_optimization.stage3_max_reuse_distance", "1000000000",
       [](const Config& c) { return c.zero_optimization.max_reuse_distance == 1000000000; }},
      {R"("zero_optimization": {"stage": 3, "sub_group_size": "auto"})",
       "zero_optimization.sub_group_size", "1000000000",
       [](const Config& c) { return c.zero_optimization.sub_group_size == 1000000000; }},
      {R"("zero_optimization": {"stage": "auto"})", "zero_optimization.stage", "0",
       [](const Config& c) { return c.zero_optimization.stage == 0; }},
      {R"("zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"})",
       "zero_optimization.allgather_bucket_size", "500000000",
       [](const Config& c) { return c.zero_optimization.allgather_bucket_size == 500000000; }},
      {R"("zero_optimization": {"stage": 2,
          "offload_optimizer": {"device": "cpu", "pin_memory": "auto"}})",
       "zero_optimization.offload_optimizer.pin_memory", "true",
       [](const Config& c) { return c.zero_optimization.offload_optimizer.pin_memory; }},
      {R"("fp16": {"enabled": true, "initial_scale_power": "auto"})", "fp16.initial_scale_power",
       "16", [](const Config& c) { return c.fp16.initial_scale_power == 16; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    const Config config =
        Config::from_json_string(std::string(R"({"train_batch_size": 8, )") + c.json + "}");
    EXPECT_TRUE(c.holds_default(config));
    ASSERT_EQ(config.notices().size(), 1u);
    EXPECT_THAT(config.notices()[0], HasSubstr(std::string(c.path) +
                                               ": \"auto\" is DeepSpeed's "
                                               "default " +
                                               c.default_text));
  }
}

// Without the model's hidden size the Trainer cannot derive the bucket sizes (it raises);
// DeepSpeed alone takes its defaults, and so does zeroshard, naming the override that would fill
// them.
TEST(AutoValues, HiddenSizeBasedSizesWithoutTheHiddenSizeTakeDeepSpeedsDefaults) {
  const Config config = Config::from_json_string(R"({"train_batch_size": 8,
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  EXPECT_EQ(config.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(config.zero_optimization.prefetch_bucket_size, 50000000);
  EXPECT_EQ(config.zero_optimization.param_persistence_threshold, 100000);
  ASSERT_EQ(config.notices().size(), 3u);
  EXPECT_THAT(config.notices()[0],
              HasSubstr("zero_optimization.reduce_bucket_size: \"auto\" is DeepSpeed's default "
                        "500000000"));
  EXPECT_THAT(config.notices()[1],
              HasSubstr("zero_optimization.stage3_prefetch_bucket_size: \"auto\" is DeepSpeed's "
                        "default 50000000"));
  EXPECT_THAT(config.notices()[2],
              HasSubstr("zero_optimization.stage3_param_persistence_threshold: \"auto\" is "
                        "DeepSpeed's default 100000"));
  for (const std::string& notice : config.notices()) {
    EXPECT_THAT(notice, HasSubstr("ConfigOverrides::hidden_size (--hidden-size)"));
  }
}

// Outside those sections DeepSpeed keeps "auto" as a string and refuses or misreads it: still a
// named error here.
TEST(AutoValues, AutoWhereDeepSpeedTakesNoDefaultStaysAnError) {
  for (const char* json :
       {R"("steps_per_print": "auto")",
        R"("activation_checkpointing": {"partition_activations": "auto"})",
        R"("data_types": {"grad_accum_dtype": "auto"})", R"("aio": {"block_size": "auto"})"}) {
    SCOPED_TRACE(json);
    ConfigError error =
        error_of(std::string(R"({"train_batch_size": 8, )") + json + "}", ConfigOverrides{});
    EXPECT_THAT(error.what(), HasSubstr("DeepSpeed's parser takes no default for \"auto\" here"));
  }
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "aio": {"block_size": "auto"}})", {}).key_path(),
            "aio.block_size");
}

}  // namespace
}  // namespace zeroshard
