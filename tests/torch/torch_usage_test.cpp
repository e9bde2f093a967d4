// How a torch::optim user drives zeroshard::torch::Optimizer, under mpirun with 1-4 ranks:
// parameter groups and frozen parameters as torch::optim has them, gradient accumulation, a
// closure, a caller that resets .grad(), and the misuses refused with an error naming them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "torch_training.h"
#include "zeroshard/torch.h"

namespace torch_testing {
namespace {

bool is_bias_or_norm(const std::string& name) {
  return name.find("bias") != std::string::npos || name.find("norm") != std::string::npos;
}

std::vector<torch::Tensor> parameters_where(TinyNet& model, bool bias_or_norm) {
  std::vector<torch::Tensor> selected;
  for (const auto& item : model->named_parameters()) {
    if (is_bias_or_norm(item.key()) == bias_or_norm) selected.push_back(item.value());
  }
  return selected;
}

// No weight decay and half the lr for biases and norms, the embedding frozen: torch::optim's
// param groups and requires_grad(false), against OptimizerOptions::groups at every stage.
TEST(TorchUsage, ParamGroupsAndFrozenParametersMatchTorchOptim) {
  const auto freeze = [](TinyNet& model) { model->embed->weight.requires_grad_(false); };
  const std::vector<float> reference = train_torch(
      "adamw", 10,
      [](TinyNet& model) {
        std::vector<torch::optim::OptimizerParamGroup> groups;
        auto trainable = [](std::vector<torch::Tensor> tensors) {
          std::erase_if(tensors, [](const torch::Tensor& t) { return !t.requires_grad(); });
          return tensors;
        };
        groups.emplace_back(trainable(parameters_where(model, false)),
                            std::make_unique<torch::optim::AdamWOptions>(
                                torch::optim::AdamWOptions(0.01).weight_decay(0.01)));
        groups.emplace_back(trainable(parameters_where(model, true)),
                            std::make_unique<torch::optim::AdamWOptions>(
                                torch::optim::AdamWOptions(0.005).weight_decay(0.0)));
        return std::make_unique<torch::optim::AdamW>(std::move(groups));
      },
      freeze);
  const auto configure = [](TinyNet& model, zeroshard::torch::OptimizerOptions& options) {
    options.groups.push_back({"no_decay", parameters_where(model, true), 0.005, 0.0});
  };
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const float frozen_before = make_tiny_net()->embed->weight[0][0].item<float>();
    const TrainingRun run =
        train_zero({.stage = stage, .prepare = freeze, .configure = configure}, {},
                   [&](TinyNet& model, zeroshard::torch::Optimizer& optimizer) {
                     EXPECT_EQ(model->embed->weight[0][0].item<float>(), frozen_before);
                     EXPECT_EQ(optimizer.param_groups().size(), 2u);
                     // libtorch 2.x merges a group's options with the defaults: the
                     // group's own values must survive it.
                     const auto& options = static_cast<const zeroshard::torch::GroupOptions&>(
                         optimizer.param_groups()[1].options());
                     EXPECT_DOUBLE_EQ(options.lr(), 0.005);
                     EXPECT_DOUBLE_EQ(options.weight_decay(), 0.0);
                   });
    EXPECT_LE(max_difference(run.parameters, reference), kRoundingBound);
  }
}

// Two micro-batches of half the rows per step(), gradient_accumulation_steps 2: the same update
// as the whole slice at once, to rounding.
TEST(TorchUsage, GradientAccumulationEqualsTheWholeBatch) {
  const std::vector<float> reference = train_torch("adamw", 10);
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const TrainingRun run = train_zero({.stage = stage, .micro_batches = 2});
    EXPECT_LE(max_difference(run.parameters, reference), kRoundingBound);
    EXPECT_FALSE(run.steps[0].updated) << "the first micro-batch ends no window";
    EXPECT_TRUE(run.steps[1].updated);
  }
}

