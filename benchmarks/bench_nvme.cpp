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
#include <string>

#include "nvme_swapper.h"
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
};

void usage() {
  std::fprintf(stderr,
               "usage: bench_nvme [--path DIR] [--size BYTES] [--slot-bytes BYTES]\n"
               "                  [--block-size BYTES] [--queue-depth N] [--intra-op N]\n"
               "                  [--buffers N] [--keep]\n"
               "sizes take a K, M or G suffix (powers of 1024); defaults: --size 4G,\n"
               "--slot-bytes 64M, --block-size 1M, --queue-depth 8, --intra-op 1, --buffers 2\n");
}

std::int64_t parse_size(const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  std::int64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = std::int64_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = std::int64_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = std::int64_t{1} << 30;
  return static_cast<std::int64_t>(value * static_cast<double>(scale));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--path") {
      o.path = next();
    } else if (arg == "--size") {
      o.size = parse_size(next());
    } else if (arg == "--slot-bytes") {
      o.slot_bytes = parse_size(next());
    } else if (arg == "--block-size") {
      o.block_size = parse_size(next());
    } else if (arg == "--queue-depth") {
      o.queue_depth = std::atoll(next());
    } else if (arg == "--intra-op") {
      o.intra_op = std::atoll(next());
    } else if (arg == "--buffers") {
      o.buffers = std::atoi(next());
    } else if (arg == "--keep") {
      o.keep = true;
    } else {
      usage();
      return 2;
    }
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
    zd::NvmeSwapper swapper(options);
    for (int b = 0; b < swapper.buffer_count(); ++b) {
      std::memset(swapper.buffer(b).data(), 0x5A + b, swapper.buffer(b).size());
    }
    const double payload = static_cast<double>(options.slot_count * options.slot_bytes);
    std::printf(
        "bench_nvme: %s, %lld slots of %lld bytes (%.2f GiB), block %lld, depth %lld, "
        "intra-op %lld, %d buffers, buffers %sregistered\n",
        swapper.path().c_str(), static_cast<long long>(options.slot_count),
        static_cast<long long>(options.slot_bytes), payload / (1 << 30),
        static_cast<long long>(o.block_size), static_cast<long long>(o.queue_depth),
        static_cast<long long>(o.intra_op), o.buffers, swapper.buffers_registered() ? "" : "NOT ");

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
