// The one exception hierarchy of zeroshard: every error the library raises derives from Error
// and carries one code from a small closed set.
#pragma once

#include <stdexcept>
#include <string>

#include "zeroshard/export.h"

namespace zeroshard {

/// The closed set of error kinds; `Error::code()` returns one of them.
enum class ErrorCode {
  kInvalidConfig,
  kInvalidUsage,
  kCuda,
  kNccl,
  kMpi,
  kIo,
  kOutOfMemory,
  kTimeout,
};

/// Returns a short lower-case name of `code`, e.g. "invalid config".
ZEROSHARD_API const char* to_string(ErrorCode code) noexcept;

/// Base of every exception zeroshard throws. The message says what went wrong, where (key path,
/// file, rank) and what to do about it.
class ZEROSHARD_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

/// A configuration value is missing, unknown, of the wrong type or out of range. `key_path()`
/// names the offending key, e.g. "zero_optimization.offload_optimizer.device", with keys from
/// the file escaped and cut as messages show them ("stage\u0000x"); "" when no key applies.
class ZEROSHARD_API ConfigError : public Error {
 public:
  ConfigError(std::string key_path, const std::string& message);
  const std::string& key_path() const noexcept { return key_path_; }

 private:
  std::string key_path_;
};

/// The library was called in a way its contract forbids (e.g. reading a stage-3 parameter that
/// is not gathered, registering after finalize).
class ZEROSHARD_API UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(ErrorCode::kInvalidUsage, message) {}
};

/// A collective failed or timed out in MPI or NCCL; the message names the rank and collective.
class ZEROSHARD_API CommError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime, cuBLAS or kernel launch call failed.
class ZEROSHARD_API CudaError : public Error {
 public:
  explicit CudaError(const std::string& message) : Error(ErrorCode::kCuda, message) {}
};

/// A file or block-device operation failed (open, read, write, a truncated file, a full disk).
class ZEROSHARD_API IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(ErrorCode::kIo, message) {}
};

/// A checkpoint or weights file is missing, incomplete, corrupt or does not fit the registered
/// model; the message names the file, the rank and what does not match.
class ZEROSHARD_API CheckpointError : public IoError {
 public:
  using IoError::IoError;
};

/// An allocation failed; the message says how many bytes of which category were asked for.
class ZEROSHARD_API OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& message) : Error(ErrorCode::kOutOfMemory, message) {}
};

/// An operation did not finish within its deadline (a collective, an I/O request).
class ZEROSHARD_API TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(ErrorCode::kTimeout, message) {}
};

}  // namespace zeroshard
