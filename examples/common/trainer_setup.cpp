// The example trainers' config and device, as the shared command-line flags ask for them.
#include "trainer_setup.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>  // nlohmann::ordered_json: the config file, --stage written in

namespace zeroshard::examples {

Config load_trainer_config(const TrainerOptions& options, int world) {
  Config config = Config::from_json_file(options.config_path, world);
  if (options.stage) {
    // --stage stands for the file's zero_optimization.stage (as llm.c's -z does): the file is
    // read again with it, so that every key is checked against the stage that runs.
    std::ifstream file(options.config_path);
    nlohmann::ordered_json document = nlohmann::ordered_json::parse(file);
    document["zero_optimization"]["stage"] = *options.stage;
    config = Config::from_json_string(document.dump(), world);
  }
  if (!options.precision.empty()) {
    config.fp16.enabled = options.precision == "fp16";
    config.bf16.enabled = options.precision == "bf16";
  }
  return config;
}

void print_config_notices(const Config& config, int rank) {
  if (rank != 0) return;
  for (const std::string& notice : config.notices()) std::printf("note: %s\n", notice.c_str());
}

Device choose_device(const std::string& choice) {
  if (choice == "cpu") return Device::cpu();
  if (choice == "auto") return Device::from_environment();
  if (!cuda_available()) throw UsageError("--device cuda: " + cuda_unavailable_reason());
  const Device device = Device::from_environment();
  if (!device.is_cuda()) {
    throw UsageError("--device cuda, but ZEROSHARD_DEVICE asks for the CPU");
  }
  return device;
}

}  // namespace zeroshard::examples
