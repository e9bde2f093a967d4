// Checkpoints of the example trainers; --steps stays the total across a resume, so a resumed
// run ends where an uninterrupted one does.
#include "training_checkpoints.h"

#include <cstdio>
#include <string>
#include <string_view>

namespace zeroshard::examples {
namespace {

constexpr std::string_view kPositionKey = "next_step=";

std::string data_position(int next_step) {
  return std::string(kPositionKey) + std::to_string(next_step);
}

int parse_data_position(const std::string& text, const std::string& where, const char* program) {
  int step = -1;
  if (!text.starts_with(kPositionKey) ||
      !parse_number(std::string_view(text).substr(kPositionKey.size()), step) || step < 0) {
    throw UsageError("--resume " + where + ": the checkpoint's user section is '" + text +
                     "', not a data position of " + program);
  }
  return step;
}

}  // namespace

TrainingCheckpoints::TrainingCheckpoints(Engine& engine, const TrainerOptions& options,
                                         const char* program, int rank)
    : engine_(engine), options_(options), program_(program), rank_(rank) {}

int TrainingCheckpoints::resume() {
  if (options_.resume_dir.empty()) return 0;
  const CheckpointInfo info = engine_.load_checkpoint(options_.resume_dir);
  const int first_step =
      parse_data_position(info.user_state, options_.resume_dir + "/" + info.tag, program_);
  if (first_step >= options_.steps) {
    throw UsageError("--steps " + std::to_string(options_.steps) +
                     " is the total, and checkpoint " + options_.resume_dir + "/" + info.tag +
                     " is already at step " + std::to_string(first_step));
  }
  if (rank_ == 0) {
    std::printf("resumed from %s/%s at step %d\n", options_.resume_dir.c_str(), info.tag.c_str(),
                first_step);
  }
  return first_step;
}

void TrainingCheckpoints::after_step(int step) {
  if (options_.save_every > 0 && (step + 1) % options_.save_every == 0) save(step + 1);
}

void TrainingCheckpoints::finish() {
  if (!options_.save_dir.empty() && last_saved_ != options_.steps) save(options_.steps);
}

void TrainingCheckpoints::save(int next_step) {
  engine_.save_checkpoint(options_.save_dir, "step" + std::to_string(next_step),
                          data_position(next_step));
  last_saved_ = next_step;
  if (rank_ == 0) std::printf("saved %s/step%d\n", options_.save_dir.c_str(), next_step);
}

}  // namespace zeroshard::examples
