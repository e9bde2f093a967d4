// The frame of an example trainer's main(): --help, the command line, the program's own
// communicator, and what an error does to a job of several ranks.
#pragma once

#include <functional>

#include "command_line.h"
#include "zeroshard/zeroshard.h"

namespace zeroshard::examples {

/// What the error handler needs to know about how far the run got.
struct RunProgress {
  /// The program's own communicator; null until it exists.
  Communicator* communicator = nullptr;
  /// Until the engine exists every rank does the same thing (read the same files), so an error
  /// so far happened on every rank alike. The trainer clears it before building the engine.
  bool in_lockstep = true;
};

struct TrainerProgram {
  const char* name;         ///< prefixes every message, e.g. "zeroshard-train-mlp"
  const char* description;  ///< the top of --help
  /// Adds the program's flags to its command line.
  std::function<void(CLI::App& app)> add_flags;
  /// Trains over `communicator`, which carries the program's own collectives (loss, reports),
  /// apart from the engine's, so they can never interleave with the engine's transfers.
  std::function<int(Communicator& communicator, RunProgress& progress)> train;
};

/// Runs `program` and returns main()'s exit code: 0 for --help and a finished run, 2 for a
/// command-line problem, 1 for an error (which, once the ranks have parted ways, aborts the job).
int run_trainer(int argc, char** argv, const TrainerProgram& program);

/// The same for a trainer written as `add_flags(app, options)` and
/// `train(options, communicator, progress)` over an `Options` of its own.
template <class Options>
int run_trainer(int argc, char** argv, const char* name, const char* description,
                void (*add_flags)(CLI::App&, Options&),
                int (*train)(const Options&, Communicator&, RunProgress&)) {
  Options options;
  return run_trainer(
      argc, argv,
      {.name = name,
       .description = description,
       .add_flags = [&](CLI::App& app) { add_flags(app, options); },
       .train = [&](Communicator& communicator,
                    RunProgress& progress) { return train(options, communicator, progress); }});
}

}  // namespace zeroshard::examples
