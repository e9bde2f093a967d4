// Whole-model exports of sharded checkpoints (Engine::save_checkpoint writes them).
#pragma once

#include <string>

#include "zeroshard/dtype.h"
#include "zeroshard/export.h"

namespace zeroshard {

/// Writes the full weights of checkpoint dir/tag (the one dir/latest names when `tag` is empty)
/// into the safetensors file `out`, every parameter under its registered name and shape, in
/// `dtype` (rounded to nearest even from the fp32 master). Streams: memory stays a few MiB at any
/// model size. Throws CheckpointError naming the file on a missing or damaged checkpoint (no
/// `out` is left behind then), IoError when `out` cannot be written. Not collective.
ZEROSHARD_API void consolidate_checkpoint(const std::string& dir, const std::string& out,
                                          const std::string& tag = "",
                                          DType dtype = DType::kFloat32);

}  // namespace zeroshard
