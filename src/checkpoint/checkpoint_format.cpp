// Checkpoint manifest (JSON), CRC-32C, durable writes and the checked reading of shard sections.
#include "checkpoint/checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>  // nlohmann::json
#include <optional>
#include <sstream>
#include <utility>

#include "checkpoint/direct_io.h"
#include "layout/shape.h"  // kMaxElements
#include "util/check.h"
#include "util/crc32c.h"
#include "util/text.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {

namespace {

std::string rank_suffix() {
  const int rank = rank_for_messages();
  return rank >= 0 ? " (rank " + std::to_string(rank) + ")" : "";
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw CheckpointError("checkpoint file " + path + rank_suffix() + ": " + what);
}

const nlohmann::json& present(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) {
    throw CheckpointError("checkpoint manifest " + path + ": field '" + key +
                          "' is missing; the file is not a zeroshard manifest or is damaged");
  }
  return j.at(key);
}

// Strings, booleans, doubles and sections; integers go through integer_field().
template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& path) {
  const nlohmann::json& value = present(j, key, path);
  try {
    return value.get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint manifest " + path + ": field '" + key + "': " + e.what());
  }
}

// Bounds of the integers a manifest holds, so that nothing computed from them overflows: element
// counts and offsets within the kMaxElements an engine lays out at most, file sizes within 2^62
// bytes, step counters within 2^53 (exact in the doubles that schedules and bias corrections
// compute with, and far from wrapping when the next step adds one).
constexpr std::int64_t kMaxSteps = std::int64_t{1} << 53;
constexpr std::int64_t kMaxFileBytes = std::int64_t{1} << 62;
constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr std::int64_t kMaxCrc = std::numeric_limits<std::uint32_t>::max();

// `value` of field `key` as an integer in [min, max]: a JSON integer, not 1.5, true or "1".
std::int64_t integer_in(const nlohmann::json& value, const char* key, const std::string& path,
                        std::int64_t min, std::int64_t max) {
  bool fits = value.is_number_integer();
  if (fits && value.is_number_unsigned()) {
    fits = value.get<std::uint64_t>() <= static_cast<std::uint64_t>(max) &&
           static_cast<std::int64_t>(value.get<std::uint64_t>()) >= min;
  } else if (fits) {
    fits = value.get<std::int64_t>() >= min && value.get<std::int64_t>() <= max;
  }
  if (!fits) {
    throw CheckpointError("checkpoint manifest " + path + ": field '" + key + "': got " +
                          printable_text(value.dump()) + ", expected an integer " +
                          std::to_string(min) + ".." + std::to_string(max) +
                          "; the file is damaged or was edited");
  }
  return value.is_number_unsigned() ? static_cast<std::int64_t>(value.get<std::uint64_t>())
                                    : value.get<std::int64_t>();
}

std::int64_t integer_field(const nlohmann::json& j, const char* key, const std::string& path,
                           std::int64_t min, std::int64_t max) {
  return integer_in(present(j, key, path), key, path, min, max);
}

// An array of integers in [min, max] in field `key` (`list` is the array, or one of its rows).
std::vector<std::int64_t> integer_list(const nlohmann::json& list, const char* key,
                                       const std::string& path, std::int64_t min,
                                       std::int64_t max) {
  if (!list.is_array()) {
    throw CheckpointError("checkpoint manifest " + path + ": field '" + key + "': got " +
                          printable_text(list.dump()) +
                          ", expected an array of integers; the file is damaged or was edited");
  }
  std::vector<std::int64_t> values;
  for (const nlohmann::json& value : list) values.push_back(integer_in(value, key, path, min, max));
  return values;
}

std::vector<std::uint32_t> crc_list(const nlohmann::json& list, const char* key,
                                    const std::string& path) {
  std::vector<std::uint32_t> crcs;
  for (std::int64_t crc : integer_list(list, key, path, 0, kMaxCrc)) {
    crcs.push_back(static_cast<std::uint32_t>(crc));
  }
  return crcs;
}

nlohmann::json file_to_json(const ManifestFile& f) {
  return {{"name", f.name},
          {"bytes", f.bytes},
          {"chunk_elements", f.chunk_elements},
          {"chunk_crc32c", f.chunk_crc}};
}

