// Rendering of a rank's memory report as a table and as JSON.
#include "zeroshard/memory_report.h"

#include <cstdio>
#include <sstream>

namespace zeroshard {

const char* to_string(MemoryCategory category) noexcept {
  switch (category) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kMasterWeights:
      return "master_weights";
    case MemoryCategory::kOptimizerStates:
      return "optimizer_states";
    case MemoryCategory::kCommunication:
      return "communication";
    case MemoryCategory::kActivations:
      return "activations";
  }
  return "unknown";
}

const char* to_string(MemoryLocation location) noexcept {
  switch (location) {
    case MemoryLocation::kHost:
      return "host";
    case MemoryLocation::kDevice:
      return "device";
    case MemoryLocation::kNvme:
      return "nvme";
  }
  return "unknown";
}

std::int64_t MemoryReport::model_state_bytes(MemoryLocation location) const {
  return at(MemoryCategory::kParameters, location).current +
         at(MemoryCategory::kGradients, location).current +
         at(MemoryCategory::kMasterWeights, location).current +
         at(MemoryCategory::kOptimizerStates, location).current;
}

std::int64_t MemoryReport::total_current(MemoryLocation location) const {
  std::int64_t total = kept_for_reuse[static_cast<int>(location)].current;
  for (const MemoryUsage& u : usage[static_cast<int>(location)]) total += u.current;
  return total;
}

namespace {

bool location_used(const MemoryReport& report, int location) {
  if (report.kept_for_reuse[location].peak != 0) return true;
  for (const MemoryUsage& u : report.usage[location]) {
    if (u.peak != 0) return true;
  }
  return false;
}

std::string mib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

std::string MemoryReport::to_table() const {
  std::ostringstream os;
  char line[160];
  for (int l = 0; l < kMemoryLocationCount; ++l) {
    if (l != 0 && !location_used(*this, l)) continue;
    std::snprintf(line, sizeof line, "rank %d/%d %s memory\n", rank, world_size,
                  to_string(static_cast<MemoryLocation>(l)));
    os << line;
    std::snprintf(line, sizeof line, "  %-18s %16s %12s %16s %12s\n", "category", "current B",
                  "current MiB", "peak B", "peak MiB");
    os << line;
    std::int64_t total = 0;
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const MemoryUsage& u = usage[l][c];
      total += u.current;
      std::snprintf(line, sizeof line, "  %-18s %16lld %12s %16lld %12s\n",
                    to_string(static_cast<MemoryCategory>(c)), static_cast<long long>(u.current),
                    mib(u.current).c_str(), static_cast<long long>(u.peak), mib(u.peak).c_str());
      os << line;
    }
    if (const MemoryUsage& kept = kept_for_reuse[l]; kept.peak != 0) {
      total += kept.current;
      std::snprintf(line, sizeof line, "  %-18s %16lld %12s %16lld %12s\n", "kept for reuse",
                    static_cast<long long>(kept.current), mib(kept.current).c_str(),
                    static_cast<long long>(kept.peak), mib(kept.peak).c_str());
      os << line;
    }
    std::snprintf(line, sizeof line, "  %-18s %16lld %12s %16lld %12s\n", "total",
                  static_cast<long long>(total), mib(total).c_str(),
                  static_cast<long long>(total_peak[l]), mib(total_peak[l]).c_str());
    os << line;
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      if (adopted[l][c] == 0) continue;
      std::snprintf(line, sizeof line, "  of which the model's own %s: %lld B (%s MiB)\n",
                    to_string(static_cast<MemoryCategory>(c)),
                    static_cast<long long>(adopted[l][c]), mib(adopted[l][c]).c_str());
      os << line;
    }
  }
  std::snprintf(line, sizeof line, "  process peak RSS   %16lld %12s\n",
                static_cast<long long>(process_peak_rss), mib(process_peak_rss).c_str());
  os << line;
  return os.str();
}

std::string MemoryReport::to_json() const {
  std::ostringstream os;
  os << "{\"rank\":" << rank << ",\"world_size\":" << world_size;
  for (int l = 0; l < kMemoryLocationCount; ++l) {
    os << ",\"" << to_string(static_cast<MemoryLocation>(l)) << "\":{";
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const MemoryUsage& u = usage[l][c];
      os << (c ? "," : "") << "\"" << to_string(static_cast<MemoryCategory>(c))
         << "\":{\"current\":" << u.current << ",\"peak\":" << u.peak
         << ",\"adopted\":" << adopted[l][c] << "}";
    }
    os << ",\"kept_for_reuse\":{\"current\":" << kept_for_reuse[l].current
       << ",\"peak\":" << kept_for_reuse[l].peak << "},\"total_peak\":" << total_peak[l] << "}";
  }
  os << ",\"process_peak_rss\":" << process_peak_rss << "}";
  return os.str();
}

}  // namespace zeroshard
