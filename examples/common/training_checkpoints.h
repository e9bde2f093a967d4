// An example trainer's checkpoints: resuming from --resume (data position included), saving
// every --save-every steps into --save-dir and at the end of the run.
#pragma once

#include "trainer_options.h"
#include "zeroshard/zeroshard.h"

namespace zeroshard::examples {

/// The data position a checkpoint keeps in its user section is the next step's index: the
/// trainers' batches of step s are a function of s (and the seed) alone, see
/// data_parallel_range.
class TrainingCheckpoints {
 public:
  /// `program` names the trainer in errors; rank 0 prints what is saved and resumed.
  TrainingCheckpoints(Engine& engine, const TrainerOptions& options, const char* program, int rank);

  /// Loads --resume's latest checkpoint when there is one; returns the first step to run.
  int resume();
  /// After step index `step` (0-based) ends: saves when --save-every says so.
  void after_step(int step);
  /// After the last step: saves the final state into --save-dir unless that was just saved.
  void finish();

 private:
  void save(int next_step);

  Engine& engine_;
  const TrainerOptions& options_;
  const char* program_;
  int rank_;
  int last_saved_ = -1;
};

}  // namespace zeroshard::examples
