// The example trainers' shared flags, with the help lines both trainers print.
#include "trainer_options.h"

namespace zeroshard::examples {

void add_trainer_flags(CLI::App& app, TrainerOptions& options, bool steps_required) {
  app.add_option("--config", options.config_path,
                 "DeepSpeed-style JSON config (zero_optimization.stage picks the stage)")
      ->type_name("FILE")
      ->required();
  app.add_option_function<int>(
         "--stage", [&options](int stage) { options.stage = stage; },
         "ZeRO stage 0-3; overrides the config's zero_optimization.stage")
      ->type_name("S")
      ->check(cli::integer_in(0, 3));
  CLI::Option* steps = cli::add_integer(app, "--steps", options.steps,
                                        "optimizer steps to run, each over one global batch");
  if (steps_required) {
    steps->required();
  } else {
    steps->capture_default_str();
  }
  app.add_option("--precision", options.precision, "overrides the config's fp16/bf16 sections")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--device", options.device,
                 "auto takes the GPU the local rank picks when there is one (see "
                 "ZEROSHARD_DEVICE), the CPU otherwise")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cli::add_integer(app, "--checkpoint-every", options.checkpoint_every,
                   "activation checkpointing: blocks of K layers keep only their input and run "
                   "again in backward (0: off); the config's activation_checkpointing section "
                   "says where kept inputs go",
                   0)
      ->type_name("K")
      ->capture_default_str();
  app.add_option("--report-json", options.report_json,
                 "rank 0 writes losses, parameter checksums and memory reports")
      ->type_name("FILE");
  CLI::Option* save_dir =
      app.add_option("--save-dir", options.save_dir,
                     "save checkpoints into DIR (tags stepK), at the end of the run and every "
                     "--save-every steps")
          ->type_name("DIR");
  cli::add_integer(app, "--save-every", options.save_every, "save a checkpoint every K steps")
      ->type_name("K")
      ->needs(save_dir);
  app.add_option("--resume", options.resume_dir,
                 "continue from DIR's latest checkpoint, data position included; --steps stays "
                 "the total, so the run ends where an uninterrupted one does")
      ->type_name("DIR");
}

}  // namespace zeroshard::examples
