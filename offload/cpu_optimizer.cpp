// Choosing the CPU rules' instruction set at run time, and spreading large shards over OpenMP
// threads in tiles.
#include "cpu_optimizer.h"

#include <cstdlib>
#include <string>

#include "config/config_values.h"
#include "zeroshard/error.h"

namespace zeroshard::detail::cpu_optimizer {
namespace {

// Below this many elements a call stays on the caller's thread: waking a team costs more than it
// saves, and the engine's tests run several MPI ranks per core, where idle OpenMP threads spin.
constexpr std::int64_t kThreadedFrom = std::int64_t{1} << 20;
// A tile is a multiple of 16 elements, so every tile but the last starts on a 64-byte boundary
// when the slice does, and no two threads write the same cache line.
constexpr std::int64_t kTile = std::int64_t{1} << 16;

const KernelTable& kernels(Isa isa) {
  if (!supported(isa)) {
    throw UsageError(std::string("the ") + to_string(isa) +
                     " path of the CPU update rules is not available on this CPU or build");
  }
  switch (isa) {
#if defined(ZEROSHARD_CPU_X86)
    case Isa::kAvx512:
      return kAvx512Kernels;
    case Isa::kAvx2:
      return kAvx2Kernels;
#endif
    default:
      return kScalarKernels;
  }
}

Isa widest_supported() noexcept {
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (supported(isa)) return isa;
  }
  return Isa::kScalar;
}

Isa isa_from_environment() {
  const char* value = std::getenv("ZEROSHARD_CPU_ISA");
  if (value == nullptr || *value == '\0') return widest_supported();
  const std::string name = ascii_lower(value);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (name != to_string(isa)) continue;
    if (!supported(isa)) {
      throw UsageError("ZEROSHARD_CPU_ISA=" + name + ": this CPU (or this build) has no " + name +
                       " path; the widest it supports is " + to_string(widest_supported()));
    }
    return isa;
  }
  throw UsageError("ZEROSHARD_CPU_ISA='" + std::string(value) +
                   "': expected avx512, avx2 or scalar, or unset to use the widest the CPU has");
}

// Runs `range(begin, end)` over [0, n), in tiles over the OpenMP team when n is large. `range`
// must not throw: an exception cannot leave an OpenMP region, so callers look their loop up (and
// have an unsupported path refused) before they get here.
template <typename Range>
void over_tiles(std::int64_t n, const Range& range) {
  if (n < kThreadedFrom) {
    range(0, n);
    return;
  }
  const std::int64_t tiles = (n + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < tiles; ++t) {
    const std::int64_t begin = t * kTile;
    range(begin, begin + kTile < n ? begin + kTile : n);
  }
}

}  // namespace

const char* to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool supported(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if defined(ZEROSHARD_CPU_X86)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

Isa active_isa() {
  static const Isa isa = isa_from_environment();
  return isa;
}

void adam(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdamScalars& s, bool amsgrad) {
  const auto loop = amsgrad ? kernels(isa).adam_amsgrad : kernels(isa).adam;
  over_tiles(n, [&](std::int64_t begin, std::int64_t end) { loop(arrays, begin, end, s); });
}

void sgd(Isa isa, const RuleArrays& arrays, std::int64_t n, const SgdScalars& s, SgdKind kind) {
  const KernelTable& table = kernels(isa);
  const auto loop = kind == SgdKind::kPlain      ? table.sgd_plain
                    : kind == SgdKind::kMomentum ? table.sgd_momentum
                                                 : table.sgd_nesterov;
  over_tiles(n, [&](std::int64_t begin, std::int64_t end) { loop(arrays, begin, end, s); });
}

void lion(Isa isa, const RuleArrays& arrays, std::int64_t n, const LionScalars& s) {
  const auto loop = kernels(isa).lion;
  over_tiles(n, [&](std::int64_t begin, std::int64_t end) { loop(arrays, begin, end, s); });
}

void adagrad(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdagradScalars& s) {
  const auto loop = kernels(isa).adagrad;
  over_tiles(n, [&](std::int64_t begin, std::int64_t end) { loop(arrays, begin, end, s); });
}

}  // namespace zeroshard::detail::cpu_optimizer
