#include "torch_gpt_flags.h"

#include "command_line.h"

namespace torch_gpt {

void add_shape_flags(CLI::App& app, GptShape& shape) {
  using zeroshard::cli::add_integer;
  add_integer(app, "--layers", shape.layers, "transformer blocks")->capture_default_str();
  add_integer(app, "--width", shape.width, "channels of the residual stream")
      ->capture_default_str();
  add_integer(app, "--heads", shape.heads, "attention heads; must divide --width")
      ->capture_default_str();
  add_integer(app, "--seq-len", shape.seq, "context length in bytes")->capture_default_str();
}

}  // namespace torch_gpt
