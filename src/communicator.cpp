// STAND-IN on the cuda branch only, so that the CUDA tests and benchmarks link before the comm
// branch lands: the comm branch's own src/communicator.cpp replaces this file at merge.
#include "zeroshard/communicator.h"

namespace zeroshard {

const char* to_string(Collective collective) noexcept {
  switch (collective) {
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "unknown collective";
}

std::int64_t TrafficCounters::total_elements() const noexcept {
  std::int64_t total = 0;
  for (std::int64_t e : elements) total += e;
  return total;
}

std::int64_t TrafficCounters::total_bytes() const noexcept {
  std::int64_t total = 0;
  for (std::int64_t b : bytes) total += b;
  return total;
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    Request old(std::move(*this));
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Request::~Request() {
  if (!impl_) return;
  try {
    impl_->wait();
  } catch (...) {
  }
}

void Request::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool Request::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

void Communicator::count_traffic(Collective collective, std::int64_t elements,
                                 DType dtype) noexcept {
  const auto i = static_cast<int>(collective);
  traffic_.elements[i] += elements;
  traffic_.bytes[i] += elements * static_cast<std::int64_t>(size_of(dtype));
  traffic_.calls[i] += 1;
}

}  // namespace zeroshard
