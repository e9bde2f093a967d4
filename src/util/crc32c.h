// CRC32C (Castagnoli), the checksum of every swap record: the SSE4.2 crc32 instruction where the
// CPU has it (chosen at run time), a table-driven loop elsewhere; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zeroshard::detail {

/// CRC32C of `bytes` bytes at `data`, continuing from `crc` (0 to start); "123456789" gives
/// 0xE3069283. Uses crc32c_hardware when the CPU supports it.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;
/// The portable table-driven path, on any CPU.
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;
/// Whether this CPU has the SSE4.2 crc32 instruction (always false off x86-64).
bool crc32c_hardware_available() noexcept;
/// The SSE4.2 path; call only when crc32c_hardware_available().
std::uint32_t crc32c_hardware(const void* data, std::size_t bytes, std::uint32_t crc = 0) noexcept;

}  // namespace zeroshard::detail
