// Module buffers (BatchNorm's running statistics), which the engine does not hold: rank 0's are
// copied to every rank as DDP's broadcast_buffers does, and they are saved and loaded beside the
// engine's checkpoint.
#include <torch/serialize.h>

#include <filesystem>

#include "torch/optimizer_state.h"

namespace zeroshard::torch {

namespace {

constexpr const char* kBuffersFile = "torch_module_buffers.pt";

// Every buffer's bytes one after another, padded to whole fp32 elements: one broadcast of any
// mix of types (running statistics in the model's type, num_batches_tracked as int64).
at::Tensor packed_bytes(const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
  std::vector<at::Tensor> bytes;
  std::int64_t total = 0;
  for (const auto& item : buffers) {
    bytes.push_back(item.second.detach().contiguous().reshape({-1}).view(at::kByte));
    total += bytes.back().numel();
  }
  const std::int64_t padding = (4 - total % 4) % 4;
  if (padding != 0) bytes.push_back(at::zeros({padding}, bytes.front().options()));
  return at::cat(bytes);
}

}  // namespace

void Optimizer::State::broadcast_module_buffers() {
  if (!broadcast_buffers || buffers.empty() || engine.world_size() == 1) return;
  at::Tensor packed = packed_bytes(buffers);
  engine.communicator().broadcast(packed.data_ptr(), packed.numel() / 4, DType::kFloat32, 0);
  ::torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& item : buffers) {
    at::Tensor& buffer = item.second;
    const std::int64_t bytes = buffer.numel() * static_cast<std::int64_t>(buffer.element_size());
    buffer.copy_(packed.narrow(0, offset, bytes).view(buffer.scalar_type()).view(buffer.sizes()));
    offset += bytes;
  }
}

void Optimizer::State::save_module_buffers(const std::string& dir, const std::string& tag) {
  if (buffers.empty()) return;
  if (engine.rank() == 0) {
    ::torch::serialize::OutputArchive archive;
    for (const auto& [name, buffer] : buffers) archive.write(name, buffer.detach().cpu());
    const std::string file = (std::filesystem::path(dir) / tag / kBuffersFile).string();
    try {
      archive.save_to(file);
    } catch (const c10::Error& error) {
      throw IoError(
          "zeroshard::torch::Optimizer::save_checkpoint: cannot write the module "
          "buffers to '" +
          file + "': " + error.what_without_backtrace());
    }
  }
  // Every rank returns with the whole checkpoint written, as from the engine's save.
  engine.communicator().barrier();
}

void Optimizer::State::load_module_buffers(const std::string& dir, const std::string& tag) {
  if (buffers.empty()) return;
  const std::string file = (std::filesystem::path(dir) / tag / kBuffersFile).string();
  ::torch::serialize::InputArchive archive;
  try {
    archive.load_from(file);
  } catch (const c10::Error& error) {
    throw CheckpointError("zeroshard::torch::Optimizer::load_checkpoint: '" + file +
                          "' (the model's buffers, written by save_checkpoint()) cannot be read: " +
                          error.what_without_backtrace() +
                          "; load a checkpoint that zeroshard::torch saved for this model");
  }
  ::torch::NoGradGuard no_grad;
  for (auto& [name, buffer] : buffers) {
    at::Tensor saved;
    if (!archive.try_read(name, saved) || !saved.sizes().equals(buffer.sizes())) {
      throw CheckpointError("zeroshard::torch::Optimizer::load_checkpoint: '" + file +
                            "' holds no buffer '" + name + "' of shape " +
                            c10::str(buffer.sizes()) + "; it was saved for another model");
    }
    buffer.copy_(saved);
  }
}

}  // namespace zeroshard::torch
