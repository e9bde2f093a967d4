// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the data. Writing a header for
// tensors laid out back to back, and reading one with the reference reader's checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "zeroshard/dtype.h"

namespace zeroshard::detail {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::int64_t begin = 0;  ///< byte range relative to the start of the data
  std::int64_t end = 0;
};

/// "F32", "F16" or "BF16".
const char* safetensors_dtype(DType dtype) noexcept;

/// Lays `entries` out back to back in the given order (setting begin and end) and returns the
/// bytes before the data: the length and the JSON header, space-padded to a multiple of 8 so the
/// data stays aligned. The metadata says format "pt", which transformers requires.
std::string safetensors_prefix(std::vector<SafetensorsEntry>& entries);

/// Reads and checks the header of `file`: its length, the JSON, each entry's dtype, shape and
/// byte count, entries tiling the data without gaps, and the file size. CheckpointError naming
/// the file otherwise. `data_start` receives the data's offset in the file.
std::vector<SafetensorsEntry> read_safetensors_header(const FileHandle& file,
                                                      std::int64_t* data_start);

/// Streams the checkpoint in `checkpoint_dir` (its manifest `m`) into `out` as safetensors of
/// `dtype`: every parameter, registration order, trainable ones from the fp32 master. Memory is
/// one chunk, whatever the model's size; each shard's checksum is checked as it streams by.
void write_consolidated(const Manifest& m, const std::string& checkpoint_dir,
                        const std::string& out, DType dtype);

}  // namespace zeroshard::detail