// `section_elements`: the length of each of the file's sections, which format 1 checksums whole.
ManifestFile file_from_json(const nlohmann::json& j, const std::string& path, int version,
                            std::int64_t section_elements) {
  ManifestFile f;
  f.name = field<std::string>(j, "name", path);
  f.bytes = integer_field(j, "bytes", path, 0, kMaxFileBytes);
  if (version == 1) {
    f.chunk_elements = section_elements;
    for (std::uint32_t crc : crc_list(present(j, "section_crc32c", path), "section_crc32c", path)) {
      f.chunk_crc.push_back({crc});
    }
  } else {
    f.chunk_elements = integer_field(j, "chunk_elements", path, 1, kMaxElements);
    const nlohmann::json& sections = present(j, "chunk_crc32c", path);
    if (!sections.is_array()) crc_list(sections, "chunk_crc32c", path);  // throws, naming it
    for (const nlohmann::json& section : sections) {
      f.chunk_crc.push_back(crc_list(section, "chunk_crc32c", path));
    }
  }
  return f;
}

// Whether `f` holds `sections` sections of `section_elements`, each with a checksum per chunk.
// Divided rather than multiplied: the product of the manifest's numbers could overflow.
bool fits(const ManifestFile& f, std::size_t sections, std::int64_t section_elements) {
  const auto section_bytes = static_cast<std::int64_t>(sections) * 4;
  if (f.chunk_elements <= 0 || f.chunk_crc.size() != sections || f.bytes % section_bytes != 0 ||
      f.bytes / section_bytes != section_elements) {
    return false;
  }
  const std::int64_t chunks = (section_elements + f.chunk_elements - 1) / f.chunk_elements;
  return std::all_of(f.chunk_crc.begin(), f.chunk_crc.end(), [&](const auto& crcs) {
    return static_cast<std::int64_t>(crcs.size()) == chunks;
  });
}

}  // namespace

void throw_io_error(const std::string& what, const std::string& path) {
  const int error = errno;
  std::string message = what + " " + path + rank_suffix() + ": " + std::strerror(error);
  if (error == ENOSPC || error == EDQUOT) {
    message +=
        "; free space there or save to another folder (the previous checkpoint stays the "
        "latest)";
  }
  throw IoError(message);
}

std::string shard_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.bin", rank);
  return name;
}

