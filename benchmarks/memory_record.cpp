// Storing and showing the memory benchmark's records: JSON, CSV and the printed table.
#include "memory_record.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <ostream>
#include <utility>

#include "memory_sweep.h"
#include "zeroshard/error.h"
#include "zeroshard/quantity.h"

namespace zeroshard::bench {

namespace {

constexpr MemoryCategory kModelStateCategories[] = {
    MemoryCategory::kParameters, MemoryCategory::kGradients, MemoryCategory::kMasterWeights,
    MemoryCategory::kOptimizerStates};

double ratio(std::int64_t measured, std::int64_t theory) {
  return theory == 0 ? (measured == 0 ? 1.0 : INFINITY)
                     : static_cast<double>(measured) / static_cast<double>(theory);
}

}  // namespace

const std::string& Record::value(const char* dimension) const {
  for (std::size_t d = 0; d < dimensions().size() && d < values.size(); ++d) {
    if (std::string(dimensions()[d].name) == dimension) return values[d];
  }
  throw UsageError(std::string("record has no value for ") + dimension);
}

std::int64_t Record::measured_model_states() const {
  std::int64_t sum = 0;
  for (MemoryCategory c : kModelStateCategories) sum += measured_current(c);
  return sum;
}

std::int64_t Record::theory_model_states() const {
  std::int64_t sum = 0;
  for (MemoryCategory c : kModelStateCategories) sum += theory_of(c);
  return sum;
}

double Record::model_state_ratio() const {
  return ratio(measured_model_states(), theory_model_states());
}

double Record::sent_over_theory() const {
  return ratio(sent_bytes_per_step, theory_sent_bytes_per_step);
}

nlohmann::json to_json(const Record& r) {
  nlohmann::json measured = nlohmann::json::object();
  nlohmann::json theory = nlohmann::json::object();
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const char* name = to_string(static_cast<MemoryCategory>(c));
    measured[name] = {{"current", r.measured[c].current}, {"peak", r.measured[c].peak}};
    theory[name] = r.theory[c];
  }
  nlohmann::json values = nlohmann::json::object();
  for (std::size_t d = 0; d < r.values.size(); ++d) values[dimensions()[d].name] = r.values[d];
  return {{"world_size", r.world_size},
          {"rank", r.rank},
          {"configuration", values},
          {"status", r.status},
          {"params", r.params},
          {"padded_params", r.padded_params},
          {"measured", measured},
          {"measured_total_peak", r.measured_total_peak},
          {"process_peak_rss", r.process_peak_rss},
          {"step_ms", r.step_ms},
          {"recompute_ms", r.recompute_ms},
          {"sent_bytes_per_step", r.sent_bytes_per_step},
          {"theory", theory},
          {"theory_device_peak", r.theory_device_peak},
          {"theory_sent_bytes_per_step", r.theory_sent_bytes_per_step},
          {"model_state_ratio", r.ok() ? nlohmann::json(r.model_state_ratio()) : nlohmann::json()}};
}

Record record_from_json(const nlohmann::json& j) {
  Record r;
  r.world_size = j.at("world_size");
  r.rank = j.at("rank");
  for (const Dimension& d : dimensions()) r.values.push_back(j.at("configuration").at(d.name));
  r.status = j.at("status");
  r.params = j.at("params");
  r.padded_params = j.at("padded_params");
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const char* name = to_string(static_cast<MemoryCategory>(c));
    r.measured[c].current = j.at("measured").at(name).at("current");
    r.measured[c].peak = j.at("measured").at(name).at("peak");
    r.theory[c] = j.at("theory").at(name);
  }
  r.measured_total_peak = j.at("measured_total_peak");
  r.process_peak_rss = j.at("process_peak_rss");
  r.step_ms = j.at("step_ms");
  r.recompute_ms = j.value("recompute_ms", 0.0);
  r.sent_bytes_per_step = j.at("sent_bytes_per_step");
  r.theory_device_peak = j.at("theory_device_peak");
  r.theory_sent_bytes_per_step = j.at("theory_sent_bytes_per_step");
  return r;
}

