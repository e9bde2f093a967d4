// zeroshard-memory-bench: sweeps ZeRO stage x precision x world size, launching itself under
// mpirun once per world size, and reports measured per-rank memory, step time and traffic beside
// the estimator's figures as a table, CSV, JSON and gnuplot plots.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "memory_bench_plot.h"
#include "memory_bench_worker.h"
#include "memory_record.h"
#include "memory_sweep.h"
#include "zeroshard/error.h"
#include "zeroshard/memory_estimator.h"

namespace {

using zeroshard::bench::BenchOptions;
using zeroshard::bench::Configuration;
using zeroshard::bench::Record;

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string own_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

/// Redraws the progress bar on stderr: in place on a terminal, one line per world size otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(std::size_t total) : total_(total), tty_(isatty(STDERR_FILENO) != 0) {}

  void show(std::size_t done, const std::string& what, bool line_end) {
    constexpr std::size_t kWidth = 30;
    const std::size_t filled = total_ == 0 ? kWidth : done * kWidth / total_;
    if (!tty_ && !line_end) return;
    std::fprintf(stderr, "%s[%s%s] %zu/%zu %s%s", tty_ ? "\r\033[K" : "",
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), done,
                 total_, what.c_str(), line_end || !tty_ ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  std::size_t total_;
  bool tty_;
};

/// Runs the workers of one world size, advancing the bar as their rank 0 reports; returns the
/// launcher's exit code.
int launch_world(const BenchOptions& options, int world_size, const std::string& worker_dir,
                 ProgressBar& bar, std::size_t done_before,
                 const std::vector<Configuration>& sweep) {
  std::string command = options.mpirun + " " + options.mpirun_flags + " -np " +
                        std::to_string(world_size) + " " + shell_quoted(own_executable());
  for (std::size_t i = 1; i < options.arguments.size(); ++i) {
    command += " " + shell_quoted(options.arguments[i]);
  }
  command += " --worker-dir " + shell_quoted(worker_dir);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw zeroshard::IoError("cannot start: " + command);
  char line[256];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::size_t finished = 0;
    if (std::sscanf(line, "progress %zu", &finished) == 1 && finished > 0 &&
        finished <= sweep.size()) {
      bar.show(done_before + finished,
               "N=" + std::to_string(world_size) + " " + sweep[finished - 1].label(), false);
    } else {
      std::fputs(line, stderr);  // whatever else a rank printed
    }
  }
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// The records the ranks of one world size wrote, with a "failed" record in place of every one
/// that is missing, so that no configuration silently drops out.
std::vector<Record> collect(const std::string& worker_dir, int world_size,
                            const std::vector<Configuration>& sweep, int exit_code) {
  std::vector<Record> records;
  for (int rank = 0; rank < world_size; ++rank) {
    std::ifstream in(zeroshard::bench::worker_results_path(worker_dir, world_size, rank));
    std::string line;
    std::size_t k = 0;
    for (; k < sweep.size() && std::getline(in, line); ++k) {
      records.push_back(zeroshard::bench::record_from_json(nlohmann::json::parse(line)));
    }
    for (; k < sweep.size(); ++k) {
      Record missing;
      missing.world_size = world_size;
      missing.rank = rank;
      missing.values = sweep[k].values;
      missing.status = "failed: no result (the mpirun of " + std::to_string(world_size) +
                       " ranks exited with code " + std::to_string(exit_code) + ")";
      records.push_back(missing);
    }
  }
  return records;
}

void write_outputs(const BenchOptions& options, const std::vector<Record>& records,
                   const std::vector<std::string>& images) {
  std::ofstream csv(options.csv);
  csv << zeroshard::bench::csv_header() << "\n";
  for (const Record& r : records) csv << zeroshard::bench::csv_row(r) << "\n";
  if (!csv) throw zeroshard::IoError("cannot write " + options.csv);

  nlohmann::json all = nlohmann::json::array();
  for (const Record& r : records) all.push_back(zeroshard::bench::to_json(r));
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const nlohmann::json document = {
      {"command", options.arguments},
      {"model", options.model_description()},
      {"host", host},
      {"cores", sysconf(_SC_NPROCESSORS_ONLN)},
      {"date", date},
      {"device", zeroshard::device_memory_meaning()},
      {"plots", images},
      {"records", all},
  };
  std::ofstream json(options.json);
  json << document.dump(1) << "\n";
  if (!json) throw zeroshard::IoError("cannot write " + options.json);
}

int run_driver(const BenchOptions& options) {
  const std::vector<Configuration> sweep = zeroshard::bench::configurations(options);
  for (const Configuration& c : sweep) zeroshard::bench::engine_config(options, c);  // validates
  std::filesystem::create_directories(options.out_dir);
  for (const std::string& file : {options.csv, options.json}) {
    const auto parent = std::filesystem::path(file).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
  }
  const std::string worker_dir = options.out_dir + "/workers";
  std::filesystem::remove_all(worker_dir);
  std::filesystem::create_directories(worker_dir);

  std::cout << "zeroshard-memory-bench: " << options.model_description() << "; " << sweep.size()
            << " configurations x " << options.world_sizes.size() << " world sizes\n"
            << "  " << zeroshard::device_memory_meaning() << "\n"
            << "  figures per rank (the largest over the ranks); theory = zeroshard-estimate's "
               "figure; ratio = measured / theory; comm buffers: measured peak against the "
               "estimator's bound; GB/MB/kB decimal\n\n";
  ProgressBar bar(sweep.size() * options.world_sizes.size());
  std::vector<Record> records;
  std::size_t done = 0;
  for (int world_size : options.world_sizes) {
    const int exit_code = launch_world(options, world_size, worker_dir, bar, done, sweep);
    done += sweep.size();
    bar.show(done, "N=" + std::to_string(world_size) + " done", true);
    const std::vector<Record> part = collect(worker_dir, world_size, sweep, exit_code);
    records.insert(records.end(), part.begin(), part.end());
  }
  std::filesystem::remove_all(worker_dir);
  // Every worker has exited, so no engine holds a swap file open.
  std::filesystem::remove_all(zeroshard::bench::kNvmeSwapFolder);

  zeroshard::bench::print_table(std::cout, records);
  const std::vector<std::string> images =
      options.plot ? zeroshard::bench::draw_plots(records, options.out_dir,
                                                  "zeroshard " + options.model_description())
                   : std::vector<std::string>{};
  write_outputs(options, records, images);
  std::cout << "\nCSV: " << options.csv << "\nJSON: " << options.json << "\n";
  for (const std::string& image : images) std::cout << "plot: " << image << "\n";
  bool failed = false;
  for (const Record& r : records) failed = failed || r.status.rfind("failed", 0) == 0;
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions options;
  CLI::App app("", "zeroshard-memory-bench");
  zeroshard::bench::add_flags(app, options, argc, argv);
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  try {
    if (!options.worker_dir.empty()) return zeroshard::bench::run_worker(options);
    return run_driver(options);
  } catch (const zeroshard::Error& error) {
    std::cerr << "zeroshard-memory-bench: " << error.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "zeroshard-memory-bench: " << error.what() << "\n";
    return 2;
  }
}
