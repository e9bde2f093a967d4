// CRC32C: a slicing table for any CPU and the SSE4.2 instruction, picked once at run time.
#include "util/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>  // _mm_crc32_u8, _mm_crc32_u64
#endif

namespace zeroshard::detail {
namespace {

// The reflected Castagnoli polynomial.
constexpr std::uint32_t kPolynomial = 0x82F63B78u;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    table[i] = crc;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> kTable = make_table();

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < bytes; ++i) crc = kTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)
bool crc32c_hardware_available() noexcept {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}

namespace {

// The crc32 instruction has a latency of three cycles and a throughput of one, so three streams
// over three consecutive blocks run three times as fast as one; their registers are joined by
// shifting the first through the others' lengths of zero bytes, which is linear over GF(2) and so
// a table lookup per byte of the register.
constexpr std::size_t kLongBlock = 8192;
constexpr std::size_t kShortBlock = 256;

std::uint32_t gf2_times(const std::uint32_t* matrix, std::uint32_t vector) noexcept {
  std::uint32_t sum = 0;
  for (; vector != 0; vector >>= 1, ++matrix) {
    if (vector & 1u) sum ^= *matrix;
  }
  return sum;
}

void gf2_square(std::uint32_t* square, const std::uint32_t* matrix) noexcept {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(matrix, matrix[n]);
}

/// The register shifted through `bytes` zero bytes (a power of two), as four byte tables.
struct ZeroShift {
  std::array<std::array<std::uint32_t, 256>, 4> table{};

  explicit ZeroShift(std::size_t bytes) noexcept {
    std::uint32_t odd[32];
    std::uint32_t even[32];
    odd[0] = kPolynomial;  // one zero bit
    for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
    gf2_square(even, odd);  // two zero bits
    gf2_square(odd, even);  // four
    const std::uint32_t* shift = nullptr;
    for (;;) {
      gf2_square(even, odd);  // eight, then 32, 128, ...
      shift = even;
      bytes >>= 1;
      if (bytes == 0) break;
      gf2_square(odd, even);
      shift = odd;
      bytes >>= 1;
      if (bytes == 0) break;
    }
    for (std::uint32_t n = 0; n < 256; ++n) {
      for (int k = 0; k < 4; ++k) table[k][n] = gf2_times(shift, n << (8 * k));
    }
  }
  std::uint32_t operator()(std::uint32_t crc) const noexcept {
    return table[0][crc & 0xFFu] ^ table[1][(crc >> 8) & 0xFFu] ^ table[2][(crc >> 16) & 0xFFu] ^
           table[3][crc >> 24];
  }
};

/// Three streams over blocks of `block` bytes while at least three are left.
__attribute__((target("sse4.2"))) std::uint64_t crc32c_three_way(std::uint64_t c,
                                                                 const unsigned char*& p,
                                                                 std::size_t& bytes,
                                                                 std::size_t block,
                                                                 const ZeroShift& shift) noexcept {
  while (bytes >= 3 * block) {
    std::uint64_t c1 = 0;
    std::uint64_t c2 = 0;
    for (std::size_t i = 0; i < block; i += 8) {
      std::uint64_t w0;
      std::uint64_t w1;
      std::uint64_t w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + block + i, 8);
      std::memcpy(&w2, p + 2 * block + i, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c = shift(static_cast<std::uint32_t>(c)) ^ c1;
    c = shift(static_cast<std::uint32_t>(c)) ^ c2;
    p += 3 * block;
    bytes -= 3 * block;
  }
  return c;
}

}  // namespace

// Only these functions are compiled for SSE4.2, so the library still runs on any x86-64 CPU.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hardware(const void* data, std::size_t bytes,
                                                                std::uint32_t crc) noexcept {
  static const ZeroShift long_shift(kLongBlock);
  static const ZeroShift short_shift(kShortBlock);
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --bytes;
  }
  c = crc32c_three_way(c, p, bytes, kLongBlock, long_shift);
  c = crc32c_three_way(c, p, bytes, kShortBlock, short_shift);
  while (bytes >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    bytes -= 8;
  }
  while (bytes > 0) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --bytes;
  }
  return ~static_cast<std::uint32_t>(c);
}
#else
bool crc32c_hardware_available() noexcept { return false; }
std::uint32_t crc32c_hardware(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  return crc32c_portable(data, bytes, crc);
}
#endif

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) noexcept {
  return crc32c_hardware_available() ? crc32c_hardware(data, bytes, crc)
                                     : crc32c_portable(data, bytes, crc);
}

}  // namespace zeroshard::detail
