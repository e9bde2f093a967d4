// The on-disk format of a sharded checkpoint: the manifest (what rank 0 writes last), the per-rank
// shard files of flat fp32 sections, CRC-32C checksums, and durable file writes (temporary name,
// fsync, rename, fsync of the folder).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "precision/loss_scaler.h"

namespace zeroshard::detail {

/// Bumped whenever a reader of the previous version could misread a new checkpoint. Version 2
/// checksums every 16 MiB chunk of a section instead of the section whole, so that a load at
/// another world size reads only the chunks it needs; version 1 checkpoints still load.
inline constexpr int kCheckpointFormatVersion = 2;

struct ManifestTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  int group = 0;
  bool trainable = true;
  /// Trainable: element offset in the flat layout. Frozen: element offset in frozen.bin.
  std::int64_t offset = 0;
};

struct ManifestGroup {
  std::string name;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

/// One data file: fp32 sections of equal length back to back, each cut into checksummed chunks.
struct ManifestFile {
  std::string name;
  std::int64_t bytes = 0;
  /// Elements per chunk (the last of a section may be shorter); format 1: the section length.
  std::int64_t chunk_elements = 0;
  /// chunk_crc[section][k]: CRC-32C of the section's elements [k, k + 1) * chunk_elements.
  std::vector<std::vector<std::uint32_t>> chunk_crc;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int world_size = 1;
  int stage = 0;
  std::string precision;  ///< the model's dtype when saved: fp32, fp16 or bf16
  std::int64_t alignment = 0;
  std::int64_t unpadded_total = 0;
  std::int64_t padded_total = 0;
  std::int64_t shard_size = 0;  ///< elements per section of each rank file
  std::int64_t frozen_total = 0;
  std::vector<ManifestTensor> tensors;  ///< registration order
  std::vector<ManifestGroup> groups;

  std::string rule;
  int state_count = 0;
  double rule_lr = 0.0;
  double rule_weight_decay = 0.0;
  std::optional<double> rule_beta1;
  std::string scheduler;  ///< the schedule's type, "" when none

  std::int64_t global_step = 0;
  std::int64_t micro_step = 0;
  double lr_override = -1.0;
  double last_grad_norm = 0.0;
  std::optional<LossScalerState> scaler;

  std::vector<ManifestFile> shards;    ///< rank order; sections: master, then each rule state
  std::optional<ManifestFile> frozen;  ///< one section: every frozen parameter, fp32
  std::string user_state;
};

/// Names inside a checkpoint folder.
std::string shard_file_name(int rank);
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kFrozenName = "frozen.bin";
inline constexpr const char* kLatestName = "latest";

std::string manifest_to_json(const Manifest& manifest);
/// Throws CheckpointError naming `path` on malformed JSON, a missing field, or a newer version.
Manifest manifest_from_json(const std::string& text, const std::string& path);

/// Throws UsageError unless `tag` can name a checkpoint folder.
void check_tag(const std::string& tag);
/// `tag`, or the tag `dir/latest` names when `tag` is empty; CheckpointError when there is none.
std::string resolve_tag(const std::string& dir, const std::string& tag);
/// Reads and parses dir/tag/manifest.json; CheckpointError when the checkpoint is incomplete.
Manifest read_manifest(const std::string& checkpoint_dir);

/// Tests of crash safety: the saving process kills itself (SIGKILL) when it reaches the named
/// point of the save ("before_rename": manifest written, folder not yet renamed; "before_latest":
/// checkpoint complete, latest not yet updated). Empty disables it.
void set_checkpoint_kill_point(std::string point);
void checkpoint_point_reached(const char* point);

/// Throws IoError: "`what` `path` (rank r): the errno text", with what to do when the disk is full.
[[noreturn]] void throw_io_error(const std::string& what, const std::string& path);

/// A file descriptor, closed on destruction.
class FileHandle {
 public:
  FileHandle() = default;
  FileHandle(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  FileHandle(FileHandle&& other) noexcept;
  FileHandle& operator=(FileHandle&& other) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  ~FileHandle();

  /// O_CREAT | O_EXCL: never overwrites. IoError naming the path on failure.
  static FileHandle create(const std::string& path);
  static FileHandle open_read(const std::string& path);

  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_; }
  std::int64_t size() const;
  void write_all(const void* data, std::size_t bytes);
  void pwrite_all(const void* data, std::size_t bytes, std::int64_t offset);
  /// Reads exactly `bytes` at `offset`; CheckpointError when the file ends first.
  void pread_all(void* data, std::size_t bytes, std::int64_t offset) const;
  void sync();
  /// fsync then close, reporting either failure.
  void close_synced();

 private:
  int fd_ = -1;
  std::string path_;
};

void fsync_directory(const std::string& path);
/// Writes `content` to `path` durably: path.tmp, fsync, rename over `path`, fsync the folder.
void write_file_durably(const std::string& path, const std::string& content);

/// A run of at most kIoChunk elements of a section, inside one checksummed chunk.
struct ReadPiece {
  std::int64_t begin = 0;  ///< element offsets in the section
  std::int64_t end = 0;
  std::int64_t chunk = 0;
  bool ends_chunk = false;  ///< the chunk's checksum is complete after this piece
};
/// The pieces, in file order, that cover every checksummed chunk of a section of
/// `section_elements` that holds part of its elements [lo, hi).
std::vector<ReadPiece> read_pieces(const ManifestFile& file, std::int64_t section_elements,
                                   std::int64_t lo, std::int64_t hi);
/// CheckpointError naming the file, the section (`what` it holds) and the chunk unless `crc` is
/// the manifest's checksum of that chunk.
void check_chunk_crc(const std::string& path, const ManifestFile& file, int section,
                     const std::string& what, const ReadPiece& piece, std::uint32_t crc);

/// Reads fp32 sections of a checkpoint's rank files over any flat range, checking every chunk it
/// touches against the manifest's checksum (a touched chunk is read whole for that).
class ShardReader {
 public:
  ShardReader(const Manifest& manifest, std::string checkpoint_dir);
  /// Opens every rank file that holds part of [lo, hi) and checks its size.
  void check_files(std::int64_t lo, std::int64_t hi) const;
  /// Elements [lo, hi) of `section` (0 master, 1 + k state k) into `out`; positions past the
  /// saved padded total are zero.
  void read(int section, std::int64_t lo, std::int64_t hi, float* out) const;

 private:
  const Manifest& manifest_;
  std::string dir_;
};

/// Reads one section of a file whole, checking its checksum (frozen.bin).
std::vector<float> read_checked_section(const std::string& path, const ManifestFile& file,
                                        int section, std::int64_t count);

}  // namespace zeroshard::detail
