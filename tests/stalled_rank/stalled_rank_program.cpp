// Three MPI ranks, of which the last stops itself (SIGSTOP) before a reduce-scatter: the others
// must time out naming it, dump their flight recorders, and once it is resumed it must say that
// it was the one that stalled. Run by run.cmake, which checks what each rank wrote.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "zeroshard/communicator.h"
#include "zeroshard/error.h"

namespace {

namespace fs = std::filesystem;

// Written whole or not at all, so that a rank polling for it never reads half of it.
void write_result(const fs::path& dir, int rank, const std::string& text) {
  const fs::path path = dir / ("result-rank-" + std::to_string(rank) + ".txt");
  const fs::path temporary = path.string() + ".tmp";
  std::ofstream(temporary) << text << "\n";
  fs::rename(temporary, path);
}

bool wait_for_result(const fs::path& dir, int rank, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const fs::path path = dir / ("result-rank-" + std::to_string(rank) + ".txt");
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: stalled_rank_program WORK_DIR\n");
    return 2;
  }
  const fs::path work = argv[1];
  const char* trace_dir = std::getenv("ZEROSHARD_TRACE_DIR");
  if (trace_dir == nullptr) {
    std::fprintf(stderr, "set ZEROSHARD_TRACE_DIR\n");
    return 2;
  }
  // A last resort should the test itself hang: the default action of SIGALRM ends the process,
  // and mpirun then kills the others (SIGKILL ends a stopped process too).
  alarm(50);

  auto comm = zeroshard::Communicator::from_environment();
  const int rank = comm->rank();
  if (comm->size() != 3) {
    std::fprintf(stderr, "run with 3 ranks, not %d\n", comm->size());
    return 2;
  }
  const int stalled = 2;
  // The process ids let rank 0 resume the stopped rank, and kill it should it not finish.
  const std::vector<std::string> pids = comm->all_gather_text(std::to_string(getpid()));  // #1, #2
  std::vector<float> buffer(3 * 1024, 1.0f);
  for (int step = 0; step < 4; ++step) {
    comm->all_reduce(buffer.data(), 16, zeroshard::DType::kFloat32);  // #3..#6
  }

  if (rank == stalled) raise(SIGSTOP);
  std::vector<float> slice(1024);
  const std::vector<std::int64_t> counts(3, 1024);
  std::string result = "completed";
  try {
    comm->reduce_scatter(buffer.data(), slice.data(), counts, zeroshard::DType::kFloat32);  // #7
  } catch (const zeroshard::TimeoutError& error) {
    result = error.what();
  }
  write_result(work, rank, result);

  if (rank == 0) {
    // Both waiting ranks have dumped: keep a copy of the trace as it is while rank 2 is stopped,
    // then resume it and let it time out in turn.
    if (wait_for_result(work, 1, std::chrono::seconds(15))) {
      fs::copy(trace_dir, work / "trace-while-stopped", fs::copy_options::recursive);
    }
    const pid_t stalled_pid = std::stoi(pids[stalled]);
    kill(stalled_pid, SIGCONT);
    if (!wait_for_result(work, stalled, std::chrono::seconds(20))) kill(stalled_pid, SIGKILL);
  } else if (rank == 1) {
    wait_for_result(work, stalled, std::chrono::seconds(30));
  }
  // Without MPI_Finalize: the communicator is broken, and finalizing could wait on a peer.
  std::fflush(nullptr);
  std::_Exit(0);
}
