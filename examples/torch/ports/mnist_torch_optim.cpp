// PyTorch's C++ MNIST example (pytorch/examples, cpp/mnist) in its shape, trained with
// torch::optim::SGD; mnist_zeroshard.cpp is this file ported to zeroshard as docs/torch.md says,
// which counts the lines between them. Kept small for CI: a few batches of each epoch, of the
// synthetic MNIST that make_mnist_idx writes.
// Usage: mnist_torch_optim DATA_FOLDER; mnist_zeroshard DATA_FOLDER CONFIG (argv[2]).
#include <torch/torch.h>

#include <cstdio>

// The batch sizes, and how many batches each epoch trains and tests (the example takes all).
const int64_t kTrainBatchSize = 32;
const int64_t kTestBatchSize = 200;
const int64_t kTrainBatches = 6;
const int64_t kTestBatches = 2;
const int64_t kNumberOfEpochs = 2;

struct Net : torch::nn::Module {
  Net()
      : conv1(torch::nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
        conv2(torch::nn::Conv2dOptions(10, 20, /*kernel_size=*/5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, /*dim=*/1);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};

template <typename DataLoader>
void train(int64_t epoch, Net& model, DataLoader& data_loader, torch::optim::Optimizer& optimizer) {
  model.train();
  int64_t batch_idx = 0;
  for (auto& batch : data_loader) {
    optimizer.zero_grad();
    auto output = model.forward(batch.data);
    auto loss = torch::nll_loss(output, batch.target);
    loss.backward();
    optimizer.step();
    std::printf("Train Epoch: %ld batch %ld Loss: %.6f\n", epoch, batch_idx,
                loss.template item<double>());
    if (++batch_idx == kTrainBatches) break;
  }
}

template <typename DataLoader>
void test(Net& model, DataLoader& data_loader) {
  torch::NoGradGuard no_grad;
  model.eval();
  double test_loss = 0;
  int64_t correct = 0, count = 0, batches = 0;
  for (const auto& batch : data_loader) {
    auto output = model.forward(batch.data);
    test_loss += torch::nll_loss(output, batch.target, /*weight=*/{}, torch::Reduction::Sum)
                     .template item<double>();
    correct += output.argmax(1).eq(batch.target).sum().template item<int64_t>();
    count += batch.data.size(0);
    if (++batches == kTestBatches) break;
  }
  std::printf("Test set: Average loss: %.6f | Accuracy: %.3f\n", test_loss / count,
              static_cast<double>(correct) / count);
}

int main([[maybe_unused]] int argc, char** argv) {
  torch::manual_seed(1);

  Net model;

  auto train_dataset = torch::data::datasets::MNIST(argv[1])
                           .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                           .map(torch::data::transforms::Stack<>());
  auto train_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(train_dataset), kTrainBatchSize);

  auto test_dataset =
      torch::data::datasets::MNIST(argv[1], torch::data::datasets::MNIST::Mode::kTest)
          .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
          .map(torch::data::transforms::Stack<>());
  auto test_loader = torch::data::make_data_loader(std::move(test_dataset), kTestBatchSize);

  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

  for (int64_t epoch = 1; epoch <= kNumberOfEpochs; ++epoch) {
    train(epoch, model, *train_loader, optimizer);
    test(model, *test_loader);
  }
}
