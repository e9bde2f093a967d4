// Error construction and the names of the error codes.
#include "zeroshard/error.h"

#include <utility>

namespace zeroshard {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidConfig:
      return "invalid config";
    case ErrorCode::kInvalidUsage:
      return "invalid usage";
    case ErrorCode::kCuda:
      return "CUDA error";
    case ErrorCode::kNccl:
      return "NCCL error";
    case ErrorCode::kMpi:
      return "MPI error";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kTimeout:
      return "timeout";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

ConfigError::ConfigError(std::string key_path, const std::string& message)
    : Error(ErrorCode::kInvalidConfig, key_path.empty() ? message : key_path + ": " + message),
      key_path_(std::move(key_path)) {}

}  // namespace zeroshard