std::string manifest_to_json(const Manifest& m) {
  nlohmann::json j;
  j["format_version"] = m.format_version;
  j["world_size"] = m.world_size;
  j["stage"] = m.stage;
  j["precision"] = m.precision;
  j["layout"] = {{"alignment", m.alignment},
                 {"unpadded_total", m.unpadded_total},
                 {"padded_total", m.padded_total},
                 {"shard_size", m.shard_size},
                 {"frozen_total", m.frozen_total}};
  nlohmann::json tensors = nlohmann::json::array();
  for (const ManifestTensor& t : m.tensors) {
    tensors.push_back({{"name", t.name},
                       {"shape", t.shape},
                       {"numel", t.numel},
                       {"dtype", "F32"},
                       {"group", t.group},
                       {"trainable", t.trainable},
                       {"offset", t.offset}});
  }
  j["tensors"] = tensors;
  nlohmann::json groups = nlohmann::json::array();
  for (const ManifestGroup& g : m.groups) {
    nlohmann::json group = {{"name", g.name}};
    if (g.lr) group["lr"] = *g.lr;
    if (g.weight_decay) group["weight_decay"] = *g.weight_decay;
    groups.push_back(group);
  }
  j["groups"] = groups;
  nlohmann::json rule = {{"name", m.rule},
                         {"state_count", m.state_count},
                         {"lr", m.rule_lr},
                         {"weight_decay", m.rule_weight_decay}};
  if (m.rule_beta1) rule["beta1"] = *m.rule_beta1;
  j["rule"] = rule;
  j["scheduler"] = m.scheduler;
  j["global_step"] = m.global_step;
  j["micro_step"] = m.micro_step;
  j["lr_override"] = m.lr_override;
  j["last_grad_norm"] = m.last_grad_norm;
  if (m.scaler) {
    j["loss_scaler"] = {{"scale", m.scaler->scale},
                        {"iterations_since_overflow", m.scaler->iterations_since_overflow},
                        {"hysteresis_left", m.scaler->hysteresis_left},
                        {"overflows", m.scaler->overflows},
                        {"iteration", m.scaler->iteration}};
  }
  nlohmann::json shards = nlohmann::json::array();
  for (const ManifestFile& f : m.shards) shards.push_back(file_to_json(f));
  j["shards"] = shards;
  if (m.frozen) j["frozen"] = file_to_json(*m.frozen);
  j["user"] = m.user_state;
  return j.dump(1) + "\n";
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint manifest " + path + " is not valid JSON (" + e.what() +
                          "); the file is damaged");
  }
  Manifest m;
  m.format_version = static_cast<int>(integer_field(j, "format_version", path, 1, kMaxInt));
  if (m.format_version > kCheckpointFormatVersion) {
    throw CheckpointError("checkpoint manifest " + path + ": format_version " +
                          std::to_string(m.format_version) + ", this zeroshard reads 1.." +
                          std::to_string(kCheckpointFormatVersion) +
                          "; load it with the newer zeroshard that wrote it");
  }
  m.world_size = static_cast<int>(integer_field(j, "world_size", path, 1, kMaxInt));
  m.stage = static_cast<int>(integer_field(j, "stage", path, 0, 3));
  m.precision = field<std::string>(j, "precision", path);
  const nlohmann::json layout = field<nlohmann::json>(j, "layout", path);
  m.alignment = integer_field(layout, "alignment", path, 0, kMaxElements);
  m.unpadded_total = integer_field(layout, "unpadded_total", path, 0, kMaxElements);
  m.padded_total = integer_field(layout, "padded_total", path, 0, kMaxElements);
  m.shard_size = integer_field(layout, "shard_size", path, 0, kMaxElements);
  m.frozen_total = integer_field(layout, "frozen_total", path, 0, kMaxElements);
  for (const nlohmann::json& t : field<nlohmann::json>(j, "tensors", path)) {
    ManifestTensor tensor;
    tensor.name = field<std::string>(t, "name", path);
    tensor.shape = integer_list(present(t, "shape", path), "shape", path, 0, kMaxElements);
    tensor.numel = integer_field(t, "numel", path, 0, kMaxElements);
    tensor.group = static_cast<int>(integer_field(t, "group", path, 0, kMaxInt));
    tensor.trainable = field<bool>(t, "trainable", path);
    tensor.offset = integer_field(t, "offset", path, 0, kMaxElements);
    m.tensors.push_back(std::move(tensor));
  }
  for (const nlohmann::json& g : field<nlohmann::json>(j, "groups", path)) {
    ManifestGroup group;
    group.name = field<std::string>(g, "name", path);
    if (g.contains("lr")) group.lr = field<double>(g, "lr", path);
    if (g.contains("weight_decay")) group.weight_decay = field<double>(g, "weight_decay", path);
    m.groups.push_back(std::move(group));
  }
  const nlohmann::json rule = field<nlohmann::json>(j, "rule", path);
  m.rule = field<std::string>(rule, "name", path);
  m.state_count = static_cast<int>(integer_field(rule, "state_count", path, 0, kMaxInt - 1));
  m.rule_lr = field<double>(rule, "lr", path);
  m.rule_weight_decay = field<double>(rule, "weight_decay", path);
  if (rule.contains("beta1")) m.rule_beta1 = field<double>(rule, "beta1", path);
  m.scheduler = field<std::string>(j, "scheduler", path);
  m.global_step = integer_field(j, "global_step", path, 0, kMaxSteps);
  m.micro_step = integer_field(j, "micro_step", path, 0, kMaxSteps);
  m.lr_override = field<double>(j, "lr_override", path);
  m.last_grad_norm = field<double>(j, "last_grad_norm", path);
  if (j.contains("loss_scaler")) {
    const nlohmann::json s = j.at("loss_scaler");
    m.scaler = LossScalerState{
        .scale = field<double>(s, "scale", path),
        .iterations_since_overflow =
            integer_field(s, "iterations_since_overflow", path, 0, kMaxSteps),
        .hysteresis_left = static_cast<int>(integer_field(s, "hysteresis_left", path, 0, kMaxInt)),
        .overflows = integer_field(s, "overflows", path, 0, kMaxSteps),
        .iteration = integer_field(s, "iteration", path, 0, kMaxSteps)};
  }
  for (const nlohmann::json& f : field<nlohmann::json>(j, "shards", path)) {
    m.shards.push_back(file_from_json(f, path, m.format_version, m.shard_size));
  }
  if (j.contains("frozen")) {
    m.frozen = file_from_json(j.at("frozen"), path, m.format_version, m.frozen_total);
  }
  m.user_state = field<std::string>(j, "user", path);
  const std::size_t sections = 1 + static_cast<std::size_t>(m.state_count);
  bool consistent = static_cast<int>(m.shards.size()) == m.world_size &&
                    m.padded_total % m.world_size == 0 &&
                    m.padded_total / m.world_size == m.shard_size &&
                    (!m.frozen || fits(*m.frozen, 1, m.frozen_total));
  for (const ManifestFile& f : m.shards) consistent = consistent && fits(f, sections, m.shard_size);
  if (!consistent) {
    throw CheckpointError("checkpoint manifest " + path +
                          ": the shard list does not match world_size " +
                          std::to_string(m.world_size) + " and the layout; the file is damaged");
  }
  return m;
}

