// The GPU implementation of ComputeBackend (see compute_backend.h).
#pragma once

#include <memory>

#include "backend/compute_backend.h"

namespace zeroshard::cuda {

/// A backend whose buffers are cudaMalloc'd on `device` and whose arithmetic is zeroshard's
/// kernels, queued on the compute stream (the legacy default stream until set_stream). `rule` must
/// be a built-in rule; UsageError names a user's own rule. The scratch memory of the norm
/// reduction is charged to `tracker` under communication, at the device location.
std::unique_ptr<detail::ComputeBackend> make_cuda_backend(const Device& device,
                                                          const UpdateRule& rule,
                                                          detail::MemoryTracker& tracker);

}  // namespace zeroshard::cuda