// torch::optim's zero_grad(set_to_none) (libtorch 2.x's default) and user code may reset .grad()
// between steps: the gradient autograd then creates still reaches the engine.
TEST(TorchUsage, GradientsReachTheEngineWhenTheCallerResetsGrad) {
  const std::vector<float> reference = train_torch("adamw", 10);
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto communicator = Communicator::from_environment();
    const int world = communicator->size();
    const int rank = communicator->rank();
    TinyNet model = make_tiny_net();
    zeroshard::torch::OptimizerOptions options;
    options.communicator = std::move(communicator);
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(config_json(stage, world, "adamw"), world),
        std::move(options));
    const std::int64_t rows = kBatch / world;
    for (int step = 0; step < 10; ++step) {
      for (torch::Tensor& parameter : model->parameters())
        parameter.mutable_grad() = torch::Tensor();
      const Batch data = batch(step, rank * rows, (rank + 1) * rows);
      // step(closure): torch::optim's way of handing the loss computation over.
      optimizer.step([&] {
        const torch::Tensor loss = torch::mse_loss(model->forward(data.inputs), data.targets);
        optimizer.backward(loss);
        return loss;
      });
    }
    EXPECT_LE(max_difference(optimizer.engine().consolidated_parameters(), reference),
              kRoundingBound);
  }
}

// checkpoint_units: every block keeps only its input and runs again in backward, with the
// config's checkpointing keys (zero2_checkpointing.json's) and dropout drawing the same masks in
// the recompute; the result equals the run without checkpointing bit for bit.
TEST(TorchUsage, CheckpointedUnitsEqualTheRunWithoutCheckpointing) {
  const std::string checkpointing =
      R"(, "activation_checkpointing": {"cpu_checkpointing": true, )"
      R"("contiguous_memory_optimization": true, "number_checkpoints": 3, )"
      R"("synchronize_checkpoint_boundary": true, "profile": true})";
  const auto checkpoint_units = [](TinyNet&, zeroshard::torch::OptimizerOptions& options) {
    options.checkpoint_units = true;
  };
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const TrainingRun plain = train_zero({.stage = stage, .dropout = 0.2});
    std::int64_t kept_activations = 0;
    const TrainingRun checkpointed = train_zero(
        {.stage = stage, .extra = checkpointing, .configure = checkpoint_units, .dropout = 0.2}, {},
        [&](TinyNet&, zeroshard::torch::Optimizer& optimizer) {
          Engine& engine = optimizer.engine();
          kept_activations = engine.memory_report()
                                 .at(MemoryCategory::kActivations, engine.memory_location())
                                 .peak;
        });
    EXPECT_EQ(checkpointed.parameters, plain.parameters);
    EXPECT_GT(kept_activations, 0) << "no input was kept in engine memory";
  }
}

// The model outlives its optimizer: it keeps the trained values (stages 0-2) and trains on with
// plain torch; at stage 3 the units' parameters are left empty, the others keep their values.
TEST(TorchUsage, TheModelKeepsItsValuesWhenTheOptimizerGoes) {
  const int world = Communicator::from_environment()->size();
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TinyNet model = make_tiny_net();
    std::vector<float> trained;
    {
      zeroshard::torch::Optimizer optimizer(
          *model, Config::from_json_string(config_json(stage, world, "adamw"), world));
      const Batch data = batch(0);
      optimizer.zero_grad();
      optimizer.backward(torch::mse_loss(model->forward(data.inputs), data.targets));
      optimizer.step();
      trained = optimizer.engine().consolidated_parameters();
    }
    if (stage < 3) {
      EXPECT_EQ(flat_parameters(*model), trained);
      const Batch data = batch(1);
      torch::mse_loss(model->forward(data.inputs), data.targets).backward();
      EXPECT_TRUE(model->head->weight.grad().defined());
    } else {
      EXPECT_EQ(model->blocks[0]->as<BlockImpl>()->fc->weight.numel(), 0);
      const torch::Tensor head = model->head->weight.detach().flatten();
      const std::size_t head_offset = trained.size() - model->head->bias.numel() - head.numel();
      EXPECT_EQ(head[3].item<float>(), trained[head_offset + 3]);
    }
  }
}