namespace {

// Why `tag` cannot name a checkpoint folder inside the directory, or "" when it can: `latest`
// holds one line, and the folder must be dir/tag itself.
std::string tag_problem(const std::string& tag) {
  if (tag.empty()) return "is empty";
  for (std::size_t i = 0; i < tag.size(); ++i) {
    const auto c = static_cast<unsigned char>(tag[i]);
    const std::string at = " at position " + std::to_string(i);
    if (c == '\n') return "holds a newline (\\n)" + at;
    if (c == '\r') return "holds a carriage return (\\r)" + at;
    if (c < 0x20 || c == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      return std::string("holds a control character (0x") + kHex[c >> 4] + kHex[c & 0xf] + ")" + at;
    }
    if (c == '/') return "holds a path separator '/'" + at;
  }
  if (tag == ".") return "is '.', the checkpoint directory itself";
  if (tag == "..") return "is '..', the parent folder";
  if (tag == kLatestName) {
    return "is 'latest', the name of the file that points at the latest checkpoint";
  }
  if (tag.size() > 4 && tag.ends_with(".tmp")) {
    return "ends in '.tmp', which marks a save that never completed";
  }
  return "";
}

constexpr const char* kTagRule =
    "a tag names one folder inside the checkpoint directory: printable characters without '/', "
    "not '.', '..' or 'latest', not ending in '.tmp'";

}  // namespace

void check_tag(const std::string& tag) {
  const std::string problem = tag_problem(tag);
  if (!problem.empty()) {
    throw UsageError("checkpoint tag \"" + printable_text(tag) + "\" " + problem + "; " + kTagRule);
  }
}

std::string resolve_tag(const std::string& dir, const std::string& tag) {
  if (!tag.empty()) {
    check_tag(tag);
    return tag;
  }
  const std::string latest = dir + "/" + kLatestName;
  std::ifstream in(latest, std::ios::binary);
  if (!in) {
    throw CheckpointError("no checkpoint to load in " + dir + ": " + latest +
                          " does not exist (no save has completed there); pass a tag or check "
                          "the folder");
  }
  // The tag and a newline, as save_checkpoint writes it; DeepSpeed writes no newline.
  std::string name((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (name.ends_with('\n')) name.pop_back();
  const std::string problem = tag_problem(name);
  if (!problem.empty()) {
    throw CheckpointError("checkpoint pointer " + latest + ": the tag it names, \"" +
                          printable_text(name) + "\", " + problem + "; " + kTagRule +
                          ". The file was edited or damaged: write the tag of a checkpoint in " +
                          dir + " into it, or pass the tag to load");
  }
  return name;
}

Manifest read_manifest(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/" + kManifestName;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string hint = " does not exist";
    if (std::filesystem::exists(checkpoint_dir + ".tmp")) {
      hint += " (" + checkpoint_dir + ".tmp is a save that never completed; it is never loaded)";
    } else if (std::filesystem::exists(checkpoint_dir)) {
      hint += " (the folder has no completion mark; it is not a complete checkpoint)";
    }
    throw CheckpointError("checkpoint manifest " + path + hint);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return manifest_from_json(text.str(), path);
}

namespace {
std::string& kill_point() {
  static std::string point;
  return point;
}
}  // namespace

void set_checkpoint_kill_point(std::string point) { kill_point() = std::move(point); }

void checkpoint_point_reached(const char* point) {
  if (!kill_point().empty() && kill_point() == point) std::raise(SIGKILL);
}

// --- files ---------------------------------------------------------------------------------------

FileHandle::FileHandle(FileHandle&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FileHandle& FileHandle::operator=(FileHandle&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

FileHandle FileHandle::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_io_error("cannot create", path);
  return FileHandle(fd, path);
}

FileHandle FileHandle::open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      throw CheckpointError("checkpoint file " + path + rank_suffix() +
                            " is missing; the checkpoint is incomplete");
    }
    throw_io_error("cannot open", path);
  }
  return FileHandle(fd, path);
}

