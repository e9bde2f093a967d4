// A GAN trained twice: gan_torch_optim.cpp with two torch::optim::AdamW, gan_zeroshard.cpp with
// two zeroshard::torch::Optimizer at the stage its config (argv[1]) picks; docs/torch.md shows
// the diff. The generator learns a ring of eight Gaussians from noise; both models use
// BatchNorm, and the generator's loss backpropagates through the discriminator, as in
// PyTorch's DCGAN example.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "zeroshard/torch.h"

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl()
      : layers(register_module(
            "layers",
            torch::nn::Sequential(torch::nn::Linear(torch::nn::LinearOptions(8, 64).bias(false)),
                                  torch::nn::BatchNorm1d(64), torch::nn::ReLU(),
                                  torch::nn::Linear(64, 64), torch::nn::BatchNorm1d(64),
                                  torch::nn::ReLU(), torch::nn::Linear(64, 2)))) {}
  torch::Tensor forward(torch::Tensor x) { return layers->forward(x); }
  torch::nn::Sequential layers;
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl()
      : layers(register_module(
            "layers",
            torch::nn::Sequential(torch::nn::Linear(2, 64), torch::nn::LeakyReLU(),
                                  torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false)),
                                  torch::nn::BatchNorm1d(64), torch::nn::LeakyReLU(),
                                  torch::nn::Linear(64, 1)))) {}
  torch::Tensor forward(torch::Tensor x) { return layers->forward(x); }
  torch::nn::Sequential layers;
};
TORCH_MODULE(Discriminator);

constexpr int kBatch = 64;

// Step `step`'s real samples: points near a ring of eight modes, the same in every run.
torch::Tensor real_samples(int step) {
  torch::Generator generator = at::detail::createCPUGenerator(1000 + step);
  const torch::Tensor mode = torch::randint(0, 8, {kBatch}, generator).to(torch::kFloat);
  const torch::Tensor angle = mode * (2.0 * M_PI / 8.0);
  return torch::stack({torch::cos(angle), torch::sin(angle)}, 1) * 2.0 +
         torch::randn({kBatch, 2}, generator) * 0.05;
}

torch::Tensor noise(int step) {
  torch::Generator generator = at::detail::createCPUGenerator(5000 + step);
  return torch::randn({kBatch, 8}, generator);
}

int main([[maybe_unused]] int argc, [[maybe_unused]] char** argv) {
  torch::manual_seed(0);
  Generator generator;
  Discriminator discriminator;
  zeroshard::torch::Optimizer optimizer_g(*generator, argv[1]);
  zeroshard::torch::Optimizer optimizer_d(*discriminator, argv[1]);
  const int steps = argc > 2 ? std::atoi(argv[2]) : 300;
  const int rank = optimizer_g.engine().rank(), world = optimizer_g.engine().world_size();
  const int rows = kBatch / world;
  double first_distance = 0.0, distance = 0.0;
  for (int step = 0; step < steps; ++step) {
    const torch::Tensor real = real_samples(step).narrow(0, rank * rows, rows);
    const torch::Tensor fake = generator->forward(noise(step).narrow(0, rank * rows, rows));

    // The discriminator: real samples towards 1, fakes towards 0, one backward each.
    discriminator->zero_grad();
    torch::Tensor loss_real = torch::binary_cross_entropy_with_logits(discriminator->forward(real),
                                                                      torch::ones({rows, 1}));
    loss_real.backward();
    torch::Tensor loss_fake = torch::binary_cross_entropy_with_logits(
        discriminator->forward(fake.detach()), torch::zeros({rows, 1}));
    loss_fake.backward();
    optimizer_d.step();

    // The generator: its fakes taken for real, through the discriminator.
    generator->zero_grad();
    torch::Tensor loss_g = torch::binary_cross_entropy_with_logits(discriminator->forward(fake),
                                                                   torch::ones({rows, 1}));
    loss_g.backward();
    optimizer_g.step();

    const double loss_d = optimizer_d.mean_over_ranks((loss_real + loss_fake).item<double>());
    const double loss_gen = optimizer_g.mean_over_ranks(loss_g.item<double>());
    // How far the fakes are from the ring of radius 2.
    distance =
        optimizer_g.mean_over_ranks((fake.detach().norm(2, 1) - 2.0).abs().mean().item<double>());
    if (step == 0) first_distance = distance;
    if (rank == 0) {
      std::printf("step %d: loss_d %.6f loss_g %.6f distance %.6f\n", step, loss_d, loss_gen,
                  distance);
    }
  }
  return distance < first_distance ? 0 : 1;
}
