// Gathering every rank's text over a collective that moves floating-point elements only, for
// communicators that take host buffers and for engines whose buffers live on a GPU alike.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "zeroshard/dtype.h"

namespace zeroshard::detail {

/// An in-place all-gather of host elements (the Communicator::all_gather contract), possibly
/// bounced through device memory by the caller.
using HostAllGather =
    std::function<void(void* data, std::span<const std::int64_t> counts, DType dtype)>;

/// Every rank's `text`, in rank order, on every rank; two collectives through `gather`.
std::vector<std::string> gather_text(const std::string& text, int rank, int world,
                                     const HostAllGather& gather);

}  // namespace zeroshard::detail
