// zeroshard-consolidate: streams the full weights of a sharded checkpoint into one safetensors
// file (zeroshard::consolidate_checkpoint), whatever the world size and stage it was saved at.
#include <iostream>
#include <map>
#include <string>

#include "tools/command_line.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/error.h"

namespace {

constexpr const char* kDescription =
    R"(Writes every parameter of the checkpoint CKPT_DIR/T (default: the one CKPT_DIR/latest names)
under its registered name and shape into OUT.safetensors, in the given dtype (default fp32,
rounded to nearest even from the fp32 master weights). Memory stays a few MiB at any model
size. Exit status: 0 written; 1 the checkpoint is missing or damaged or OUT cannot be
written; 2 bad command line.)";

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint_dir;
  std::string out;
  std::string tag;
  std::string dtype = "fp32";
  CLI::App app(kDescription, "zeroshard-consolidate");
  app.add_option("CKPT_DIR", checkpoint_dir, "the checkpoint folder")->required();
  app.add_option("OUT", out, "the safetensors file to write")->required();
  app.add_option("--tag", tag, "the checkpoint's tag (default: the one CKPT_DIR/latest names)")
      ->type_name("T");
  app.add_option("--dtype", dtype, "the written weights' type")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  if (const auto exit_code = zeroshard::cli::parse(app, argc, argv)) return *exit_code;
  const std::map<std::string, zeroshard::DType> dtypes = {{"fp32", zeroshard::DType::kFloat32},
                                                          {"fp16", zeroshard::DType::kFloat16},
                                                          {"bf16", zeroshard::DType::kBFloat16}};
  try {
    zeroshard::consolidate_checkpoint(checkpoint_dir, out, tag, dtypes.at(dtype));
  } catch (const zeroshard::Error& e) {
    std::cerr << "zeroshard-consolidate: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
