#include "torch/engine_tensors.h"

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <limits>

#include "zeroshard/error.h"

namespace zeroshard::torch::detail {

at::ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat64:
      return at::kDouble;
  }
  throw UsageError("zeroshard::torch: unknown element type");
}

c10::Device torch_device(const Device& device) {
  if (device.is_cuda())
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index));
  return c10::Device(c10::DeviceType::CPU);
}

Device engine_device(const c10::Device& device) {
  if (device.is_cpu()) return Device::cpu();
  if (device.is_cuda()) return Device::cuda(device.has_index() ? device.index() : 0);
  throw UsageError("zeroshard::torch: the model's parameters are on " + device.str() +
                   "; zeroshard computes on the CPU or a CUDA GPU. Move the model there first");
}

namespace {

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

c10::intrusive_ptr<c10::StorageImpl> borrowed_storage(void* data, std::size_t bytes,
                                                      const c10::Device& device) {
  // Not resizable and no allocator: torch never frees or grows engine memory.
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), bytes,
                                               c10::DataPtr(data, device), nullptr, false);
}

}  // namespace

at::Tensor view_of(void* data, DType dtype, const Device& device,
                   const std::vector<std::int64_t>& shape) {
  return at::from_blob(data, shape,
                       at::TensorOptions().dtype(scalar_type(dtype)).device(torch_device(device)));
}

EngineBackedTensor::EngineBackedTensor(at::Tensor parameter, DType dtype, const Device& device)
    : tensor_(std::move(parameter)),
      shape_(tensor_.sizes().vec()),
      bytes_(static_cast<std::size_t>(tensor_.numel()) * size_of(dtype)),
      device_(torch_device(device)),
      options_(at::TensorOptions().dtype(scalar_type(dtype)).device(device_)),
      storage_(borrowed_storage(nullptr, 0, device_)) {}

void EngineBackedTensor::point_at(void* data) {
  storage_->set_data_ptr_noswap(c10::DataPtr(data, device_));
  storage_->set_nbytes(bytes_);
  if (attached_) return;
  // set_data keeps the tensor (and its gradient accumulator, same type and device) and swaps
  // what it views; the values are already in engine memory.
  set_data(
      at::empty({0}, options_).set_(c10::Storage(storage_), 0, shape_, contiguous_strides(shape_)));
  attached_ = true;
}

void EngineBackedTensor::point_at_nothing(void* placeholder) {
  detach_storage(placeholder, at::empty({0}, options_));
}

void EngineBackedTensor::shape_without_values() {
  // A zero-dimensional tensor expanded: the full shape, one element of memory.
  detach_storage(nullptr, at::empty({}, options_).expand(shape_));
}

void EngineBackedTensor::keep_values() {
  // Only the parameter and this object hold a storage nothing was detached from.
  const bool viewed = attached_ || storage_.use_count() > 1;
  if (!viewed || bytes_ == 0) {
    if (!attached_) detach_storage(nullptr, {});
    return;
  }
  c10::DataPtr owned = c10::GetAllocator(device_.type())->allocate(bytes_);
  const at::Tensor values = at::from_blob(owned.get(), shape_, options_);
  if (attached_) {
    values.copy_(tensor_.detach());
  } else {
    values.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  storage_->set_data_ptr_noswap(std::move(owned));
  storage_->set_nbytes(bytes_);
}

bool EngineBackedTensor::replaced() const {
  return tensor_.storage().unsafeGetStorageImpl() != given_;
}

void EngineBackedTensor::detach_storage(void* data, const at::Tensor& replacement) {
  storage_->set_data_ptr_noswap(c10::DataPtr(data, device_));
  storage_->set_nbytes(data == nullptr ? 0 : bytes_);
  if (replacement.defined()) set_data(replacement);
  attached_ = false;
}

void EngineBackedTensor::set_data(const at::Tensor& data) {
  tensor_.set_data(data);
  given_ = tensor_.storage().unsafeGetStorageImpl();
}

}  // namespace zeroshard::torch::detail
