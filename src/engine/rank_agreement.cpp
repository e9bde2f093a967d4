// Ranks started differently (another config file, another learning rate, another model width)
// would train different models, or fail deep inside a collective with a transport error. The
// first finalize() compares a digest of everything that must agree across ranks: two tiny
// all-reduces, nothing per step. Ranks that diverge later (one rank's own initial values, a
// learning rate set on one rank) would train a wrong model silently: every step folds a digest of
// those into the all-reduce it makes anyway. Only on a mismatch are the descriptions gathered, to
// name the first difference and every rank's value.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "comm/text_gather.h"
#include "engine/engine_state.h"
#include "layout/shape.h"
#include "util/text.h"
#include "zeroshard/error.h"

namespace zeroshard::detail {
namespace {

using nlohmann::json;

// One thing every rank must agree on. Config entries are named by their key path and raise a
// ConfigError; the rest (update rule, groups, parameters) raise a UsageError.
struct Entry {
  bool config = false;
  std::string key;
  std::string value;
};

constexpr const char* kSameProgram =
    "Every rank must run the same program with the same config, and register the same "
    "parameters in the same order";

// Mixes a 64-bit value into a digest (a finaliser of splitmix64): every input bit reaches every
// output bit, so digests that differ anywhere differ in the low bits step() sends.
std::uint64_t mix(std::uint64_t digest, std::uint64_t value) noexcept {
  std::uint64_t z = digest ^ (value + 0x9e3779b97f4a7c15ULL + (digest << 6) + (digest >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t bits_of(double value) noexcept {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Four independent lanes over 8-byte words, so that a pass over the model runs near memory speed
// (a single multiply chain would not): a check of equality, not a cryptographic hash.
std::uint64_t digest_bytes(const void* data, std::size_t bytes) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t lanes[4] = {1, 2, 3, 4};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int l = 0; l < 4; ++l) {
      std::uint64_t word;
      std::memcpy(&word, p + i + 8 * l, sizeof word);
      lanes[l] = (lanes[l] ^ word) * 0x100000001b3ULL;
      lanes[l] ^= lanes[l] >> 29;
    }
  }
  std::uint64_t digest = mix(bytes, lanes[0]);
  for (int l = 1; l < 4; ++l) digest = mix(digest, lanes[l]);
  for (; i < bytes; ++i) digest = mix(digest, p[i]);
  return digest;
}

// The step digest travels as kStepChunks integers a of `chunk_bits` bits each, beside their
// squares: every partial sum of N such values stays an integer below 2^24, exact in fp32 in any
// summation order, and N * sum(a^2) equals sum(a)^2 exactly when every rank sent the same a.
constexpr int kStepChunks = 4;

int chunk_bits(int world) noexcept {
  int log2_world = 0;
  while ((1 << log2_world) < world) ++log2_world;
  return std::max(1, (24 - log2_world) / 2);
}

std::uint64_t fnv1a(const std::string& text) noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string to_json_text(const std::vector<Entry>& entries) {
  json array = json::array();
  for (const Entry& e : entries) array.push_back(json::array({e.config, e.key, e.value}));
  // Keys and parameter names are the program's strings: replace invalid UTF-8 rather than throw.
  return array.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<Entry> from_json_text(const std::string& text) {
  std::vector<Entry> entries;
  for (const json& e : json::parse(text)) {
    entries.push_back(
        {e.at(0).get<bool>(), e.at(1).get<std::string>(), e.at(2).get<std::string>()});
  }
  return entries;
}

// "zero_optimization.stage: ranks 0, 2: 2; rank 1: 3": ranks grouped by what they hold at
// `index`; the key leads when every rank has the same one there, unless a ConfigError already
// names it.
std::string values_by_rank(const std::vector<std::vector<Entry>>& ranks, std::size_t index,
                           bool lead_with_key) {
  const auto entry_at = [&](std::size_t r) -> const Entry* {
    return index < ranks[r].size() ? &ranks[r][index] : nullptr;
  };
  bool one_key = true;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    one_key = one_key && entry_at(r) && entry_at(0) && entry_at(r)->key == entry_at(0)->key;
  }
  // Ranks are grouped by the whole value; each is shown shortened (printable_text) from a little
  // before where the values first differ, so that a difference past a long common start (a long
  // parameter name, then its shape) stays in view.
  std::map<std::string, std::vector<int>> holders;
  std::vector<std::string> order;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const Entry* entry = entry_at(r);
    const std::string value = entry == nullptr ? "nothing (fewer entries)"
                              : one_key        ? entry->value
                                               : entry->key + " = " + entry->value;
    if (holders[value].empty()) order.push_back(value);
    holders[value].push_back(static_cast<int>(r));
  }
  std::size_t common = order.front().size();  // the length of the start every value shares
  for (const std::string& value : order) {
    std::size_t i = 0;
    while (i < common && i < value.size() && value[i] == order.front()[i]) ++i;
    common = i;
  }
  constexpr std::size_t kContext = 16;  // characters shown before the first difference
  const std::size_t skip = common > 2 * kContext ? common - kContext : 0;
  std::ostringstream os;
  if (one_key && lead_with_key) os << entry_at(0)->key << ": ";
  for (std::size_t v = 0; v < order.size(); ++v) {
    const std::vector<int>& rank_list = holders[order[v]];
    os << (v > 0 ? "; " : "") << (rank_list.size() > 1 ? "ranks " : "rank ");
    for (std::size_t i = 0; i < rank_list.size(); ++i) os << (i > 0 ? ", " : "") << rank_list[i];
    os << (rank_list.size() > 1 ? " have " : " has ") << (skip > 0 ? "..." : "")
       << printable_text(std::string_view(order[v]).substr(skip));
  }
  return os.str();
}

bool same(const Entry& a, const Entry& b) {
  return a.config == b.config && a.key == b.key && a.value == b.value;
}

std::vector<Entry> agreement_entries(const EngineState& state) {
  std::vector<Entry> entries;
  // In the key table's order, where a section's deciding keys (the stage) come before the keys
  // whose defaults follow from them.
  const nlohmann::ordered_json resolved =
      nlohmann::ordered_json::parse(state.config().resolved_json()).flatten();
  for (const auto& [pointer, value] : resolved.items()) {
    std::string path = pointer.substr(1);
    for (char& c : path) {
      if (c == '/') c = '.';
    }
    entries.push_back({true, path, value.is_string() ? value.get<std::string>() : value.dump()});
  }
  std::ostringstream rule;
  rule << state.rule().name() << ", lr " << state.rule().default_lr() << ", weight_decay "
       << state.rule().default_weight_decay() << ", " << state.rule().state_count()
       << " state arrays";
  if (const auto beta1 = state.rule().beta1()) rule << ", beta1 " << *beta1;
  entries.push_back({false, "the update rule", rule.str()});
  entries.push_back(
      {false, "the gradient handover",
       state.grad_handover() == GradHandover::kAtEnd ? "at the end" : "per parameter"});
  for (std::size_t g = 0; g < state.groups().size(); ++g) {
    const ParamGroupOptions& options = state.groups()[g].options;
    std::ostringstream os;
    os << "'" << options.name << "'";
    if (options.lr) os << ", lr " << *options.lr;
    if (options.weight_decay) os << ", weight_decay " << *options.weight_decay;
    entries.push_back({false, "parameter group " + std::to_string(g), os.str()});
  }
  entries.push_back(
      {false, "the number of registered parameters", std::to_string(state.params().size())});
  for (std::size_t i = 0; i < state.params().size(); ++i) {
    const ParamInfo& p = state.params()[i];
    std::ostringstream os;
    os << "'" << p.name << "' " << format_shape(p.shape) << " " << to_string(state.dtype())
       << ", group " << p.group << (p.trainable ? ", trainable" : ", frozen") << ", module '"
       << state.modules()[p.module].name << "'";
    entries.push_back({false, "parameter " + std::to_string(i), os.str()});
  }
  return entries;
}

// Gathers every rank's entries and throws for the first one where they differ: ConfigError for a
// config key, UsageError otherwise, followed by the entry's advice (kSameProgram where none).
[[noreturn]] void name_first_difference(const std::vector<Entry>& mine,
                                        const std::vector<std::string>& texts,
                                        const std::string& prefix,
                                        const std::vector<std::string>& advice) {
  std::vector<std::vector<Entry>> ranks;
  for (const std::string& text : texts) ranks.push_back(from_json_text(text));
  std::size_t longest = 0;
  for (const auto& entries : ranks) longest = std::max(longest, entries.size());
  for (std::size_t index = 0; index < longest; ++index) {
    bool differs = false;
    for (const auto& entries : ranks) {
      differs = differs || index >= entries.size() || index >= ranks[0].size() ||
                !same(entries[index], ranks[0][index]);
    }
    if (!differs) continue;
    const bool config_key = index < mine.size() && mine[index].config;
    const std::string why = index < advice.size() ? advice[index] : kSameProgram;
    const std::string message = prefix + values_by_rank(ranks, index, !config_key) + ". " + why;
    if (config_key) throw ConfigError(mine[index].key, message);
    throw UsageError(message);
  }
  // The digests differ but the entries agree: only a hash collision of equal texts could do
  // that, which cannot happen, so the check itself is broken.
  throw UsageError("ranks reported different digests for equal descriptions");
}

}  // namespace

void EngineState::check_ranks_agree() {
  if (world_ == 1) return;
  const std::vector<Entry> entries = agreement_entries(*this);
  const std::string description = to_json_text(entries);
  // 48 bits of the digest travel as two integers below 2^24, exact in fp32. Equal everywhere
  // exactly when the maximum of each equals minus the maximum of its negation.
  const std::uint64_t digest = fnv1a(description);
  const float low = static_cast<float>(digest & 0xffffff);
  const float high = static_cast<float>((digest >> 24) & 0xffffff);
  float largest[2] = {low, high};
  float negated[2] = {-low, -high};
  all_reduce_host(largest, 2, ReduceOp::kMax);
  all_reduce_host(negated, 2, ReduceOp::kMax);
  if (largest[0] == -negated[0] && largest[1] == -negated[1]) return;
  name_first_difference(entries, all_gather_text(description), "ranks disagree: ", {});
}

void EngineState::note_initial_values(int index, const void* data, std::size_t bytes) {
  initial_value_digests_.resize(params_.size());
  initial_value_digests_[static_cast<std::size_t>(index)] = digest_bytes(data, bytes);
}

void EngineState::note_adopted_values() {
  // Bounded chunks through host memory: the adopted memory may be the device's.
  constexpr std::size_t kChunk = std::size_t{1} << 24;
  std::vector<char> host;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    if (!p.trainable) continue;
    const char* base =
        static_cast<const char*>(adopted_.parameters) + layout_.offset(p.tensor) * dsize_;
    const std::size_t bytes = static_cast<std::size_t>(p.numel) * dsize_;
    std::uint64_t digest = bytes;
    for (std::size_t done = 0; done < bytes; done += kChunk) {
      const std::size_t count = std::min(kChunk, bytes - done);
      host.resize(count);
      backend_->copy_to_host(host.data(), base + done, count);
      digest = mix(digest, digest_bytes(host.data(), count));
    }
    note_initial_values(static_cast<int>(i), &digest, sizeof digest);
  }
}

