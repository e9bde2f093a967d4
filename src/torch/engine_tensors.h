// Torch tensors over the engine's memory, without copies: a parameter whose storage follows the
// engine (re-pointed at every stage-3 gather, so the views autograd saved see the gathered
// values), and plain views of gradient buffers.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <vector>

#include "zeroshard/device.h"
#include "zeroshard/dtype.h"

namespace zeroshard::torch::detail {

at::ScalarType scalar_type(DType dtype);
c10::Device torch_device(const Device& device);
/// The engine's device for tensors on `device`.
Device engine_device(const c10::Device& device);

/// A view of `data` (elements of `dtype` on `device`), shaped `shape`, that the engine owns.
at::Tensor view_of(void* data, DType dtype, const Device& device,
                   const std::vector<std::int64_t>& shape);

/// One model parameter whose values live in engine memory. The parameter tensor keeps its
/// identity (the module, autograd's accumulator and the torch optimizer's param_groups hold it);
/// what it points at changes.
class EngineBackedTensor {
 public:
  EngineBackedTensor(at::Tensor parameter, DType dtype, const Device& device);

  const at::Tensor& tensor() const noexcept { return tensor_; }
  /// The parameter's values are at `data` from now on.
  void point_at(void* data);
  /// The parameter holds nothing (an empty tensor): a read outside its unit fails at its first
  /// operation. The views autograd saved, and tensors detach()ed from the parameter, see
  /// `placeholder` (as many bytes as the parameter's, never freed before this object) until the
  /// next point_at().
  void point_at_nothing(void* placeholder);
  /// The parameter takes the engine's type and its full shape with no values behind it: what
  /// autograd's accumulator is created from for a parameter that is gathered only later.
  void shape_without_values();
  /// Before the engine's memory goes: the storage the parameter (and every tensor detach()ed from
  /// it) views takes torch memory of its own, with the values it views, or NaN when the parameter
  /// views nothing (a released stage-3 unit's, whose tensor stays empty).
  void keep_values();
  /// True when the program gave the tensor other data (set_data(), module->to()) than this object
  /// last gave it.
  bool replaced() const;

 private:
  /// storage_ points at `data` (null: nowhere); the tensor then views `replacement`.
  void detach_storage(void* data, const at::Tensor& replacement);
  void set_data(const at::Tensor& data);

  at::Tensor tensor_;
  std::vector<std::int64_t> shape_;
  std::size_t bytes_ = 0;
  c10::Device device_;
  at::TensorOptions options_;
  c10::intrusive_ptr<c10::StorageImpl> storage_;
  bool attached_ = false;                    ///< tensor_ uses storage_
  const c10::StorageImpl* given_ = nullptr;  ///< the storage tensor_ was last given
};

}  // namespace zeroshard::torch::detail
