// CRC32C: a slicing table for any CPU and the SSE4.2 instruction, picked once at run time.
#include "crc32c.h"

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

// Only this function is compiled for SSE4.2, so the library still runs on any x86-64 CPU.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hardware(const void* data, std::size_t bytes,
                                                                std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --bytes;
  }
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
