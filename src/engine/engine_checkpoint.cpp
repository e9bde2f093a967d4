// Sharded checkpoints of the engine: each rank writes the fp32 master and rule states of its
// shard, rank 0 the frozen parameters, the manifest and then `latest`; loading reads any world
// size's shards by flat offset, checks everything first and changes the engine only after every
// rank has succeeded.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_writer.h"
#include "engine/engine_state.h"
#include "layout/shape.h"
#include "precision/half_conversion.h"
#include "util/check.h"
#include "util/log.h"

namespace zeroshard::detail {

namespace {

std::string message_of(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// Where a save writes: the tag's folder, and the temporary folder it is renamed from once whole.
struct SavePaths {
  std::string dir;
  std::string tag;
  std::string final_dir = dir + "/" + tag;
  std::string tmp_dir = final_dir + ".tmp";
};

// Rank 0's part of a save's start: a fresh temporary folder, for a tag not used yet.
std::exception_ptr prepare_save_folder(const SavePaths& paths) {
  try {
    std::filesystem::create_directories(paths.dir);
    if (std::filesystem::exists(paths.final_dir)) {
      throw CheckpointError("checkpoint " + paths.final_dir +
                            " already exists; save under a new tag or remove it first");
    }
    std::filesystem::remove_all(paths.tmp_dir);  // a save that crashed before its commit
    std::filesystem::create_directory(paths.tmp_dir);
  } catch (const std::filesystem::filesystem_error& e) {
    return std::make_exception_ptr(
        IoError("cannot prepare checkpoint folder " + paths.tmp_dir + " (rank 0): " + e.what()));
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// This rank's shard of the flat layout, every array of the optimizer shard (master weights, then
// the rule's states) one section each; the checksums of each section's chunks. At stage 0 the
// rank owns everything but writes only its shard's range, so that the files do not depend on the
// stage.
std::vector<std::vector<std::uint32_t>> write_optimizer_shard(const std::string& path,
                                                              OptimizerShard& optimizer,
                                                              std::int64_t lo, std::int64_t hi,
                                                              int rank) {
  std::vector<std::vector<std::uint32_t>> crcs(optimizer.array_count());
  ShardWriter file(path + ".tmp");
  for (int a = 0; a < optimizer.array_count(); ++a) {
    crcs[a] = file.write_section(hi - lo, [&](float* out, std::int64_t first, std::int64_t n) {
      if (const float* values = optimizer.host_view(a, lo + first, n)) {
        std::memcpy(out, values, static_cast<std::size_t>(n) * sizeof(float));
      } else {
        optimizer.read_owned(a, lo + first, out, n);
      }
    });
  }
  file.finish();
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    throw IoError("cannot rename " + path + ".tmp (rank " + std::to_string(rank) + ")");
  }
  return crcs;
}

// The frozen parameters, whole, widened to fp32 (exact): the values the model reads, so under
// zero_quantized_nontrainable_weights the decoded ones, `total` of them laid end to end. One
// section; its chunks' checksums.
std::vector<std::uint32_t> write_frozen_parameters(const std::string& path,
                                                   const std::vector<ParamInfo>& params,
                                                   std::int64_t total,
                                                   ParamCoordinator& coordinator) {
  std::vector<float> frozen(static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    if (!p.trainable) coordinator.read_frozen(static_cast<int>(i), frozen.data() + p.frozen_offset);
  }
  ShardWriter file(path);
  std::vector<std::uint32_t> crc =
      file.write_section(static_cast<std::int64_t>(frozen.size()),
                         [&](float* out, std::int64_t first, std::int64_t n) {
                           std::copy_n(frozen.data() + first, n, out);
                         });
  file.finish();
  return crc;
}

// Per array: its chunk count, then the chunks' checksums; read back by shard_entry().
std::string checksum_text(const std::vector<std::vector<std::uint32_t>>& crcs) {
  std::ostringstream text;
  for (const std::vector<std::uint32_t>& array : crcs) {
    text << array.size();
    for (std::uint32_t c : array) text << ' ' << c;
    text << ' ';
  }
  return text.str();
}

ManifestFile shard_entry(int rank, const std::string& checksums, int arrays,
                         std::int64_t shard_size) {
  ManifestFile f{.name = shard_file_name(rank),
                 .bytes = static_cast<std::int64_t>(arrays) * shard_size * 4,
                 .chunk_elements = kIoChunk,
                 .chunk_crc = {}};
  std::istringstream in(checksums);
  std::size_t chunks = 0;
  while (in >> chunks) {
    std::vector<std::uint32_t>& array = f.chunk_crc.emplace_back(chunks);
    for (std::uint32_t& c : array) in >> c;
  }
  return f;
}

// Rank 0's commit, each part durable before the next: the manifest, the folder's rename to its
// tag, then `latest`. A crash at any point leaves the previous checkpoint the latest.
void commit_save(const SavePaths& paths, const Manifest& manifest) {
  try {
    write_file_durably(paths.tmp_dir + "/" + kManifestName, manifest_to_json(manifest));
    fsync_directory(paths.tmp_dir);
    checkpoint_point_reached("before_rename");
    std::filesystem::rename(paths.tmp_dir, paths.final_dir);
    fsync_directory(paths.dir);
    checkpoint_point_reached("before_latest");
    write_file_durably(paths.dir + "/" + kLatestName, paths.tag + "\n");
  } catch (const std::filesystem::filesystem_error& e) {
    throw IoError("cannot commit checkpoint " + paths.final_dir + " (rank 0): " + e.what());
  }
}

}  // namespace

std::string EngineState::failure_on_any_rank(std::exception_ptr failure) {
  const std::vector<std::string> all = all_gather_text(failure ? "!" + message_of(failure) : "");
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) return "rank " + std::to_string(r) + ": " + all[r].substr(1);
  }
  return "";
}

void EngineState::agree_on_failure(std::exception_ptr failure, const char* what) {
  const std::string first = failure_on_any_rank(failure);
  if (failure) std::rethrow_exception(failure);
  if (!first.empty()) throw CheckpointError(std::string(what) + " failed on " + first);
}

void EngineState::save_checkpoint(const std::string& dir, const std::string& tag,
                                  const std::string& user_state) {
  require_finalized();
  check_tag(tag);
  ZEROSHARD_CHECK_USAGE(micro_step_ == 0,
                        "save_checkpoint('" << tag << "') inside a gradient-accumulation window ("
                                            << micro_step_ << " of "
                                            << config_.gradient_accumulation_steps
                                            << " micro-steps done): gradients are not saved; save "
                                               "after the step() that ends the window");
  const SavePaths paths{.dir = dir, .tag = tag};
  agree_on_failure(rank_ == 0 ? prepare_save_folder(paths) : nullptr, "save_checkpoint");

  // Every rank writes its shard; rank 0 also the frozen parameters, once.
  std::exception_ptr failure;
  std::vector<std::vector<std::uint32_t>> shard_crcs;
  std::vector<std::uint32_t> frozen_crc;
  try {
    shard_crcs = write_optimizer_shard(paths.tmp_dir + "/" + shard_file_name(rank_), *optimizer_,
                                       layout_.shard_begin(rank_), layout_.shard_end(rank_), rank_);
    if (rank_ == 0 && frozen_elements_ > 0) {
      frozen_crc = write_frozen_parameters(paths.tmp_dir + "/" + kFrozenName, params_,
                                           frozen_elements_, *coordinator_);
    }
  } catch (...) {
    failure = std::current_exception();
  }

  // Rank 0 learns every rank's checksums, or its failure.
  const std::vector<std::string> all =
      all_gather_text(failure ? "!" + message_of(failure) : checksum_text(shard_crcs));
  if (failure) std::rethrow_exception(failure);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == '!') {
      throw CheckpointError("save_checkpoint failed on rank " + std::to_string(r) + ": " +
                            all[r].substr(1) + "; the previous checkpoint stays the latest");
    }
  }
  if (rank_ == 0) {
    try {
      Manifest manifest = checkpoint_manifest(user_state);
      for (int r = 0; r < world_; ++r) {
        manifest.shards.push_back(
            shard_entry(r, all[r], optimizer_->array_count(), layout_.shard_size()));
      }
      if (manifest.frozen_total > 0) {
        manifest.frozen = ManifestFile{.name = kFrozenName,
                                       .bytes = manifest.frozen_total * 4,
                                       .chunk_elements = kIoChunk,
                                       .chunk_crc = {frozen_crc}};
      }
      commit_save(paths, manifest);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_on_failure(failure, "save_checkpoint");
  ZEROSHARD_LOG(kInfo, "saved checkpoint " << paths.final_dir << " at step " << global_step_);
}

Manifest EngineState::checkpoint_manifest(const std::string& user_state) const {
  Manifest m;
  m.world_size = world_;
  m.stage = stage_;
  m.precision = to_string(dtype_);
  m.alignment = kTensorAlignment;
  m.unpadded_total = layout_.unpadded_total();
  m.padded_total = layout_.padded_total();
  m.shard_size = layout_.shard_size();
  m.frozen_total = frozen_elements_;
  for (const ParamInfo& p : params_) {
    m.tensors.push_back({.name = p.name,
                         .shape = p.shape,
                         .numel = p.numel,
                         .group = p.group,
                         .trainable = p.trainable,
                         .offset = p.trainable ? layout_.offset(p.tensor) : p.frozen_offset});
  }
  for (const GroupInfo& g : groups_) {
    m.groups.push_back({g.options.name, g.options.lr, g.options.weight_decay});
  }
  m.rule = rule_->name();
  m.state_count = rule_->state_count();
  m.rule_lr = rule_->default_lr();
  m.rule_weight_decay = rule_->default_weight_decay();
  m.rule_beta1 = rule_->beta1();
  m.scheduler = scheduler_ ? scheduler_->name() : "";
  m.global_step = global_step_;
  m.micro_step = micro_step_;
  m.lr_override = lr_override_;
  m.last_grad_norm = last_grad_norm_;
  if (scaler_) m.scaler = scaler_->state();
  m.user_state = user_state;
  return m;
}

namespace {

// Throws CheckpointError naming the manifest and the first difference between the checkpoint
// and the engine's registered model and rule.
void check_fits(const Manifest& m, const std::string& path, const std::vector<ParamInfo>& params,
                std::int64_t frozen_elements, const ShardLayout& layout, const UpdateRule& rule,
                const Config& config) {
  const auto mismatch = [&](const std::string& what) {
    throw CheckpointError("checkpoint " + path + " does not fit this engine: " + what);
  };
  // Saves happen between accumulation windows only; a later micro-step is damage.
  if (m.micro_step >= config.gradient_accumulation_steps) {
    mismatch("micro_step " + std::to_string(m.micro_step) + ", expected 0.." +
             std::to_string(config.gradient_accumulation_steps - 1) +
             " (gradient_accumulation_steps " + std::to_string(config.gradient_accumulation_steps) +
             "); the file is damaged");
  }
  if (m.alignment != kTensorAlignment) {
    mismatch("tensor alignment " + std::to_string(m.alignment) + ", this build uses " +
             std::to_string(kTensorAlignment));
  }
  if (m.tensors.size() != params.size()) {
    mismatch("it holds " + std::to_string(m.tensors.size()) + " parameters, the engine has " +
             std::to_string(params.size()) + " registered");
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ManifestTensor& t = m.tensors[i];
    const ParamInfo& p = params[i];
    if (t.name != p.name) {
      mismatch("parameter " + std::to_string(i) + " is '" + t.name + "' in the checkpoint and '" +
               p.name + "' in the engine");
    }
    if (t.shape != p.shape) {
      mismatch("parameter '" + p.name + "' has shape " + format_shape(t.shape) +
               " in the checkpoint and " + format_shape(p.shape) + " in the engine");
    }
    if (t.trainable != p.trainable) {
      mismatch("parameter '" + p.name + "' is " + (t.trainable ? "trainable" : "frozen") +
               " in the checkpoint and " + (p.trainable ? "trainable" : "frozen") +
               " in the engine");
    }
    if (t.trainable && t.offset != layout.offset(p.tensor)) {
      mismatch("parameter '" + p.name + "' sits at flat offset " + std::to_string(t.offset) +
               ", the engine's layout puts it at " + std::to_string(layout.offset(p.tensor)));
    }
  }
  // The frozen section is read whole: its length must be the engine's.
  if (m.frozen_total != frozen_elements) {
    mismatch("it holds " + std::to_string(m.frozen_total) + " frozen elements, the engine has " +
             std::to_string(frozen_elements));
  }
  if (m.rule != rule.name() || m.state_count != rule.state_count()) {
    mismatch("update rule '" + m.rule + "' with " + std::to_string(m.state_count) +
             " state arrays, the engine runs '" + rule.name() + "' with " +
             std::to_string(rule.state_count()));
  }
}

}  // namespace

CheckpointInfo EngineState::load_checkpoint(const std::string& dir, const std::string& tag) {
  require_finalized();
  // Stage 3: every module released, and kept gathered copies dropped (they would be stale).
  coordinator_->release_all_after_step("load_checkpoint()");
  // Nothing below changes the engine until every rank has read and checked its part.
  std::exception_ptr failure;
  CheckpointInfo info;
  Manifest m;
  const int arrays = optimizer_->array_count();
  const std::int64_t lo = optimizer_->owned_begin();
  const std::int64_t count = optimizer_->owned_end() - lo;
  // Each array is staged in a twin of its own buffer that the commit swaps in (no copy), or where
  // the array cannot be replaced whole in host memory that the commit copies from. Neither is
  // zero-filled: the reader writes every element (zeros past the saved layout).
  std::vector<TrackedBuffer> staged(arrays);
  std::vector<bool> swap_in(arrays);
  std::vector<float> frozen;
  std::optional<LossScaler> scaler = scaler_;
  try {
    info.tag = resolve_tag(dir, tag);
    const std::string checkpoint = dir + "/" + info.tag;
    m = read_manifest(checkpoint);
    check_fits(m, checkpoint + "/" + kManifestName, params_, frozen_elements_, layout_, *rule_,
               config_);
    ShardReader reader(m, checkpoint);
    reader.check_files(lo, lo + count);
    for (int a = 0; a < arrays; ++a) {
      staged[a] = optimizer_->staging_for(a);
      swap_in[a] = !staged[a].empty();
      if (!swap_in[a]) {
        staged[a] = TrackedBuffer::uninitialized(
            tracker_, a == 0 ? MemoryCategory::kMasterWeights : MemoryCategory::kOptimizerStates,
            static_cast<std::size_t>(count) * sizeof(float));
      }
      reader.read(a, lo, lo + count, staged[a].as<float>());
    }
    if (m.frozen) {
      frozen =
          read_checked_section(checkpoint + "/" + m.frozen->name, *m.frozen, 0, m.frozen_total);
    }
    for (const ParamInfo& p : params_) {
      if (!p.trainable && p.frozen_offset + p.numel > static_cast<std::int64_t>(frozen.size())) {
        throw CheckpointError("checkpoint " + checkpoint +
                              " holds no values for frozen parameter '" + p.name +
                              "'; the manifest is damaged");
      }
    }
    if (scaler && m.scaler) {
      try {
        scaler->restore(*m.scaler);
      } catch (const UsageError& error) {
        // Values each in range, but not together (more overflows than iterations).
        throw CheckpointError("checkpoint manifest " + checkpoint + "/" + kManifestName + ": " +
                              error.what() + "; the file is damaged or was edited");
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_failure(failure, "load_checkpoint");

  // DeepSpeed's load_from_fp32_weights false: the master starts from the 16-bit weights.
  if (!config_.zero_optimization.load_from_fp32_weights && dtype_ != DType::kFloat32) {
    std::vector<char> rounded(count * dsize_);
    convert_from_float(staged[0].as<float>(), rounded.data(), dtype_, count);
    convert_to_float(rounded.data(), dtype_, staged[0].as<float>(), count);
  }
  // Commit: the master and states, the model-precision copy and its spread, the frozen parameters,
  // and the counters.
  zero_grad();
  for (int a = 0; a < arrays; ++a) {
    if (swap_in[a]) {
      optimizer_->adopt_array(a, std::move(staged[a]));
    } else {
      optimizer_->write_owned(a, lo, staged[a].as<float>(), count);
    }
  }
  optimizer_->refresh_params_from_master();
  coordinator_->after_update();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    if (!p.trainable) coordinator_->store(static_cast<int>(i), frozen.data() + p.frozen_offset);
  }
  forget_initial_values();
  global_step_ = m.global_step;
  micro_step_ = m.micro_step;
  lr_override_ = m.lr_override;
  last_grad_norm_ = m.last_grad_norm;
  if (scaler && m.scaler) scaler_ = scaler;
  const std::string scheduler = scheduler_ ? scheduler_->name() : "";
  if (m.scheduler != scheduler) {
    ZEROSHARD_LOG(kWarning, "checkpoint " << dir << "/" << info.tag << " was saved with scheduler '"
                                          << m.scheduler << "'; this engine's config has '"
                                          << scheduler << "', which the run continues with");
  }
  info.global_step = m.global_step;
  info.user_state = m.user_state;
  ZEROSHARD_LOG(kInfo, "loaded checkpoint " << dir << "/" << info.tag << " (saved at world "
                                            << m.world_size << ", stage " << m.stage << ", step "
                                            << m.global_step << ")");
  return info;
}

void EngineState::load_weights(const std::string& path) {
  require_finalized();
  // Everything is checked on every rank before any parameter changes.
  std::exception_ptr failure;
  std::optional<FileHandle> file;
  std::vector<SafetensorsEntry> entries;
  std::vector<const SafetensorsEntry*> of_param(params_.size(), nullptr);
  std::int64_t data_start = 0;
  try {
    if (!std::filesystem::exists(path)) {
      throw CheckpointError("weights file " + path + " does not exist (rank " +
                            std::to_string(rank_) + ")");
    }
    file.emplace(FileHandle::open_read(path));
    entries = read_safetensors_header(*file, &data_start);
    std::map<std::string, const SafetensorsEntry*> by_name;
    for (const SafetensorsEntry& e : entries) by_name[e.name] = &e;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const ParamInfo& p = params_[i];
      const auto it = by_name.find(p.name);
      if (it == by_name.end()) {
        throw CheckpointError("weights file " + path + " has no tensor '" + p.name +
                              "', a registered parameter");
      }
      if (it->second->shape != p.shape) {
        throw CheckpointError("weights file " + path + ": tensor '" + p.name + "' has shape " +
                              format_shape(it->second->shape) + ", the registered parameter " +
                              format_shape(p.shape));
      }
      of_param[i] = it->second;
      by_name.erase(it);
    }
    if (!by_name.empty()) {
      throw CheckpointError("weights file " + path + " holds tensor '" + by_name.begin()->first +
                            "' (and " + std::to_string(by_name.size() - 1) +
                            " more) that no registered parameter has");
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_failure(failure, "load_weights");
  std::vector<char> raw;
  std::vector<float> values;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const SafetensorsEntry& e = *of_param[i];
    raw.resize(static_cast<std::size_t>(e.end - e.begin));
    file->pread_all(raw.data(), raw.size(), data_start + e.begin);
    values.resize(static_cast<std::size_t>(e.numel));
    convert_to_float(raw.data(), e.dtype, values.data(), e.numel);
    copy_param_from(static_cast<int>(i), values.data());
  }
  ZEROSHARD_LOG(kInfo, "loaded weights from " << path);
}

bool EngineState::save_16bit_model(const std::string& path) {
  require_finalized();
  if (stage_ == 3 && !config_.zero_optimization.gather_16bit_weights_on_model_save) {
    ZEROSHARD_LOG(kWarning, "save_16bit_model("
                                << path
                                << ") saved nothing: at stage 3 it needs "
                                   "zero_optimization.stage3_gather_16bit_weights_on_model_"
                                   "save true; save_checkpoint and zeroshard-consolidate "
                                   "export the weights without gathering");
    return false;
  }
  std::vector<SafetensorsEntry> entries;
  for (const ParamInfo& p : params_) {
    entries.push_back({.name = p.name, .dtype = dtype_, .shape = p.shape, .numel = p.numel});
  }
  const std::string prefix = safetensors_prefix(entries);
  const std::string tmp = path + ".tmp";
  std::exception_ptr failure;
  std::optional<FileHandle> file;
  if (rank_ == 0) {
    try {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      file.emplace(FileHandle::create(tmp));
      file->pwrite_all(prefix.data(), prefix.size(), 0);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // Module by module, so that stage 3 holds one gathered module at a time; every rank gathers.
  std::vector<char> raw;
  for (std::size_t m = 0; m < modules_.size(); ++m) {
    // Slices of parameters are written with the modules of whole parameters that hold them.
    if (!modules_[m].slices.empty()) continue;
    gather(static_cast<ModuleId>(m));
    for (int index : modules_[m].params) {
      if (rank_ != 0 || failure) continue;
      try {
        raw.resize(params_[index].numel * dsize_);
        backend_->copy_to_host(raw.data(), coordinator_->data(index), raw.size());
        file->pwrite_all(raw.data(), raw.size(), prefix.size() + entries[index].begin);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    release(static_cast<ModuleId>(m));
  }
  if (rank_ == 0 && !failure) {
    try {
      file->close_synced();
      if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        throw IoError("cannot rename " + tmp + " to " + path + " (rank 0)");
      }
      fsync_directory(std::filesystem::absolute(path).parent_path().string());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  agree_on_failure(failure, "save_16bit_model");
  return true;
}

}  // namespace zeroshard::detail