// A graph built while the optimizer lived keeps autograd's gradient accumulators, and with them
// the hooks that call into the optimizer: the optimizer takes its hooks along when it goes.
TEST(TorchUsage, TheOptimizerRemovesItsGradientHooksWhenItGoes) {
  const int world = Communicator::from_environment()->size();
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TinyNet model = make_tiny_net();
    const auto hooks_on_head = [&] {
      return torch::autograd::impl::grad_accumulator(model->head->weight)->post_hooks().size();
    };
    torch::Tensor loss;
    {
      zeroshard::torch::Optimizer optimizer(
          *model, Config::from_json_string(config_json(stage, world, "adamw"), world));
      EXPECT_EQ(hooks_on_head(), 1u);
      const Batch data = batch(0);
      loss = torch::mse_loss(model->forward(data.inputs), data.targets);
    }
    EXPECT_EQ(hooks_on_head(), 0u);
  }
}

TEST(TorchUsage, MisusesAreRefusedByName) {
  const int world = Communicator::from_environment()->size();
  // A config key the adapter cannot honour names itself.
  TinyNet model = make_tiny_net();
  try {
    zeroshard::torch::Optimizer optimizer(
        *model, Config::from_json_string(
                    config_json(1, world, "adamw", {},
                                R"(, "activation_checkpointing": {"partition_activations": true})"),
                    world));
    ADD_FAILURE() << "partition_activations was accepted";
  } catch (const zeroshard::ConfigError& error) {
    EXPECT_EQ(error.key_path(), "activation_checkpointing.partition_activations");
  }
  model = make_tiny_net();
  try {
    zeroshard::torch::Optimizer optimizer(
        *model,
        Config::from_json_string(
            config_json(3, world, "adamw", {{"zero_quantized_nontrainable_weights", "true"}}),
            world));
    ADD_FAILURE() << "zero_quantized_nontrainable_weights was accepted";
  } catch (const zeroshard::ConfigError& error) {
    EXPECT_EQ(error.key_path(), "zero_optimization.zero_quantized_nontrainable_weights");
  }

  model = make_tiny_net();
  zeroshard::torch::OptimizerOptions options;
  options.groups.push_back({"no_decay", parameters_where(model, true), 0.005, 0.0});
  zeroshard::torch::Optimizer optimizer(
      *model, Config::from_json_string(config_json(1, world, "adamw"), world), std::move(options));
  // A sharded state written by one rank through torch::save would not be the optimizer.
  torch::serialize::OutputArchive archive;
  EXPECT_THROW(optimizer.save(archive), zeroshard::UsageError);
  // Groups keep their lr ratio (a scheduler scales them alike); one group alone is refused.
  optimizer.param_groups()[1].options().set_lr(0.1);
  EXPECT_THROW(optimizer.step(), zeroshard::UsageError);
  optimizer.param_groups()[1].options().set_lr(0.005);
  static_cast<zeroshard::torch::GroupOptions&>(optimizer.param_groups()[0].options())
      .weight_decay(0.5);
  EXPECT_THROW(optimizer.step(), zeroshard::UsageError);
  // A tensor that is no parameter of the model in a group.
  zeroshard::torch::OptimizerOptions stray;
  stray.groups.push_back({"stray", {torch::zeros({3}, torch::requires_grad())}, {}, {}});
  TinyNet other = make_tiny_net();
  EXPECT_THROW(zeroshard::torch::Optimizer(
                   *other, Config::from_json_string(config_json(1, world, "adamw"), world),
                   std::move(stray)),
               zeroshard::UsageError);
}

}  // namespace
}  // namespace torch_testing