std::int64_t FileHandle::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_io_error("cannot stat", path_);
  return st.st_size;
}

void FileHandle::write_all(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min<std::size_t>(bytes, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error("cannot write", path_);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void FileHandle::pwrite_all(const void* data, std::size_t bytes, std::int64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, std::min<std::size_t>(bytes, std::size_t{1} << 30), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error("cannot write", path_);
    }
    p += n;
    offset += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void FileHandle::pread_all(void* data, std::size_t bytes, std::int64_t offset) const {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<std::size_t>(bytes, std::size_t{1} << 30), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error("cannot read", path_);
    }
    if (n == 0) corrupt(path_, "ends at byte " + std::to_string(offset) + ": it is truncated");
    p += n;
    offset += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void FileHandle::sync() {
  // Never retried: after a failed fsync the kernel may have dropped the dirty pages.
  if (::fsync(fd_) != 0) throw_io_error("cannot fsync", path_);
}

void FileHandle::close_synced() {
  sync();
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw_io_error("cannot close", path_);
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error("cannot open folder", path);
  FileHandle dir(fd, path);
  dir.sync();
}

void write_file_durably(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  std::error_code ignored;
  std::filesystem::remove(tmp, ignored);  // a leftover of a crashed save
  FileHandle file = FileHandle::create(tmp);
  file.write_all(content.data(), content.size());
  file.close_synced();
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw_io_error("cannot rename " + tmp + " to", path);
  fsync_directory(std::filesystem::path(path).parent_path().string());
}

// --- reading -------------------------------------------------------------------------------------

ShardReader::ShardReader(const Manifest& manifest, std::string checkpoint_dir)
    : manifest_(manifest), dir_(std::move(checkpoint_dir)) {}

void ShardReader::check_files(std::int64_t lo, std::int64_t hi) const {
  const std::int64_t s = manifest_.shard_size;
  hi = std::min(hi, manifest_.padded_total);
  for (std::int64_t f = lo / s; f < manifest_.world_size && f * s < hi; ++f) {
    const ManifestFile& file = manifest_.shards[f];
    const std::string path = dir_ + "/" + file.name;
    const std::int64_t size = FileHandle::open_read(path).size();
    if (size != file.bytes) {
      corrupt(path, "is " + std::to_string(size) + " bytes, the manifest says " +
                        std::to_string(file.bytes) + (size < file.bytes ? " (truncated)" : ""));
    }
  }
}

namespace {

// One file read front to back. Aligned ranges go through O_DIRECT: the drive writes straight
// into the caller's memory, with no copy out of the page cache (the CPU is then free for the
// checksum) and no cache filled with a shard that is read once. Anything else, or a file system
// that refuses O_DIRECT, goes through the page cache with sequential read-ahead.
class SequentialReader {
 public:
  explicit SequentialReader(const std::string& path) : buffered_(FileHandle::open_read(path)) {
    ::posix_fadvise(buffered_.fd(), 0, 0, POSIX_FADV_SEQUENTIAL);  // advice: failure is harmless
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd >= 0) direct_.emplace(fd, path);
  }

  /// Exactly `bytes` at `offset` into `data`; CheckpointError when the file ends first.
  void read(void* data, std::size_t bytes, std::int64_t offset) {
    auto* p = static_cast<char*>(data);
    if (direct_ && direct_works_.load() && offset % kDirectAlign == 0 &&
        reinterpret_cast<std::uintptr_t>(p) % kDirectAlign == 0) {
      const std::size_t aligned = bytes / kDirectAlign * kDirectAlign;
      const std::size_t done = read_direct(p, aligned, offset);
      p += done;
      offset += static_cast<std::int64_t>(done);
      bytes -= done;
    }
    // The unaligned tail, a short direct read at the end of a truncated file (reported here), or
    // everything when O_DIRECT is unavailable.
    buffered_.pread_all(p, bytes, offset);
  }

 private:
  // Returns how many bytes it read; stops early at the end of the file, and for good when the
  // file system refuses O_DIRECT reads (EINVAL).
  std::size_t read_direct(char* p, std::size_t bytes, std::int64_t offset) {
    std::size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(direct_->fd(), p + done,
                                std::min<std::size_t>(bytes - done, std::size_t{1} << 30),
                                offset + static_cast<std::int64_t>(done));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EINVAL) throw_io_error("cannot read", buffered_.path());
        direct_works_.store(false);
        break;
      }
      done += static_cast<std::size_t>(n);
      if (n == 0 || n % kDirectAlign != 0) break;
    }
    return done;
  }

  FileHandle buffered_;
  std::optional<FileHandle> direct_;  ///< empty when the file system refuses O_DIRECT opens
  /// False once it refused a direct read; two reads may be in flight.
  std::atomic<bool> direct_works_{true};
};

