// The CUDA side of host staging: page-locked staging buffers and copies on a stream of their own.
#pragma once

#include <memory>

#include "comm/host_staged_communicator.h"

namespace zeroshard::cuda {

/// Copies on a non-blocking copy stream of `device`, ordered after the compute stream's work by
/// events (follow_compute); completion is an event the host polls.
std::unique_ptr<detail::StagingCopier> make_cuda_staging_copier(int device);

}  // namespace zeroshard::cuda
