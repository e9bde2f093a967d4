// Where-information for internal error messages.
#include "util/check.h"

#include <atomic>

namespace zeroshard::detail {
namespace {
std::atomic<int> g_rank_for_messages{-1};
}

int rank_for_messages() noexcept { return g_rank_for_messages.load(std::memory_order_relaxed); }
void set_rank_for_messages(int rank) noexcept {
  g_rank_for_messages.store(rank, std::memory_order_relaxed);
}

std::string where(const char* file, int line) {
  std::ostringstream os;
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  os << base << ":" << line;
  if (int rank = rank_for_messages(); rank >= 0) os << ", rank " << rank;
  return os.str();
}

}  // namespace zeroshard::detail