namespace {

struct Column {
  std::string name;
  std::function<std::string(const Record&)> text;
};

std::string number(std::int64_t value) { return std::to_string(value); }
std::string decimal(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

std::string quoted(const std::string& field) {
  if (field.find_first_of(",\"\n") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

/// The CSV's columns, in order; numeric ones are empty on a row whose status is not ok.
const std::vector<Column>& csv_columns() {
  static const std::vector<Column> kColumns = [] {
    std::vector<Column> columns = {
        {"world_size", [](const Record& r) { return number(r.world_size); }},
        {"rank", [](const Record& r) { return number(r.rank); }},
    };
    for (std::size_t d = 0; d < dimensions().size(); ++d) {
      columns.push_back({dimensions()[d].name, [d](const Record& r) { return r.values[d]; }});
    }
    columns.push_back({"status", [](const Record& r) { return r.status; }});
    columns.push_back({"params", [](const Record& r) { return number(r.params); }});
    columns.push_back({"padded_params", [](const Record& r) { return number(r.padded_params); }});
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const std::string name = to_string(static_cast<MemoryCategory>(c));
      columns.push_back({"measured_" + name + "_current",
                         [c](const Record& r) { return number(r.measured[c].current); }});
      columns.push_back({"measured_" + name + "_peak",
                         [c](const Record& r) { return number(r.measured[c].peak); }});
      columns.push_back({"theory_" + name, [c](const Record& r) { return number(r.theory[c]); }});
    }
    const std::vector<Column> totals = {
        {"measured_model_states",
         [](const Record& r) { return number(r.measured_model_states()); }},
        {"theory_model_states", [](const Record& r) { return number(r.theory_model_states()); }},
        {"model_state_ratio", [](const Record& r) { return decimal(r.model_state_ratio(), 6); }},
        {"measured_total_peak", [](const Record& r) { return number(r.measured_total_peak); }},
        {"theory_device_peak", [](const Record& r) { return number(r.theory_device_peak); }},
        {"process_peak_rss", [](const Record& r) { return number(r.process_peak_rss); }},
        {"step_ms", [](const Record& r) { return decimal(r.step_ms, 3); }},
        {"recompute_ms", [](const Record& r) { return decimal(r.recompute_ms, 3); }},
        {"sent_bytes_per_step", [](const Record& r) { return number(r.sent_bytes_per_step); }},
        {"theory_sent_bytes_per_step",
         [](const Record& r) { return number(r.theory_sent_bytes_per_step); }},
        {"sent_over_theory", [](const Record& r) { return decimal(r.sent_over_theory(), 6); }},
    };
    columns.insert(columns.end(), totals.begin(), totals.end());
    return columns;
  }();
  return kColumns;
}

}  // namespace

std::string csv_header() {
  std::string line;
  for (const Column& c : csv_columns()) line += (line.empty() ? "" : ",") + c.name;
  return line;
}

std::string csv_row(const Record& record) {
  std::string line;
  bool first = true;
  bool numeric = false;  // the columns after status are numbers, empty when not ok
  for (const Column& c : csv_columns()) {
    const bool blank = numeric && !record.ok();
    line += (first ? "" : ",") + (blank ? std::string() : quoted(c.text(record)));
    first = false;
    if (c.name == "status") numeric = true;
  }
  return line;
}

void print_table(std::ostream& out, const std::vector<Record>& records) {
  // Group the ranks of each configuration, keeping the sweep's order.
  std::vector<std::pair<std::string, std::vector<const Record*>>> groups;
  for (const Record& r : records) {
    std::string key = std::to_string(r.world_size);
    for (const std::string& v : r.values) key += "|" + v;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&key](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {}});
      it = groups.end() - 1;
    }
    it->second.push_back(&r);
  }

  const auto bytes = [](std::int64_t b) { return format_decimal_bytes(b); };
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"N"};
  for (const Dimension& d : dimensions()) header.push_back(d.name);
  const std::vector<std::string> figures = {
      "model states", "theory",    "ratio",      "comm buffers", "bound",
      "activations",  "estimate",  "alloc peak", "peak bound",   "peak RSS",
      "step ms",      "recompute", "sent/step",  "theory",       "ratio"};
  header.insert(header.end(), figures.begin(), figures.end());
  rows.push_back(header);
  std::vector<std::string> notes;

  for (const auto& [key, ranks] : groups) {
    std::vector<std::string> row = {std::to_string(ranks.front()->world_size)};
    row.insert(row.end(), ranks.front()->values.begin(), ranks.front()->values.end());
    const auto not_ok =
        std::find_if(ranks.begin(), ranks.end(), [](const Record* r) { return !r->ok(); });
    if (not_ok != ranks.end()) {
      row.push_back((*not_ok)->status);
      rows.push_back(row);
      continue;
    }
    const auto largest = [&ranks](auto get) {
      std::int64_t m = 0;
      for (const Record* r : ranks) m = std::max<std::int64_t>(m, get(*r));
      return m;
    };
    const auto furthest = [&ranks](auto get) {
      double worst = 1.0;
      for (const Record* r : ranks) {
        if (std::abs(get(*r) - 1.0) > std::abs(worst - 1.0)) worst = get(*r);
      }
      return worst;
    };
    double step_ms = 0.0;
    for (const Record* r : ranks) step_ms = std::max(step_ms, r->step_ms);
    const MemoryCategory comm = MemoryCategory::kCommunication;
    row.push_back(bytes(largest([](const Record& r) { return r.measured_model_states(); })));
    row.push_back(bytes(largest([](const Record& r) { return r.theory_model_states(); })));
    row.push_back(decimal(furthest([](const Record& r) { return r.model_state_ratio(); }), 4));
    row.push_back(bytes(largest([comm](const Record& r) { return r.measured_peak(comm); })));
    row.push_back(bytes(largest([comm](const Record& r) { return r.theory_of(comm); })));
    row.push_back(bytes(
        largest([](const Record& r) { return r.measured_peak(MemoryCategory::kActivations); })));
    row.push_back(
        bytes(largest([](const Record& r) { return r.theory_of(MemoryCategory::kActivations); })));
    row.push_back(bytes(largest([](const Record& r) { return r.measured_total_peak; })));
    row.push_back(bytes(largest([](const Record& r) { return r.theory_device_peak; })));
    row.push_back(bytes(largest([](const Record& r) { return r.process_peak_rss; })));
    row.push_back(decimal(step_ms, 2));
    // The recompute's share of the step, on the slowest rank.
    double recompute_share = 0.0;
    for (const Record* r : ranks) {
      if (r->step_ms > 0.0)
        recompute_share = std::max(recompute_share, r->recompute_ms / r->step_ms);
    }
    row.push_back(decimal(100.0 * recompute_share, 1) + "%");
    row.push_back(bytes(largest([](const Record& r) { return r.sent_bytes_per_step; })));
    row.push_back(bytes(largest([](const Record& r) { return r.theory_sent_bytes_per_step; })));
    row.push_back(decimal(furthest([](const Record& r) { return r.sent_over_theory(); }), 4));
    rows.push_back(row);
  }

  // Columns as wide as their widest cell; a status line runs on past the figures' columns.
  std::vector<std::size_t> widths(header.size(), 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size() && c < widths.size(); ++c) {
      const bool runs_on = row.size() == dimensions().size() + 2 && c + 1 == row.size();
      if (!runs_on) widths[c] = std::max(widths[c], row[c].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::size_t width = c < widths.size() ? widths[c] : 0;
      const bool left = c <= dimensions().size() || row.size() == dimensions().size() + 2;
      const std::string pad(width > row[c].size() ? width - row[c].size() : 0, ' ');
      line += (c ? "  " : "") + (left ? row[c] + pad : pad + row[c]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << "\n";
  }
}

}  // namespace zeroshard::bench
