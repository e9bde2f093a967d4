// An error on one rank would leave the others waiting in their next collective for ever, so once
// the ranks may differ it ends the whole job. An error while every rank still does the same
// thing (reading the config and data files) is reported once, and every rank simply exits.
#include "run_guard.h"

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>

namespace zeroshard::examples {
namespace {

int fail(const char* program, const char* what, const RunProgress& progress) {
  const int rank = progress.communicator ? progress.communicator->rank() : 0;
  if (!progress.in_lockstep || rank == 0) std::fprintf(stderr, "%s: %s\n", program, what);
  std::fflush(stderr);
  if (progress.in_lockstep || progress.communicator == nullptr) return 1;
  if (progress.communicator->size() > 1) progress.communicator->abort(1);
  return 1;
}

}  // namespace

int run_trainer(int argc, char** argv, const TrainerProgram& program) {
  CLI::App app(program.description, program.name);
  program.add_flags(app);
  if (const std::optional<int> exit_code = cli::parse(app, argc, argv)) return *exit_code;
  RunProgress progress;
  // Owned here so that it outlives train() when an error unwinds it: fail() aborts through it.
  std::unique_ptr<Communicator> communicator;
  try {
    communicator = Communicator::from_environment();
    progress.communicator = communicator.get();
    return program.train(*communicator, progress);
  } catch (const std::exception& error) {
    return fail(program.name, error.what(), progress);
  }
}

}  // namespace zeroshard::examples
