// What the example models share when they are built: checking the sizes they are given and the
// generator their initial weights are drawn from.
#pragma once

#include <cstdint>
#include <string>

#include "zeroshard/error.h"

namespace zeroshard::examples {

/// splitmix64: a tiny counter-based generator whose output is fixed by the seed alone, so every
/// rank (and every standard library) produces the same initial weights.
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Throws `<model>: <what> must be positive, got <value>` unless `value` is.
inline void require_positive(const char* model, const char* what, int value) {
  if (value <= 0) {
    throw UsageError(std::string(model) + ": " + what + " must be positive, got " +
                     std::to_string(value));
  }
}

}  // namespace zeroshard::examples
