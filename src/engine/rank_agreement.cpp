// Ranks started differently (another config file, another learning rate, another model width)
// would train different models, or fail deep inside a collective with a transport error. The
// first finalize() compares a digest of everything that must agree across ranks: two tiny
// all-reduces, nothing per step. Only on a mismatch are the descriptions gathered, to name the
// first difference and every rank's value.
#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "comm/text_gather.h"
#include "config/config_values.h"
#include "engine/engine_state.h"
#include "engine/shape.h"
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
  std::map<std::string, std::vector<int>> holders;
  std::vector<std::string> order;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const Entry* entry = entry_at(r);
    const std::string value = entry == nullptr ? "nothing (fewer entries)"
                              : one_key        ? printable_text(entry->value)
                                               : entry->key + " = " + printable_text(entry->value);
    if (holders[value].empty()) order.push_back(value);
    holders[value].push_back(static_cast<int>(r));
  }
  std::ostringstream os;
  if (one_key && lead_with_key) os << entry_at(0)->key << ": ";
  for (std::size_t v = 0; v < order.size(); ++v) {
    const std::vector<int>& rank_list = holders[order[v]];
    os << (v > 0 ? "; " : "") << (rank_list.size() > 1 ? "ranks " : "rank ");
    for (std::size_t i = 0; i < rank_list.size(); ++i) os << (i > 0 ? ", " : "") << rank_list[i];
    os << (rank_list.size() > 1 ? " have " : " has ") << order[v];
  }
  return os.str();
}

bool same(const Entry& a, const Entry& b) {
  return a.config == b.config && a.key == b.key && a.value == b.value;
}

}  // namespace

std::string EngineState::agreement_description() const {
  std::vector<Entry> entries;
  // In the key table's order, where a section's deciding keys (the stage) come before the keys
  // whose defaults follow from them.
  const nlohmann::ordered_json resolved =
      nlohmann::ordered_json::parse(config_.resolved_json()).flatten();
  for (const auto& [pointer, value] : resolved.items()) {
    std::string path = pointer.substr(1);
    for (char& c : path) {
      if (c == '/') c = '.';
    }
    entries.push_back({true, path, value.is_string() ? value.get<std::string>() : value.dump()});
  }
  std::ostringstream rule;
  rule << rule_->name() << ", lr " << rule_->default_lr() << ", weight_decay "
       << rule_->default_weight_decay() << ", " << rule_->state_count() << " state arrays";
  if (const auto beta1 = rule_->beta1()) rule << ", beta1 " << *beta1;
  entries.push_back({false, "the update rule", rule.str()});
  entries.push_back({false, "the gradient handover",
                     grad_handover_ == GradHandover::kAtEnd ? "at the end" : "per parameter"});
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroupOptions& options = groups_[g].options;
    std::ostringstream os;
    os << "'" << options.name << "'";
    if (options.lr) os << ", lr " << *options.lr;
    if (options.weight_decay) os << ", weight_decay " << *options.weight_decay;
    entries.push_back({false, "parameter group " + std::to_string(g), os.str()});
  }
  entries.push_back({false, "the number of registered parameters", std::to_string(params_.size())});
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    std::ostringstream os;
    os << "'" << p.name << "' " << format_shape(p.shape) << " " << to_string(dtype_) << ", group "
       << p.group << (p.trainable ? ", trainable" : ", frozen") << ", module '"
       << modules_[p.module].name << "'";
    entries.push_back({false, "parameter " + std::to_string(i), os.str()});
  }
  return to_json_text(entries);
}

void EngineState::check_ranks_agree() {
  if (world_ == 1) return;
  const std::string description = agreement_description();
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

  std::vector<std::vector<Entry>> ranks;
  for (const std::string& text : all_gather_text(description))
    ranks.push_back(from_json_text(text));
  std::size_t longest = 0;
  for (const auto& entries : ranks) longest = std::max(longest, entries.size());
  for (std::size_t index = 0; index < longest; ++index) {
    bool differs = false;
    for (const auto& entries : ranks) {
      differs = differs || index >= entries.size() || index >= ranks[0].size() ||
                !same(entries[index], ranks[0][index]);
    }
    if (!differs) continue;
    const std::vector<Entry>& own = ranks[static_cast<std::size_t>(rank_)];
    const bool config_key = index < own.size() && own[index].config;
    const std::string message =
        "ranks disagree: " + values_by_rank(ranks, index, !config_key) +
        ". Every rank must run the same program with the same config, and register the same "
        "parameters in the same order";
    if (config_key) throw ConfigError(own[index].key, message);
    throw UsageError(message);
  }
  // The digests differ but the entries agree: only a hash collision of equal texts could do
  // that, which cannot happen, so the check itself is broken.
  throw UsageError("ranks reported different layout digests for equal descriptions");
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
