// Uses the installed public API the way an outside program would: parse a config, print a value.
#include <zeroshard/zeroshard.h>

#include <iostream>

int main() {
  auto config = zeroshard::Config::from_json_string(R"({"train_batch_size": 8,
                                                        "zero_optimization": {"stage": 2}})");
  std::cout << "stage " << config.zero_optimization.stage << "\n";
  return config.zero_optimization.stage == 2 ? 0 : 1;
}
