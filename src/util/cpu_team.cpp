// The host team's size: the scope's per thread, and the share of the rank's cores.
#include "util/cpu_team.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace zeroshard::detail {
namespace {

thread_local int scoped_team = 0;

// Without OpenMP every loop runs on the calling thread.
int default_team() noexcept {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int local_ranks_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS",
                           "SLURM_NTASKS_PER_NODE"}) {
    if (const char* value = std::getenv(name)) {
      char* end = nullptr;
      const long ranks = std::strtol(value, &end, 10);
      if (end != value && ranks > 0 && ranks < 1 << 20) return static_cast<int>(ranks);
    }
  }
  return 1;
}

int affinity_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return 1;
  return std::max(1, CPU_COUNT(&mask));
}

}  // namespace

int cpu_team_size() noexcept { return scoped_team > 0 ? scoped_team : default_team(); }

CpuTeamScope::CpuTeamScope(int size) noexcept : previous_(scoped_team) {
  if (size > 0) scoped_team = size;
}

CpuTeamScope::~CpuTeamScope() { scoped_team = previous_; }

int rank_cores(int affinity_cores, int online_cores, int local_ranks) noexcept {
  const int cores = std::max(1, affinity_cores);
  if (local_ranks <= 1 || cores < online_cores) return cores;
  return std::max(1, cores / local_ranks);
}

CpuTeam cpu_team_for_share(double share) {
  CpuTeam team;
  std::ostringstream why;
  if (const char* threads = std::getenv("OMP_NUM_THREADS"); threads != nullptr && *threads) {
    team.size = std::max(1, default_team());
    why << team.size << (team.size == 1 ? " thread" : " threads") << ": OMP_NUM_THREADS=" << threads
        << " (cpuadam_cores_perc applies when it is unset)";
  } else {
    const int online = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    const int affinity = affinity_cores();
    const int locals = local_ranks_from_environment();
    team.rank_cores = rank_cores(affinity, online, locals);
    team.size = std::max(1, static_cast<int>(std::floor(share * team.rank_cores)));
    why << team.size << (team.size == 1 ? " thread" : " threads") << ": cpuadam_cores_perc "
        << share << " of " << team.rank_cores << " cores (" << affinity
        << " in the affinity mask of " << online << " online";
    if (team.rank_cores < affinity) why << ", shared by " << locals << " ranks of this host";
    why << ")";
  }
  team.description = why.str();
  return team;
}

}  // namespace zeroshard::detail
