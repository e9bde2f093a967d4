// bench_nvme: the NVMe swapper's sequential write and read throughput on one swap file, in GB/s
// (1e9 bytes/s of payload), with buffer_count requests in flight; benchmarks/run_bench_nvme.sh
// runs fio beside it on the same path, size, block size and queue depth.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include "command_line.h"
#include "offload/nvme_swapper.h"
#include "zeroshard/error.h"

namespace {

struct Options {
  std::string path = ".";
  std::int64_t size = std::int64_t{4} << 30;
  std::int64_t slot_bytes = std::int64_t{64} << 20;
  std::int64_t block_size = std::int64_t{1} << 20;
  std::int64_t queue_depth = 8;
  std::int64_t intra_op = 1;
  int buffers = 2;
  bool keep = false;
  bool sq_poll = false;
};

// BYTES with an optional K, M or G suffix (powers of 1024): 4G, 1.5M, 4096.
std::int64_t parse_size(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  std::int64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = std::int64_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = std::int64_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = std::int64_t{1} << 30;
  if (scale != 1) ++end;
  const auto bytes = static_cast<std::int64_t>(value * static_cast<double>(scale));
  if (end == text.c_str() || *end != '\0' || bytes < 1) {
    throw zeroshard::UsageError(std::string(flag) + ": got '" + text +
                                "', expected a size in bytes with an optional K, M or G suffix");
  }
  return bytes;
}

void add_flags(CLI::App& app, Options& o) {
  const auto size = [](std::int64_t& field, const char* flag) {
    return [&field, flag](const std::string& text) { field = parse_size(text, flag); };
  };
  app.add_option("--path", o.path, "folder of the swap file")
      ->type_name("DIR")
      ->capture_default_str();
  zeroshard::cli::add_read_option(app, "--size", size(o.size, "--size"),
                                  "bytes written and read (default 4G)")
      ->type_name("BYTES");
  zeroshard::cli::add_read_option(app, "--slot-bytes", size(o.slot_bytes, "--slot-bytes"),
                                  "bytes per request (default 64M)")
      ->type_name("BYTES");
  zeroshard::cli::add_read_option(app, "--block-size", size(o.block_size, "--block-size"),
                                  "aio block_size (default 1M)")
      ->type_name("BYTES");
  zeroshard::cli::add_integer(app, "--queue-depth", o.queue_depth, "aio queue_depth")
      ->capture_default_str();
  zeroshard::cli::add_integer(app, "--intra-op", o.intra_op, "aio intra_op_parallelism")
      ->capture_default_str();
  zeroshard::cli::add_integer(app, "--buffers", o.buffers, "requests in flight (buffer_count)")
      ->capture_default_str();
  app.add_flag("--keep", o.keep, "keep the swap file afterwards");
  app.add_flag("--sqpoll", o.sq_poll,
               "a kernel thread polls the submission queue (IORING_SETUP_SQPOLL) where allowed");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app(
      "The NVMe swapper's sequential write and read throughput on one swap file, in GB/s, with "
      "--buffers requests in flight.",
      "bench_nvme");
  add_flags(app, o);
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  try {
    namespace zd = zeroshard::detail;
    zd::NvmeSwapperOptions options;
    options.directory = o.path;
    options.kind = "bench";
    options.slot_bytes = std::min(o.slot_bytes, o.size);
    options.slot_count = (o.size + options.slot_bytes - 1) / options.slot_bytes;
    options.buffer_count = o.buffers;
    options.aio.block_size = o.block_size;
    options.aio.queue_depth = o.queue_depth;
    options.aio.intra_op_parallelism = o.intra_op;
    options.ring.sq_poll = o.sq_poll;
    zd::NvmeSwapper swapper(options);
    for (int b = 0; b < swapper.buffer_count(); ++b) {
      std::memset(swapper.buffer(b).data(), 0x5A + b, swapper.buffer(b).size());
    }
    const double payload = static_cast<double>(options.slot_count * options.slot_bytes);
    std::printf(
        "bench_nvme: %s, %lld slots of %lld bytes (%.2f GiB), block %lld, depth %lld, "
        "intra-op %lld, %d buffers, buffers %sregistered, file %sregistered, sqpoll %s\n",
        swapper.path().c_str(), static_cast<long long>(options.slot_count),
        static_cast<long long>(options.slot_bytes), payload / (1 << 30),
        static_cast<long long>(o.block_size), static_cast<long long>(o.queue_depth),
        static_cast<long long>(o.intra_op), o.buffers, swapper.buffers_registered() ? "" : "NOT ",
        swapper.file_registered() ? "" : "NOT ", swapper.sq_polling() ? "on" : "off");

    // One op per buffer in flight; the oldest is waited for before its buffer is reused.
    const auto run = [&](bool write) {
      std::deque<zd::SwapTicket> in_flight;
      const auto start = std::chrono::steady_clock::now();
      for (std::int64_t slot = 0; slot < options.slot_count; ++slot) {
        if (static_cast<int>(in_flight.size()) == swapper.buffer_count()) {
          swapper.wait(in_flight.front());
          in_flight.pop_front();
        }
        const int buffer = static_cast<int>(slot % swapper.buffer_count());
        in_flight.push_back(write ? swapper.write(slot, buffer) : swapper.read(slot, buffer));
      }
      while (!in_flight.empty()) {
        swapper.wait(in_flight.front());
        in_flight.pop_front();
      }
      return payload / seconds_since(start) / 1e9;
    };
    const double write_gbps = run(true);
    const double read_gbps = run(false);
    std::printf("swapper write GB/s: %.3f\n", write_gbps);
    std::printf("swapper read GB/s: %.3f\n", read_gbps);
    const std::string file = swapper.path();
    if (!o.keep) std::filesystem::remove(file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nvme: %s\n", e.what());
    return 1;
  }
  return 0;
}