void EngineState::forget_initial_values() { initial_value_digests_.clear(); }

int EngineState::step_agreement_floats() const { return world_ > 1 ? 2 * kStepChunks : 0; }

namespace {

std::uint64_t step_digest(const GroupContexts& contexts, std::int64_t step,
                          const std::vector<std::uint64_t>& initial_values) {
  std::uint64_t digest = mix(0, static_cast<std::uint64_t>(step));
  for (const StepContext& context : contexts) {
    digest = mix(digest, bits_of(context.lr));
    digest = mix(digest, bits_of(context.weight_decay));
    digest = mix(digest, context.momentum ? bits_of(*context.momentum) : 1);
  }
  // Parameters given no values count as nothing, so that a rank that never noted any and one
  // whose notes a checkpoint cleared agree.
  for (std::size_t i = 0; i < initial_values.size(); ++i) {
    if (initial_values[i] != 0) digest = mix(mix(digest, i), initial_values[i]);
  }
  return digest;
}

}  // namespace

void EngineState::pack_step_agreement(const GroupContexts& contexts, float* out) const {
  if (world_ == 1) return;
  const int bits = chunk_bits(world_);
  const std::uint64_t digest = step_digest(contexts, global_step_, initial_value_digests_);
  for (int c = 0; c < kStepChunks; ++c) {
    const auto a = static_cast<float>((digest >> (c * bits)) & ((std::uint64_t{1} << bits) - 1));
    out[2 * c] = a;
    out[2 * c + 1] = a * a;
  }
}