// Writes one byte of each page of `bytes` at `data`, which is about to be overwritten.
void touch_pages(float* data, std::int64_t bytes) {
  constexpr std::int64_t kPage = 4096;
  auto* p = reinterpret_cast<volatile char*>(data);
  for (std::int64_t at = 0; at < bytes; at += kPage) p[at] = 0;
}

}  // namespace

std::vector<ReadPiece> read_pieces(const ManifestFile& file, std::int64_t section_elements,
                                   std::int64_t lo, std::int64_t hi) {
  std::vector<ReadPiece> pieces;
  const std::int64_t size = file.chunk_elements;
  hi = std::min(hi, section_elements);
  for (std::int64_t chunk = std::max<std::int64_t>(lo, 0) / size; chunk * size < hi; ++chunk) {
    const std::int64_t chunk_end = std::min((chunk + 1) * size, section_elements);
    for (std::int64_t begin = chunk * size; begin < chunk_end; begin += kIoChunk) {
      const std::int64_t end = std::min(begin + kIoChunk, chunk_end);
      pieces.push_back({begin, end, chunk, end == chunk_end});
    }
  }
  return pieces;
}

void check_chunk_crc(const std::string& path, const ManifestFile& file, int section,
                     const std::string& what, const ReadPiece& piece, std::uint32_t crc) {
  const std::uint32_t expected = file.chunk_crc[section][piece.chunk];
  if (crc == expected) return;
  corrupt(path, "section " + std::to_string(section) + " (" + what + "), elements [" +
                    std::to_string(piece.chunk * file.chunk_elements) + ", " +
                    std::to_string(piece.end) + "), has checksum " + std::to_string(crc) +
                    ", the manifest says " + std::to_string(expected) + ": the file is damaged");
}

