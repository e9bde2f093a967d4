// safetensors headers, and the streaming export of a sharded checkpoint into one file.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>  // nlohmann::json

#include "checkpoint/direct_io.h"
#include "precision/half_conversion.h"
#include "util/crc32c.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

namespace {

// The reference reader refuses headers above 100 MB.
constexpr std::uint64_t kMaxHeaderBytes = 100000000;

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw CheckpointError("safetensors file " + path + ": " + what);
}

/// Streams `count` fp32 elements of section `section` (holding `what`) of a checked file in
/// pieces, calling `visit(first_element, values, n)` for each, and checks every chunk's checksum.
template <typename Visit>
void stream_section(const std::string& path, const ManifestFile& meta, int section,
                    const char* what, std::int64_t count, Visit visit) {
  const FileHandle file = FileHandle::open_read(path);
  if (file.size() != meta.bytes) {
    throw CheckpointError("checkpoint file " + path + " is " + std::to_string(file.size()) +
                          " bytes, the manifest says " + std::to_string(meta.bytes) +
                          (file.size() < meta.bytes ? " (truncated)" : ""));
  }
  std::vector<float> chunk(static_cast<std::size_t>(std::min(kIoChunk, count)));
  std::uint32_t crc = 0;
  for (const ReadPiece& piece : read_pieces(meta, count, 0, count)) {
    const std::int64_t n = piece.end - piece.begin;
    file.pread_all(chunk.data(), n * 4, (section * count + piece.begin) * 4);
    crc = crc32c(chunk.data(), n * 4, crc);
    if (piece.ends_chunk) {
      check_chunk_crc(path, meta, section, what, piece, crc);
      crc = 0;
    }
    visit(piece.begin, chunk.data(), n);
  }
}

}  // namespace

const char* safetensors_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat64:
      return "F64";
    case DType::kFloat32:
      break;
  }
  return "F32";
}

