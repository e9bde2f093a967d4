// Choosing the CPU rules' instruction set at run time, spreading large shards over OpenMP
// threads in tiles, and widening 16-bit gradients and narrowing the weights' copy chunk by chunk
// inside each tile, so that every array is streamed from memory once.
#include "kernels/cpu/cpu_optimizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "memory/host_first_touch.h"  // kFirstTouchTile, kFirstTouchThreadedFrom
#include "precision/half_conversion.h"
#include "util/cpu_team.h"
#include "util/text.h"
#include "zeroshard/error.h"

namespace zeroshard::detail::cpu_optimizer {
namespace {

// Below this many elements a call stays on the caller's thread: waking a team costs more than it
// saves, and the engine's tests run several MPI ranks per core, where idle OpenMP threads spin.
constexpr std::int64_t kThreadedFrom = std::int64_t{1} << 20;
// A tile is a multiple of 16 elements, so every tile but the last starts on a 64-byte boundary
// when the slice does, and no two threads write the same cache line.
constexpr std::int64_t kTile = kSquareTile;
// The conversions work on chunks small enough that the widened gradient and the updated weights
// are still in L1 when the rule and the narrowing read them: 4 KiB per fp32 array (measured
// faster than 2048 and 4096 on a 32 KiB L1). A multiple of 16 that divides kTile, so chunks keep
// the tiles' 64-byte alignment.
constexpr std::int64_t kChunk = 1024;
static_assert(kTile % kChunk == 0 && kChunk % 16 == 0);
// Host arrays are first touched in the same tiles and schedule (memory/host_first_touch.h).
static_assert(kFirstTouchTile == kTile * sizeof(float) &&
              kFirstTouchThreadedFrom == kThreadedFrom * sizeof(std::uint16_t));

// Whether the CPU runs each path, asked once: CPUID (behind cpu_has_f16c) traps to the hypervisor
// in a VM (3-11 us each where measured), and callers look a path up once per call.
bool probe_support(Isa isa) noexcept {
  switch (isa) {
    case Isa::kScalar:
      return true;
#if defined(ZEROSHARD_CPU_X86)
    case Isa::kAvx2:
      // F16C for the fp16 gradient and copy in Adam's loop, FMA for the norm's scan; every AVX2
      // CPU has both.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::kAvx512:
      // BW for the 16-bit lanes of the bf16 gradient and copy in the rule's loop; F16C for the
      // scan's 256-bit fp16 loads, which both vector paths share (every AVX-512 CPU has it).
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             cpu_has_f16c();
#endif
    default:
      return false;
  }
}

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

// Calls `tile(t, begin, end)` for each tile of [0, n): on the caller's thread below
// kThreadedFrom, over the OpenMP team in the update's static schedule from there on. The tiles
// are the same whatever the thread count, so results kept per tile do not depend on it.
template <typename Tile>
void for_each_tile(std::int64_t n, const Tile& tile) {
  const std::int64_t tiles = (n + kTile - 1) / kTile;
  if (n < kThreadedFrom) {
    for (std::int64_t t = 0; t < tiles; ++t) tile(t, t * kTile, std::min(n, (t + 1) * kTile));
    return;
  }
#pragma omp parallel for schedule(static) num_threads(cpu_team_size())
  for (std::int64_t t = 0; t < tiles; ++t) tile(t, t * kTile, std::min(n, (t + 1) * kTile));
}

// Runs `range(begin, end)` over [0, n): in one call on the caller's thread when n is small, else
// once per tile over the OpenMP team. `range` must not throw: an exception cannot leave an OpenMP
// region, so callers look their loop up (and have an unsupported path refused) before they get
// here.
template <typename Range>
void over_tiles(std::int64_t n, const Range& range) {
  if (n < kThreadedFrom) {
    range(0, n);
    return;
  }
  for_each_tile(n, [&](std::int64_t, std::int64_t begin, std::int64_t end) { range(begin, end); });
}

template <typename Scalars>
using Loop = void (*)(const ChunkArrays&, std::int64_t, const Scalars&);

// Elements [begin, end) of `a` through `loop`: in chunks when the gradient must be widened or
// cleared or the weights narrowed, in one call otherwise. Per element the chunks compute exactly
// what separate passes would (the conversions are the ones half_conversion.h does alone), so
// chunking changes only where the data is when it is read.
template <typename Scalars>
void fused_range(const RuleArrays& a, int state_count, Loop<Scalars> loop, const Scalars& s,
                 std::int64_t begin, std::int64_t end) noexcept {
  const auto chunk_at = [&](std::int64_t at) {
    ChunkArrays chunk{
        .param = a.param + at, .grad = nullptr, .states = {}, .grad_factor = a.grad_factor};
    for (int k = 0; k < state_count; ++k) chunk.states[k] = a.states[k] + at;
    return chunk;
  };
  const bool widen = a.grad_dtype != DType::kFloat32;
  if (!widen && a.param_copy == nullptr && a.grad_to_clear == nullptr) {
    ChunkArrays whole = chunk_at(begin);
    whole.grad = static_cast<const float*>(a.grad) + begin;
    loop(whole, end - begin, s);
    return;
  }
  const auto* grad_bytes = static_cast<const unsigned char*>(a.grad);
  auto* copy_bytes = static_cast<unsigned char*>(a.param_copy);
  auto* clear_bytes = static_cast<unsigned char*>(a.grad_to_clear);
  const auto grad_size = static_cast<std::int64_t>(size_of(a.grad_dtype));
  const auto copy_size = static_cast<std::int64_t>(size_of(a.param_copy_dtype));
  alignas(64) float widened[kChunk];
  for (std::int64_t at = begin; at < end; at += kChunk) {
    const std::int64_t count = end - at < kChunk ? end - at : kChunk;
    ChunkArrays chunk = chunk_at(at);
    if (widen) {
      convert_to_float(grad_bytes + at * grad_size, a.grad_dtype, widened, count);
      chunk.grad = widened;
    } else {
      chunk.grad = static_cast<const float*>(a.grad) + at;
    }
    loop(chunk, count, s);
    if (copy_bytes != nullptr) {
      convert_from_float(chunk.param, copy_bytes + at * copy_size, a.param_copy_dtype, count);
    }
    if (clear_bytes != nullptr) {
      std::memset(clear_bytes + at * grad_size, 0, static_cast<std::size_t>(count * grad_size));
    }
  }
}

template <typename Scalars>
void run(const RuleArrays& a, std::int64_t n, int state_count, Loop<Scalars> loop,
         const Scalars& s) {
  over_tiles(n, [&](std::int64_t begin, std::int64_t end) {
    fused_range(a, state_count, loop, s, begin, end);
  });
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
  // A function-local static: initialised once, thread-safely, on the first call.
  static const std::array<bool, 3> table = [] {
#if defined(ZEROSHARD_CPU_X86)
    // The first call may come from another file's static initialiser, before libgcc's own.
    __builtin_cpu_init();
#endif
    return std::array<bool, 3>{probe_support(Isa::kScalar), probe_support(Isa::kAvx2),
                               probe_support(Isa::kAvx512)};
  }();
  const auto index = static_cast<std::size_t>(isa);
  return index < table.size() && table[index];
}

Isa active_isa() {
  static const Isa isa = isa_from_environment();
  return isa;
}

void adam(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdamScalars& s, bool amsgrad) {
  const KernelTable& table = kernels(isa);
  const bool fp16_in_loop = table.adam_streams_fp16;
  const bool grad_16_bit = arrays.grad_dtype == DType::kBFloat16 ||
                           (fp16_in_loop && arrays.grad_dtype == DType::kFloat16);
  const bool grad_in_loop = arrays.grad_dtype == DType::kFloat32 || grad_16_bit;
  // A 16-bit gradient with a copy of its own type, or an fp32 gradient with a 16-bit copy: the
  // pairs the engine makes.
  const bool copy_in_loop =
      arrays.param_copy == nullptr ||
      (grad_16_bit ? arrays.param_copy_dtype == arrays.grad_dtype
                   : arrays.param_copy_dtype == DType::kBFloat16 ||
                         (fp16_in_loop && arrays.param_copy_dtype == DType::kFloat16));
  // The loop clears what it reads: only where grad_to_clear is the gradient itself, as
  // RuleArrays asks; anything else goes through the chunks, which clear grad_to_clear.
  const bool clear_in_loop = arrays.grad_to_clear == nullptr || arrays.grad_to_clear == arrays.grad;
  const bool plain = arrays.grad_dtype == DType::kFloat32 && arrays.param_copy == nullptr &&
                     arrays.grad_to_clear == nullptr;
  if (plain || !grad_in_loop || !copy_in_loop || !clear_in_loop) {
    run(arrays, n, amsgrad ? 3 : 2, amsgrad ? table.adam_amsgrad : table.adam, s);
    return;
  }
  // bf16 needs only integer steps, which every path vectorises, so it is widened and rounded in
  // the rule's loop; fp16 is too on the vector paths, with F16C, and goes through the chunked
  // passes on the scalar one.
  over_tiles(n, [&](std::int64_t begin, std::int64_t end) {
    const std::int64_t grad_size = grad_16_bit ? 2 : 4;
    StreamedChunk chunk{.param = arrays.param + begin,
                        .grad = static_cast<const unsigned char*>(arrays.grad) + begin * grad_size,
                        .states = {arrays.states[0] + begin, arrays.states[1] + begin,
                                   amsgrad ? arrays.states[2] + begin : nullptr},
                        .grad_factor = arrays.grad_factor,
                        .copy = arrays.param_copy == nullptr
                                    ? nullptr
                                    : static_cast<std::uint16_t*>(arrays.param_copy) + begin,
                        .grad_dtype = arrays.grad_dtype,
                        .copy_dtype = arrays.param_copy_dtype,
                        .clear_grad = arrays.grad_to_clear != nullptr};
    table.adam_streamed(chunk, end - begin, s, amsgrad);
  });
}

void sgd(Isa isa, const RuleArrays& arrays, std::int64_t n, const SgdScalars& s, SgdKind kind) {
  const KernelTable& table = kernels(isa);
  const auto loop = kind == SgdKind::kPlain      ? table.sgd_plain
                    : kind == SgdKind::kMomentum ? table.sgd_momentum
                                                 : table.sgd_nesterov;
  run(arrays, n, kind == SgdKind::kPlain ? 0 : 1, loop, s);
}

void lion(Isa isa, const RuleArrays& arrays, std::int64_t n, const LionScalars& s) {
  run(arrays, n, 1, kernels(isa).lion, s);
}

void adagrad(Isa isa, const RuleArrays& arrays, std::int64_t n, const AdagradScalars& s) {
  run(arrays, n, 1, kernels(isa).adagrad, s);
}

void add_square_sums(Isa isa, const float* values, std::int64_t n, double* lanes) {
  kernels(isa).square_sums(values, n, lanes);
}

namespace {

double lane_sum(const double* lanes) {
  double sum = 0.0;
  for (int lane = 0; lane < kSquareLanes; ++lane) sum += lanes[lane];
  return sum;
}

// Adds the squares of values[begin, end) into `lanes` on `table`'s path. Must not throw: it runs
// inside OpenMP regions.
void add_range(const KernelTable& table, const void* values, DType dtype, std::int64_t begin,
               std::int64_t end, double* lanes) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(values);
  const auto size = static_cast<std::int64_t>(size_of(dtype));
  const auto in_loop = dtype == DType::kBFloat16  ? table.square_sums_bf16
                       : dtype == DType::kFloat16 ? table.square_sums_fp16
                                                  : nullptr;
  if (dtype == DType::kFloat32) {
    table.square_sums(static_cast<const float*>(values) + begin, end - begin, lanes);
  } else if (in_loop != nullptr) {
    in_loop(bytes + begin * size, end - begin, lanes);
  } else {
    // Widened a chunk at a time into L1; chunks are multiples of 16, so the lanes see each
    // element where one call over the widened tile would put it.
    alignas(64) float widened[kChunk];
    for (std::int64_t at = begin; at < end; at += kChunk) {
      const std::int64_t count = std::min(kChunk, end - at);
      convert_to_float(bytes + at * size, dtype, widened, count);
      table.square_sums(widened, count, lanes);
    }
  }
}

}  // namespace

double SquareSums::total() const { return in_tile > 0 ? tiles + lane_sum(lanes) : tiles; }

void SquareSums::add_tiles(std::span<const double> tile_sums) {
  for (double sum : tile_sums) tiles += sum;
}

void tile_square_sums(Isa isa, const void* values, DType dtype, std::int64_t tiles, double* sums) {
  if (tiles <= 0) return;
  const KernelTable& table = kernels(isa);  // refused here, before any thread starts
  for_each_tile(tiles * kTile, [&](std::int64_t t, std::int64_t begin, std::int64_t end) {
    double lanes[kSquareLanes] = {};
    add_range(table, values, dtype, begin, end, lanes);
    sums[t] = lane_sum(lanes);
  });
}

void add_sum_of_squares(Isa isa, const void* values, DType dtype, std::int64_t n,
                        SquareSums& sums) {
  if (n <= 0) return;
  const KernelTable& table = kernels(isa);
  const auto* bytes = static_cast<const unsigned char*>(values);
  const auto size = static_cast<std::int64_t>(size_of(dtype));
  // The tile an earlier range left unfinished takes this range's first elements.
  std::int64_t done = 0;
  if (sums.in_tile > 0) {
    done = std::min(n, kTile - sums.in_tile);
    add_range(table, values, dtype, 0, done, sums.lanes);
    sums.in_tile += done;
    if (sums.in_tile == kTile) {
      sums.tiles += lane_sum(sums.lanes);
      sums = SquareSums{.tiles = sums.tiles};
    }
  }
  // One partial per whole tile, added in tile order: the same additions whichever thread ran it.
  const std::int64_t whole_tiles = (n - done) / kTile;
  if (whole_tiles > 0) {
    std::vector<double> partials(static_cast<std::size_t>(whole_tiles));
    tile_square_sums(isa, bytes + done * size, dtype, whole_tiles, partials.data());
    sums.add_tiles(partials);
    done += whole_tiles * kTile;
  }
  if (done < n) {
    add_range(table, values, dtype, done, n, sums.lanes);
    sums.in_tile += n - done;
  }
}

double sum_of_squares(Isa isa, const void* values, DType dtype, std::int64_t n) {
  SquareSums sums;
  add_sum_of_squares(isa, values, dtype, n, sums);
  return sums.total();
}

}  // namespace zeroshard::detail::cpu_optimizer