void ShardReader::read(int section, std::int64_t lo, std::int64_t hi, float* out) const {
  const std::int64_t s = manifest_.shard_size;
  const std::int64_t saved_hi = std::min(hi, manifest_.padded_total);
  if (saved_hi < hi)
    std::fill(out + std::max<std::int64_t>(0, saved_hi - lo), out + (hi - lo), 0.0f);
  const std::string what =
      section == 0 ? std::string("master weights") : "rule state " + std::to_string(section - 1);
  // Bounce slots: the reader fills one while the caller checks the other.
  constexpr std::int64_t kSlots = 2;
  std::array<AlignedChunk, kSlots> bounce;
  for (std::int64_t f = lo / s; f < manifest_.world_size && f * s < saved_hi; ++f) {
    const ManifestFile& file = manifest_.shards[f];
    const std::string path = dir_ + "/" + file.name;
    SequentialReader reader(path);
    const std::int64_t file_lo = f * s;
    const std::int64_t base = static_cast<std::int64_t>(section) * s * 4;
    // Every chunk that holds part of [lo, hi) is read whole, to check its checksum, and only that
    // part kept. When the chunks lie inside the range they are read straight into place, else
    // through the bounce slots.
    const std::vector<ReadPiece> pieces = read_pieces(file, s, lo - file_lo, saved_hi - file_lo);
    const std::int64_t count = static_cast<std::int64_t>(pieces.size());
    const bool direct =
        file_lo + pieces.front().begin >= lo && file_lo + pieces.back().end <= saved_hi;
    if (!direct && !bounce[0]) {
      for (AlignedChunk& b : bounce) b = aligned_chunk(kIoChunk, "checkpoint read buffer");
    }
    const auto piece_at = [&](std::int64_t k) {
      return direct ? out + (file_lo + pieces[k].begin - lo) : bounce[k % kSlots].get();
    };
    const auto length = [&](std::int64_t k) { return pieces[k].end - pieces[k].begin; };
    // Three threads, so that the drive never waits for the CPU: a mapper writes one byte of
    // each page of the destination ahead of the reads (fresh memory faults page by page as the
    // kernel zeroes it, and a direct read into unmapped pages would take those faults while the
    // drive waits), the reader reads piece after piece as soon as its pages are mapped and its
    // slot is free, and the caller checksums each piece once it is read. Counters say how many
    // pieces each has finished; a failed read sets `read` past every piece.
    std::atomic<std::int64_t> mapped{direct ? 0 : count};
    std::atomic<std::int64_t> read{0};
    std::atomic<std::int64_t> checked{0};
    std::atomic<bool> failed{false};
    const auto wait_until = [](std::atomic<std::int64_t>& counter, std::int64_t at_least) {
      for (std::int64_t seen = counter.load(); seen < at_least; seen = counter.load()) {
        counter.wait(seen);
      }
    };
    const auto advance = [](std::atomic<std::int64_t>& counter, std::int64_t to) {
      counter.store(to);
      counter.notify_all();
    };
    // A future's destructor waits for its thread, so nothing outlives a throw.
    std::future<void> mapper;
    if (direct) {
      mapper = std::async(std::launch::async, [&] {
        for (std::int64_t k = 0; k < count && !failed.load(); ++k) {
          touch_pages(piece_at(k), length(k) * 4);
          advance(mapped, k + 1);
        }
      });
    }
    std::future<void> reading = std::async(std::launch::async, [&] {
      try {
        for (std::int64_t k = 0; k < count; ++k) {
          wait_until(mapped, k + 1);
          if (!direct) wait_until(checked, k + 1 - kSlots);
          reader.read(piece_at(k), length(k) * 4, base + pieces[k].begin * 4);
          advance(read, k + 1);
        }
      } catch (...) {
        failed.store(true);
        advance(read, count + 1);
        throw;
      }
    });
    std::uint32_t crc = 0;
    for (std::int64_t k = 0; k < count; ++k) {
      wait_until(read, k + 1);
      if (failed.load()) reading.get();  // rethrows the read's error
      const ReadPiece& piece = pieces[k];
      const float* values = piece_at(k);
      crc = crc32c(values, length(k) * 4, crc);
      if (piece.ends_chunk) {
        check_chunk_crc(path, file, section, what, piece, crc);
        crc = 0;
      }
      if (!direct) {
        const std::int64_t a = std::max(lo, file_lo + piece.begin);
        const std::int64_t b = std::min(saved_hi, file_lo + piece.end);
        if (b > a) {
          std::copy(values + (a - file_lo - piece.begin), values + (b - file_lo - piece.begin),
                    out + (a - lo));
        }
      }
      advance(checked, k + 1);
    }
    reading.get();
  }
}

std::vector<float> read_checked_section(const std::string& path, const ManifestFile& file,
                                        int section, std::int64_t count) {
  const FileHandle handle = FileHandle::open_read(path);
  const std::int64_t size = handle.size();
  if (size != file.bytes) {
    corrupt(path, "is " + std::to_string(size) + " bytes, the manifest says " +
                      std::to_string(file.bytes) + (size < file.bytes ? " (truncated)" : ""));
  }
  std::vector<float> values(static_cast<std::size_t>(count));
  handle.pread_all(values.data(), count * 4, section * count * 4);
  std::uint32_t crc = 0;
  for (const ReadPiece& piece : read_pieces(file, count, 0, count)) {
    crc = crc32c(values.data() + piece.begin, (piece.end - piece.begin) * 4, crc);
    if (piece.ends_chunk) {
      check_chunk_crc(path, file, section, "frozen parameters", piece, crc);
      crc = 0;
    }
  }
  return values;
}

}  // namespace zeroshard::detail