std::string safetensors_prefix(std::vector<SafetensorsEntry>& entries) {
  // nlohmann's ordered_json keeps the entries in data order, easier to read than sorted keys.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::int64_t cursor = 0;
  for (SafetensorsEntry& e : entries) {
    e.begin = cursor;
    e.end = cursor + e.numel * static_cast<std::int64_t>(size_of(e.dtype));
    cursor = e.end;
    header[e.name] = {{"dtype", safetensors_dtype(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string json = header.dump();
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');
  std::string prefix(8, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return prefix + json;
}

std::vector<SafetensorsEntry> read_safetensors_header(const FileHandle& file,
                                                      std::int64_t* data_start) {
  const std::string& path = file.path();
  const std::int64_t size = file.size();
  if (size < 8) bad_file(path, "is " + std::to_string(size) + " bytes, too short for a header");
  unsigned char length_bytes[8];
  file.pread_all(length_bytes, 8, 0);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length_bytes[i];
  if (n > kMaxHeaderBytes || static_cast<std::int64_t>(n) > size - 8) {
    bad_file(path, "header length " + std::to_string(n) + " does not fit the file of " +
                       std::to_string(size) + " bytes (truncated or not safetensors)");
  }
  std::string text(n, '\0');
  file.pread_all(text.data(), n, 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) bad_file(path, "header is not a JSON object");
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    SafetensorsEntry e;
    e.name = name;
    try {
      const std::string dtype = value.at("dtype").get<std::string>();
      if (dtype == "F32") {
        e.dtype = DType::kFloat32;
      } else if (dtype == "F16") {
        e.dtype = DType::kFloat16;
      } else if (dtype == "BF16") {
        e.dtype = DType::kBFloat16;
      } else if (dtype == "F64") {
        e.dtype = DType::kFloat64;
      } else {
        bad_file(path, "tensor '" + name + "' has dtype " + dtype +
                           "; zeroshard reads F32, F64, F16 and BF16");
      }
      e.shape = value.at("shape").get<std::vector<std::int64_t>>();
      const auto offsets = value.at("data_offsets").get<std::vector<std::int64_t>>();
      if (offsets.size() != 2) bad_file(path, "tensor '" + name + "': data_offsets needs 2 values");
      e.begin = offsets[0];
      e.end = offsets[1];
    } catch (const nlohmann::json::exception& ex) {
      bad_file(path, "tensor '" + name + "': " + ex.what());
    }
    e.numel = 1;
    for (std::int64_t d : e.shape) {
      if (d < 0 || (d > 0 && e.numel > (std::int64_t{1} << 56) / d)) {
        bad_file(path, "tensor '" + name + "' has an invalid shape");
      }
      e.numel *= d;
    }
    if (e.end - e.begin != e.numel * static_cast<std::int64_t>(size_of(e.dtype))) {
      bad_file(path, "tensor '" + name + "' spans bytes [" + std::to_string(e.begin) + ", " +
                         std::to_string(e.end) + "), its dtype and shape need " +
                         std::to_string(e.numel * size_of(e.dtype)));
    }
    entries.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  std::int64_t cursor = 0;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin != cursor) {
      bad_file(path, "tensor '" + e->name + "' starts at byte " + std::to_string(e->begin) +
                         " of the data, expected " + std::to_string(cursor) +
                         " (entries must tile the data)");
    }
    cursor = e->end;
  }
  *data_start = 8 + static_cast<std::int64_t>(n);
  if (*data_start + cursor != size) {
    bad_file(path, "is " + std::to_string(size) + " bytes, its header describes " +
                       std::to_string(*data_start + cursor) +
                       (size < *data_start + cursor ? " (truncated)" : ""));
  }
  return entries;
}

void write_consolidated(const Manifest& m, const std::string& checkpoint_dir,
                        const std::string& out, DType dtype) {
  std::vector<SafetensorsEntry> entries;
  for (const ManifestTensor& t : m.tensors) {
    entries.push_back({.name = t.name, .dtype = dtype, .shape = t.shape, .numel = t.numel});
  }
  const std::string prefix = safetensors_prefix(entries);
  const auto dsize = static_cast<std::int64_t>(size_of(dtype));
  const std::string tmp = out + ".tmp";
  std::error_code ignored;
  std::filesystem::remove(tmp, ignored);
  try {
    FileHandle file = FileHandle::create(tmp);
    file.pwrite_all(prefix.data(), prefix.size(), 0);
    const auto data_start = static_cast<std::int64_t>(prefix.size());
    std::vector<char> converted;
    // Writes the part of every tensor in `order` (increasing offsets in the section streamed)
    // that falls inside [first, first + n); `cursor` skips the tensors already complete.
    const auto write_pieces = [&](const std::vector<std::size_t>& order, std::size_t& cursor,
                                  std::int64_t first, const float* values, std::int64_t n) {
      for (std::size_t k = cursor; k < order.size(); ++k) {
        const ManifestTensor& t = m.tensors[order[k]];
        if (t.offset >= first + n) break;
        const std::int64_t a = std::max(first, t.offset);
        const std::int64_t b = std::min(first + n, t.offset + t.numel);
        if (b > a) {
          converted.resize(static_cast<std::size_t>((b - a) * dsize));
          convert_from_float(values + (a - first), converted.data(), dtype, b - a);
          file.pwrite_all(converted.data(), converted.size(),
                          data_start + entries[order[k]].begin + (a - t.offset) * dsize);
        }
        if (t.offset + t.numel <= first + n && k == cursor) ++cursor;
      }
    };
    std::vector<std::size_t> trainable;
    std::vector<std::size_t> frozen;
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
      (m.tensors[i].trainable ? trainable : frozen).push_back(i);
    }
    std::size_t cursor = 0;
    for (int f = 0; f < m.world_size; ++f) {
      const std::int64_t base = f * m.shard_size;
      stream_section(checkpoint_dir + "/" + m.shards[f].name, m.shards[f], 0, "master weights",
                     m.shard_size, [&](std::int64_t at, const float* values, std::int64_t n) {
                       write_pieces(trainable, cursor, base + at, values, n);
                     });
    }
    if (m.frozen) {
      std::size_t frozen_cursor = 0;
      stream_section(checkpoint_dir + "/" + m.frozen->name, *m.frozen, 0, "frozen parameters",
                     m.frozen_total, [&](std::int64_t at, const float* values, std::int64_t n) {
                       write_pieces(frozen, frozen_cursor, at, values, n);
                     });
    }
    file.close_synced();
    if (std::rename(tmp.c_str(), out.c_str()) != 0) {
      throw IoError("cannot rename " + tmp + " to " + out);
    }
    fsync_directory(std::filesystem::absolute(out).parent_path().string());
  } catch (...) {
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}

}  // namespace zeroshard::detail

namespace zeroshard {

void consolidate_checkpoint(const std::string& dir, const std::string& out, const std::string& tag,
                            DType dtype) {
  const std::string checkpoint = dir + "/" + detail::resolve_tag(dir, tag);
  const detail::Manifest m = detail::read_manifest(checkpoint);
  detail::write_consolidated(m, checkpoint, out, dtype);
}

}  // namespace zeroshard
