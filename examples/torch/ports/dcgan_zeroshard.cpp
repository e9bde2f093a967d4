// PyTorch's C++ DCGAN example (pytorch/examples, cpp/dcgan) in its shape, trained with two
// torch::optim::Adam; dcgan_zeroshard.cpp is this file ported to zeroshard as docs/torch.md says,
// which counts the lines between them. Kept small for CI: a quarter of the example's channels,
// a few batches of the synthetic MNIST that make_mnist_idx writes, no checkpoints.
// Usage: dcgan_torch_optim DATA_FOLDER; dcgan_zeroshard DATA_FOLDER CONFIG (argv[2]).
#include <torch/torch.h>

#include <cstdio>

#include "zeroshard/torch.h"

// The size of the noise vector fed to the generator.
const int64_t kNoiseSize = 25;

// The batch size for training.
const int64_t kBatchSize = 16;

// The number of epochs to train, and how many batches of each (the example takes all).
const int64_t kNumberOfEpochs = 1;
const int64_t kBatchesPerEpoch = 8;

int main([[maybe_unused]] int argc, char** argv) {
  torch::manual_seed(1);

  torch::nn::Sequential generator(
      // Layer 1
      torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(kNoiseSize, 64, 4).bias(false)),
      torch::nn::BatchNorm2d(64), torch::nn::ReLU(),
      // Layer 2
      torch::nn::ConvTranspose2d(
          torch::nn::ConvTranspose2dOptions(64, 32, 3).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(32), torch::nn::ReLU(),
      // Layer 3
      torch::nn::ConvTranspose2d(
          torch::nn::ConvTranspose2dOptions(32, 16, 4).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(16), torch::nn::ReLU(),
      // Layer 4
      torch::nn::ConvTranspose2d(
          torch::nn::ConvTranspose2dOptions(16, 1, 4).stride(2).padding(1).bias(false)),
      torch::nn::Tanh());

  torch::nn::Sequential discriminator(
      // Layer 1
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 4).stride(2).padding(1).bias(false)),
      torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 2
      torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 4).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(32),
      torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 3
      torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 4).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(64),
      torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 4
      torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 1, 3).stride(1).padding(0).bias(false)),
      torch::nn::Sigmoid());

  auto dataset = torch::data::datasets::MNIST(argv[1])
                     .map(torch::data::transforms::Normalize<>(0.5, 0.5))
                     .map(torch::data::transforms::Stack<>());

  auto data_loader = zeroshard::torch::make_data_loader(
      std::move(dataset), torch::data::DataLoaderOptions().batch_size(kBatchSize));

  zeroshard::torch::Optimizer generator_optimizer(*generator, argv[2]);
  zeroshard::torch::Optimizer discriminator_optimizer(*discriminator, argv[2]);

  for (int64_t epoch = 1; epoch <= kNumberOfEpochs; ++epoch) {
    int64_t batch_index = 0;
    for (torch::data::Example<>& batch : *data_loader) {
      // Train discriminator with real images.
      discriminator->zero_grad();
      torch::Tensor real_images = batch.data;
      torch::Tensor real_labels = torch::empty(batch.data.size(0)).uniform_(0.8, 1.0);
      torch::Tensor real_output = discriminator->forward(real_images).reshape(-1);
      torch::Tensor d_loss_real = torch::binary_cross_entropy(real_output, real_labels);
      d_loss_real.backward();

      // Train discriminator with fake images.
      torch::Tensor noise = torch::randn({batch.data.size(0), kNoiseSize, 1, 1});
      torch::Tensor fake_images = generator->forward(noise);
      torch::Tensor fake_labels = torch::zeros(batch.data.size(0));
      torch::Tensor fake_output = discriminator->forward(fake_images.detach()).reshape(-1);
      torch::Tensor d_loss_fake = torch::binary_cross_entropy(fake_output, fake_labels);
      d_loss_fake.backward();

      torch::Tensor d_loss = d_loss_real + d_loss_fake;
      discriminator_optimizer.step();

      // Train generator.
      generator->zero_grad();
      fake_labels.fill_(1);
      fake_output = discriminator->forward(fake_images).reshape(-1);
      torch::Tensor g_loss = torch::binary_cross_entropy(fake_output, fake_labels);
      g_loss.backward();
      generator_optimizer.step();

      std::printf("[%ld/%ld][%ld] D_loss: %.6f | G_loss: %.6f\n", epoch, kNumberOfEpochs,
                  batch_index, d_loss.item<double>(), g_loss.item<double>());
      if (++batch_index == kBatchesPerEpoch) break;
    }
  }
}
