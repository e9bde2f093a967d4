// zeroshard-reduce-scatter-wire: the bytes one reduce-scatter puts on the wire. Each rank reads its
// network interface's transmit counter (/proc/net/dev, this network namespace's) around K
// reduce-scatters of P fp32 elements and reports bytes per step beside a ring's (N-1)/N * P * 4.
// Meant for one rank per host (tests/multihost/run_multihost.sh wire-bytes), where every byte a
// rank sends to another crosses its interface.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"
#include "transmitted_bytes.h"
#include "zeroshard/zeroshard.h"

namespace {

using zeroshard::Communicator;

constexpr const char* kDescription =
    "The bytes one reduce-scatter puts on the wire, per rank, beside a ring's. The algorithm is "
    "ZEROSHARD_REDUCE_SCATTER's (ring, the default, or mpi).";

struct Options {
  std::string interface;
  std::int64_t elements = 4 << 20;
  int repeats = 4;
  double max_ratio = 0;  // 0: no check
};

void add_flags(CLI::App& app, Options& options) {
  app.add_option("--interface", options.interface,
                 "the network interface the ranks' traffic leaves by (e.g. d0)")
      ->type_name("IF")
      ->required();
  zeroshard::cli::add_integer(app, "--elements", options.elements,
                              "P, fp32 elements reduce-scattered per step")
      ->type_name("P")
      ->capture_default_str();
  zeroshard::cli::add_integer(app, "--repeats", options.repeats, "K, steps measured")
      ->type_name("K")
      ->capture_default_str();
  app.add_option("--max-ratio", options.max_ratio,
                 "exit 1 when any rank sends more than R times a ring's bytes per step")
      ->type_name("R")
      ->check(zeroshard::cli::positive_number());
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app(kDescription, "zeroshard-reduce-scatter-wire");
  add_flags(app, options);
  if (const std::optional<int> exit_code = zeroshard::cli::parse(app, argc, argv)) {
    return *exit_code;
  }
  try {
    const std::unique_ptr<Communicator> comm = Communicator::from_environment();
    const int n = comm->size();
    const char* algorithm = std::getenv("ZEROSHARD_REDUCE_SCATTER");
    // Equal slices but the last, which takes the remainder.
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n), options.elements / n);
    counts.back() += options.elements % n;
    const std::vector<float> input(static_cast<std::size_t>(options.elements), 1.0f);
    std::vector<float> output(
        static_cast<std::size_t>(counts[static_cast<std::size_t>(comm->rank())]));
    // One unmeasured step first: connections are made on first use.
    comm->reduce_scatter(input.data(), output.data(), counts, zeroshard::DType::kFloat32);
    comm->barrier();
    const std::int64_t before = zeroshard::examples::transmitted_bytes(options.interface);
    for (int k = 0; k < options.repeats; ++k) {
      comm->reduce_scatter(input.data(), output.data(), counts, zeroshard::DType::kFloat32);
    }
    const std::int64_t after = zeroshard::examples::transmitted_bytes(options.interface);
    comm->barrier();  // after the reading, so that its messages are not counted
    if (before < 0 || after < 0) {
      std::fprintf(stderr, "zeroshard-reduce-scatter-wire: no interface '%s' in /proc/net/dev\n",
                   options.interface.c_str());
      comm->abort(1);
    }
    const double per_step = static_cast<double>(after - before) / options.repeats;
    // What a ring must send per rank and step: every slice but its own, i.e. (N-1)/N of P.
    const std::int64_t own = counts[static_cast<std::size_t>(comm->rank())];
    const double ring = static_cast<double>(options.elements - own) * sizeof(float);
    const double ratio = ring > 0 ? per_step / ring : 0;
    std::ostringstream line;
    line.precision(4);
    line << std::fixed << ratio << " " << static_cast<std::int64_t>(per_step) << " "
         << static_cast<std::int64_t>(ring);
    const std::vector<std::string> lines = comm->all_gather_text(line.str());
    bool over = false;
    if (comm->rank() == 0) {
      for (int r = 0; r < n; ++r) {
        std::istringstream fields(lines[static_cast<std::size_t>(r)]);
        double r_ratio = 0;
        std::int64_t r_bytes = 0;
        std::int64_t r_ring = 0;
        fields >> r_ratio >> r_bytes >> r_ring;
        std::printf(
            "reduce-scatter %s N=%d P=%lld fp32: rank %d sent %lld bytes/step, ring "
            "%lld, ratio %.4f\n",
            algorithm ? algorithm : "ring", n, static_cast<long long>(options.elements), r,
            static_cast<long long>(r_bytes), static_cast<long long>(r_ring), r_ratio);
        if (options.max_ratio > 0 && r_ratio > options.max_ratio) over = true;
      }
      std::fflush(stdout);
    }
    return over ? 1 : 0;
  } catch (const zeroshard::Error& error) {
    std::fprintf(stderr, "zeroshard-reduce-scatter-wire: %s\n", error.what());
    return 1;
  }
}