void EngineState::check_step_agreement(const GroupContexts& contexts, const float* summed) {
  if (world_ == 1) return;
  bool agree = true;
  for (int c = 0; c < kStepChunks; ++c) {
    const auto sum = static_cast<std::int64_t>(summed[2 * c]);
    const auto sum_of_squares = static_cast<std::int64_t>(summed[2 * c + 1]);
    agree = agree && world_ * sum_of_squares == sum * sum;
  }
  if (agree) return;
  std::vector<Entry> entries;
  std::vector<std::string> advice;
  const auto add = [&](std::string key, std::string value, std::string why) {
    entries.push_back({false, std::move(key), std::move(value)});
    advice.push_back(std::move(why));
  };
  add("the optimizer step", std::to_string(global_step_ + 1),
      "Every rank must call step() as often as the others");
  const char* same_schedule =
      "Every rank must run the same schedule and call set_lr() with the same value; the update "
      "was not applied";
  for (std::size_t g = 0; g < contexts.size(); ++g) {
    const std::string group = "group '" + groups_[g].options.name + "'";
    std::ostringstream lr;
    std::ostringstream decay;
    lr << contexts[g].lr;
    decay << contexts[g].weight_decay;
    add("the learning rate of " + group, lr.str(), same_schedule);
    add("the weight decay of " + group, decay.str(), same_schedule);
    std::ostringstream momentum;
    if (contexts[g].momentum) momentum << *contexts[g].momentum;
    add("the scheduled momentum of " + group, contexts[g].momentum ? momentum.str() : "none",
        same_schedule);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::uint64_t digest = i < initial_value_digests_.size() ? initial_value_digests_[i] : 0;
    std::ostringstream value;
    if (digest == 0) {
      value << "none given";
    } else {
      value << "digest " << std::hex << digest;
    }
    add("the initial values of '" + params_[i].name + "'", value.str(),
        "Every rank must start from the same values: give copy_from() the same tensor on every "
        "rank (the same seed everywhere, or one rank's values sent to the others), or load them "
        "with load_weights() or load_checkpoint(); the update was not applied");
  }
  const std::string prefix = "ranks disagree at step " + std::to_string(global_step_ + 1) + ": ";
  name_first_difference(entries, all_gather_text(to_json_text(entries)), prefix, advice);
}
std::vector<std::string> EngineState::all_gather_text(const std::string& text) {
  if (comm_->buffer_device() == DeviceType::kCpu) return comm_->all_gather_text(text);
  // The communicator takes GPU buffers: bounce through engine memory.
  return gather_text(text, rank_, world_,
                     [this](void* host, std::span<const std::int64_t> counts, DType dtype) {
                       std::int64_t total = 0;
                       for (std::int64_t count : counts) total += count;
                       const auto bytes = static_cast<std::size_t>(total) * size_of(dtype);
                       TrackedBuffer staging = allocate(MemoryCategory::kCommunication, bytes);
                       backend_->copy_from_host(staging.data(), host, bytes);
                       comm_->all_gather(staging.data(), counts, dtype);
                       backend_->copy_to_host(host, staging.data(), bytes);
                     });
}

}  // namespace zeroshard::detail
