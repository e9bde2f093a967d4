// zeroshard-checkpoint-bench: per-rank throughput of Engine::save_checkpoint (timed to its commit)
// and load_checkpoint, beside a plain sequential write (with fsync of the file and the folder)
// and a plain read of the same bytes in the same folder, measured in the same run, every rank at
// once. Page-cache pages of every file are dropped (posix_fadvise DONTNEED, after fsync) before
// each read, so the reads come from the disk; the plain read is also timed through O_DIRECT,
// the way the loader reads.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_median.h"
#include "command_line.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::bench::median;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kDescription =
    "Save and load throughput per rank beside plain sequential write (with fsync) and read of "
    "the same bytes in the same folder. Run under mpirun for several ranks, e.g.\n"
    "  mpirun -np 2 zeroshard-checkpoint-bench --dir /data";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void drop_cached_pages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cached_folder(const std::string& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) drop_cached_pages(entry.path().string());
  }
}

void check_io(bool ok, const char* what, const std::string& path) {
  if (!ok) throw zeroshard::IoError(std::string(what) + " " + path + ": " + std::strerror(errno));
}

double plain_write(const std::string& path, const std::vector<char>& bytes) {
  fs::remove(path);
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  check_io(fd >= 0, "cannot create", path);
  // The same write size as the checkpoint writer uses (16 MiB).
  constexpr std::size_t kChunk = std::size_t{1} << 24;
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, std::min(kChunk, bytes.size() - at));
    check_io(n > 0, "cannot write", path);
    at += static_cast<std::size_t>(n);
  }
  check_io(::fsync(fd) == 0, "cannot fsync", path);
  ::close(fd);
  const int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  ::fsync(dir);
  ::close(dir);
  return seconds_since(start);
}

double plain_read(const std::string& path, std::vector<char>& bytes) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  check_io(fd >= 0, "cannot open", path);
  constexpr std::size_t kChunk = std::size_t{1} << 24;
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n =
        ::pread(fd, bytes.data() + at, std::min(kChunk, bytes.size() - at), static_cast<off_t>(at));
    check_io(n > 0, "cannot read", path);
    at += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return seconds_since(start);
}

// The same read through O_DIRECT (no page cache), as load_checkpoint reads aligned sections:
// the floor a loader could reach on this disk. Needs a 4096-aligned buffer; -1 when the file
// system refuses O_DIRECT.
double direct_read(const std::string& path, char* aligned, std::size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return -1.0;
  const auto start = Clock::now();
  constexpr std::size_t kChunk = std::size_t{1} << 24;
  for (std::size_t at = 0; at < bytes;) {
    const ssize_t n =
        ::pread(fd, aligned + at, std::min(kChunk, bytes - at), static_cast<off_t>(at));
    check_io(n > 0, "cannot read (O_DIRECT)", path);
    at += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::int64_t mib = 1024;
  int repeats = 3;
  bool check = false;
  CLI::App app(kDescription, "zeroshard-checkpoint-bench");
  app.add_option("--dir", dir,
                 "folder for the checkpoints and the baseline files (removed afterwards)")
      ->required();
  zeroshard::cli::add_integer(app, "--mib", mib,
                              "MiB of fp32 master weights per rank, the whole shard file")
      ->type_name("M")
      ->capture_default_str();
  zeroshard::cli::add_integer(app, "--repeats", repeats,
                              "rounds; the median of each figure is reported")
      ->type_name("R")
      ->capture_default_str();
  app.add_flag("--check", check, "exit 1 unless every figure is positive (for the test suite)");
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  try {
    std::unique_ptr<zeroshard::Communicator> program_comm =
        zeroshard::Communicator::from_environment();
    const int rank = program_comm->rank();
    const int world = program_comm->size();
    // Plain SGD keeps no state: the shard file is exactly the rank's fp32 master weights. Stage 3
    // keeps only the shard of the parameters, so a rank holds its 1 GiB once (the master is the
    // parameter shard under fp32), plus the same again as the gradient shard.
    zeroshard::Config config;
    config.train_micro_batch_size_per_gpu = 1;
    config.steps_per_print = 0;
    config.zero_optimization.stage = 3;
    config.zero_optimization.reduce_bucket_size = 1 << 20;
    config.zero_optimization.allgather_bucket_size = 1 << 20;
    zeroshard::SgdOptions sgd;
    zeroshard::Engine engine(config, zeroshard::Communicator::from_environment(),
                             zeroshard::make_sgd(sgd));
    const std::int64_t per_rank = mib * (std::int64_t{1} << 18);
    engine.register_parameter("weight", {per_rank * world});
    engine.finalize();
    const std::size_t bytes =
        static_cast<std::size_t>(engine.shard_end() - engine.shard_begin()) * 4;

    if (rank == 0) {
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    program_comm->barrier();
    const std::string ckpt = dir + "/ckpt";
    const std::string plain = dir + "/plain_rank" + std::to_string(rank) + ".bin";
    std::vector<char> buffer(bytes);
    for (std::size_t i = 0; i < bytes; ++i) buffer[i] = static_cast<char>(i * 131 + 7);
    std::unique_ptr<char, decltype(&std::free)> aligned(
        static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)), &std::free);
    std::memcpy(aligned.get(), buffer.data(), bytes);
    std::vector<double> save_s, load_s, write_s, read_s, direct_s;
    for (int r = 0; r < repeats; ++r) {
      const std::string tag = "round" + std::to_string(r);
      program_comm->barrier();
      write_s.push_back(plain_write(plain, buffer));
      program_comm->barrier();
      auto start = Clock::now();
      engine.save_checkpoint(ckpt, tag);
      save_s.push_back(seconds_since(start));
      drop_cached_pages(plain);
      if (rank == 0) drop_cached_folder(ckpt);
      program_comm->barrier();
      read_s.push_back(plain_read(plain, buffer));
      drop_cached_pages(plain);
      program_comm->barrier();
      direct_s.push_back(direct_read(plain, aligned.get(), bytes));
      program_comm->barrier();
      start = Clock::now();
      engine.load_checkpoint(ckpt, tag);
      load_s.push_back(seconds_since(start));
      program_comm->barrier();
      if (rank == 0) fs::remove_all(ckpt + "/" + tag);
    }
    const double gib = static_cast<double>(bytes) / (1 << 30);
    const double figures[4] = {gib / median(write_s), gib / median(save_s), gib / median(read_s),
                               gib / median(load_s)};
    const double direct = median(direct_s) > 0.0 ? gib / median(direct_s) : 0.0;
    char line[320];
    std::snprintf(line, sizeof(line),
                  "rank %d: %.3f GiB | write+fsync %.3f GiB/s | save %.3f GiB/s (%.0f%%) | read "
                  "%.3f GiB/s | load %.3f GiB/s (%.0f%%) | read O_DIRECT %.3f GiB/s (load %.0f%% "
                  "of it)\n",
                  rank, gib, figures[0], figures[1], 100.0 * figures[1] / figures[0], figures[2],
                  figures[3], 100.0 * figures[3] / figures[2], direct,
                  direct > 0.0 ? 100.0 * figures[3] / direct : 0.0);
    const std::vector<std::string> lines = program_comm->all_gather_text(line);
    program_comm->barrier();
    if (rank == 0) {
      std::printf("zeroshard-checkpoint-bench: %d rank(s), %s, median of %d round(s)\n", world,
                  dir.c_str(), repeats);
      for (const std::string& l : lines) std::printf("%s", l.c_str());
      fs::remove_all(dir);
    }
    if (check) {
      for (double f : figures) {
        if (!(f > 0.0)) return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zeroshard-checkpoint-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
