// How many threads the library's host loops run on: the OpenMP team of the host's update, its
// gradient scan and the first touch of its arrays. An engine that offloads its optimizer sizes it
// from offload_optimizer.cpuadam_cores_perc and sets it for the scope of its host work on the
// thread that does it, so that a program's own OpenMP regions keep their team.
#pragma once

#include <string>

namespace zeroshard::detail {

/// The team the library's parallel host loops use on the calling thread: the innermost
/// CpuTeamScope's size, or OpenMP's default (omp_get_max_threads()) outside any.
int cpu_team_size() noexcept;

/// Sets cpu_team_size() on this thread for its lifetime; 0 leaves it as it is.
class CpuTeamScope {
 public:
  explicit CpuTeamScope(int size) noexcept;
  ~CpuTeamScope();
  CpuTeamScope(const CpuTeamScope&) = delete;
  CpuTeamScope& operator=(const CpuTeamScope&) = delete;

 private:
  int previous_;
};

/// The team an offloaded update runs on, and why.
struct CpuTeam {
  int size = 1;
  /// The cores the share was taken of; 0 when OMP_NUM_THREADS gave the size.
  int rank_cores = 0;
  /// "13 threads: cpuadam_cores_perc 0.8 of 16 cores (...)", for the start-up report.
  std::string description;
};

/// The cores this rank may use: those of its CPU affinity mask, divided among the `local_ranks`
/// of its host when the mask holds every online CPU (ranks not bound to cores of their own).
int rank_cores(int affinity_cores, int online_cores, int local_ranks) noexcept;

/// The team for `share` (0, 1] of this rank's cores: at least 1 thread; OMP_NUM_THREADS, when
/// set, gives the size instead. The local rank count comes from the launcher's environment
/// (OMPI_COMM_WORLD_LOCAL_SIZE, LOCAL_WORLD_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE).
CpuTeam cpu_team_for_share(double share);

}  // namespace zeroshard::detail
