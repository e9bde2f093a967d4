// zeroshard-consolidate: streams the full weights of a sharded checkpoint into one safetensors
// file (zeroshard::consolidate_checkpoint), whatever the world size and stage it was saved at.
#include <iostream>
#include <string>
#include <string_view>

#include "zeroshard/checkpoint.h"
#include "zeroshard/error.h"

namespace {

constexpr int kBadInput = 2;

constexpr const char* kUsage =
    R"(usage: zeroshard-consolidate CKPT_DIR OUT.safetensors [--tag T] [--dtype fp32|fp16|bf16]

Writes every parameter of the checkpoint CKPT_DIR/T (default: the one CKPT_DIR/latest names)
under its registered name and shape into OUT.safetensors, in the given dtype (default fp32,
rounded to nearest even from the fp32 master weights). Memory stays a few MiB at any model
size. Exit status: 0 written; 1 the checkpoint is missing or damaged or OUT cannot be
written; 2 bad command line.
)";

}  // namespace

int main(int argc, char** argv) {
  std::string positional[2];
  int positional_count = 0;
  std::string tag;
  zeroshard::DType dtype = zeroshard::DType::kFloat32;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if ((arg == "--tag" || arg == "--dtype") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--tag") {
        tag = value;
      } else if (value == "fp32") {
        dtype = zeroshard::DType::kFloat32;
      } else if (value == "fp16") {
        dtype = zeroshard::DType::kFloat16;
      } else if (value == "bf16") {
        dtype = zeroshard::DType::kBFloat16;
      } else {
        std::cerr << "zeroshard-consolidate: --dtype " << value
                  << ", expected fp32, fp16 or bf16\n";
        return kBadInput;
      }
      continue;
    }
    if (arg.starts_with("-") || positional_count == 2) {
      std::cerr << "zeroshard-consolidate: unexpected argument '" << arg << "'\n" << kUsage;
      return kBadInput;
    }
    positional[positional_count++] = std::string(arg);
  }
  if (positional_count != 2) {
    std::cerr << kUsage;
    return kBadInput;
  }
  try {
    zeroshard::consolidate_checkpoint(positional[0], positional[1], tag, dtype);
  } catch (const zeroshard::Error& e) {
    std::cerr << "zeroshard-consolidate: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
