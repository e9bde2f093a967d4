// The ring reduce-scatter's state machine: which chunk is sent and received in which step, and
// when each may start without overwriting a buffer still in use.
#include "comm/ring_reduce_scatter.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "comm/elementwise_reduce.h"
#include "comm/mpi_runtime.h"
#include "util/check.h"

namespace zeroshard::detail {

RingReduceScatter::RingReduceScatter(RingPlan plan)
    : plan_(std::move(plan)),
      element_bytes_(size_of(plan_.dtype)),
      offsets_(plan_.counts.size()),
      steps_(plan_.size - 1) {
  std::exclusive_scan(plan_.counts.begin(), plan_.counts.end(), offsets_.begin(), std::int64_t{0});
  const auto mine = static_cast<std::size_t>(plan_.rank);
  const std::byte* own_input =
      static_cast<const std::byte*>(plan_.input) + offsets_[mine] * element_bytes_;
  in_place_ = own_input == plan_.output;
  if (steps_ == 0) {
    if (!in_place_) {
      std::memcpy(plan_.output, own_input,
                  static_cast<std::size_t>(plan_.counts[mine]) * element_bytes_);
    }
    finished_ = true;
    return;
  }
  const auto chunks = [&](int slice) {
    const std::int64_t count = plan_.counts[static_cast<std::size_t>(slice)];
    return (count + plan_.chunk_elements - 1) / plan_.chunk_elements;
  };
  for (int step = 0; step < steps_; ++step) {
    send_start_.push_back(sends_.size());
    for (std::int64_t c = 0; c < chunks(send_slice(step)); ++c) {
      sends_.push_back({.step = step, .chunk = c});
    }
    receive_start_.push_back(receives_.size());
    for (std::int64_t c = 0; c < chunks(receive_slice(step)); ++c) {
      receives_.push_back({.step = step, .chunk = c});
    }
  }
  if (steps_ >= 2) {
    const std::int64_t largest = *std::max_element(plan_.counts.begin(), plan_.counts.end());
    for (auto& staging : staging_)
      staging.resize(static_cast<std::size_t>(largest) * element_bytes_);
  }
  if (in_place_) {
    const std::int64_t chunk = std::min(plan_.chunk_elements, plan_.counts[mine]);
    for (auto& buffer : last_chunks_)
      buffer.resize(static_cast<std::size_t>(chunk) * element_bytes_);
  }
}

int RingReduceScatter::send_slice(int step) const noexcept {
  return ((plan_.rank - step - 1) % plan_.size + plan_.size) % plan_.size;
}

int RingReduceScatter::receive_slice(int step) const noexcept { return send_slice(step + 1); }

std::int64_t RingReduceScatter::chunk_length(int slice, std::int64_t chunk) const noexcept {
  const std::int64_t count = plan_.counts[static_cast<std::size_t>(slice)];
  return std::min(plan_.chunk_elements, count - chunk * plan_.chunk_elements);
}

const std::byte* RingReduceScatter::send_source(const Transfer& send) const noexcept {
  const std::int64_t start = send.chunk * plan_.chunk_elements;
  if (send.step == 0) {
    const std::int64_t slice_start = offsets_[static_cast<std::size_t>(send_slice(0))];
    return static_cast<const std::byte*>(plan_.input) + (slice_start + start) * element_bytes_;
  }
  // What step s sends is what step s-1 received and reduced.
  return staging_[(send.step - 1) % 2].data() + start * element_bytes_;
}

std::byte* RingReduceScatter::receive_target(const Transfer& receive) noexcept {
  const std::int64_t start = receive.chunk * plan_.chunk_elements;
  if (receive.step == steps_ - 1) {
    if (in_place_) return last_chunks_[receive.chunk % 2].data();
    return static_cast<std::byte*>(plan_.output) + start * element_bytes_;
  }
  return staging_[receive.step % 2].data() + start * element_bytes_;
}

bool RingReduceScatter::can_send(const Transfer& send) const noexcept {
  if (send.step == 0) return true;
  // Step s-1 received this slice with the same chunking.
  return receives_[receive_start_[send.step - 1] + send.chunk].done;
}

bool RingReduceScatter::can_receive(const Transfer& receive) const noexcept {
  if (receive.step == steps_ - 1) {
    // In place, chunk c reuses the buffer of chunk c-2, free once that one has been reduced.
    return !in_place_ || receive.chunk < 2 ||
           receives_[receive_start_[receive.step] + receive.chunk - 2].done;
  }
  if (receive.step < 2) return true;
  // Step s receives into the staging slice that step s-1 sends from: chunk c is free once that
  // send has completed (or never existed, the earlier slice being shorter).
  const int sending_step = receive.step - 1;
  const std::size_t index = send_start_[sending_step] + static_cast<std::size_t>(receive.chunk);
  return index >= sends_.size() || sends_[index].step != sending_step || sends_[index].done;
}

void RingReduceScatter::complete_receives() {
  for (std::size_t i = first_open_receive_; i < next_receive_; ++i) {
    Transfer& receive = receives_[i];
    if (receive.done) continue;
    int arrived = 0;
    check(MPI_Test(&receive.request, &arrived, MPI_STATUS_IGNORE), "MPI_Test");
    if (!arrived) continue;
    const int slice = receive_slice(receive.step);
    const std::int64_t own =
        offsets_[static_cast<std::size_t>(slice)] + receive.chunk * plan_.chunk_elements;
    const std::int64_t length = chunk_length(slice, receive.chunk);
    const std::byte* input = static_cast<const std::byte*>(plan_.input) + own * element_bytes_;
    if (!in_place_ || receive.step != steps_ - 1) {
      reduce_into(input, receive_target(receive), length, plan_.dtype, plan_.op);
    } else {
      // In place, `input` is this chunk of the output.
      std::byte* output = static_cast<std::byte*>(plan_.output) +
                          receive.chunk * plan_.chunk_elements * element_bytes_;
      if (plan_.op == ReduceOp::kSum) {
        reduce_into(receive_target(receive), output, length, plan_.dtype, plan_.op);
      } else {
        reduce_into(input, receive_target(receive), length, plan_.dtype, plan_.op);
        std::memcpy(output, receive_target(receive),
                    static_cast<std::size_t>(length) * element_bytes_);
      }
    }
    receive.done = true;
  }
  while (first_open_receive_ < next_receive_ && receives_[first_open_receive_].done) {
    ++first_open_receive_;
  }
}

void RingReduceScatter::complete_sends() {
  for (std::size_t i = first_open_send_; i < next_send_; ++i) {
    Transfer& send = sends_[i];
    if (send.done) continue;
    int sent = 0;
    check(MPI_Test(&send.request, &sent, MPI_STATUS_IGNORE), "MPI_Test");
    send.done = sent != 0;
  }
  while (first_open_send_ < next_send_ && sends_[first_open_send_].done) ++first_open_send_;
}

bool RingReduceScatter::advance() {
  if (finished_) return true;
  const int right = (plan_.rank + 1) % plan_.size;
  const int left = (plan_.rank + plan_.size - 1) % plan_.size;
  complete_receives();
  while (next_send_ < sends_.size() && can_send(sends_[next_send_])) {
    Transfer& send = sends_[next_send_];
    const auto n = static_cast<int>(chunk_length(send_slice(send.step), send.chunk));
    check(MPI_Isend(send_source(send), n, plan_.type, right, plan_.tag, plan_.comm, &send.request),
          "MPI_Isend");
    ++next_send_;
  }
  complete_sends();
  while (next_receive_ < receives_.size() && can_receive(receives_[next_receive_])) {
    Transfer& receive = receives_[next_receive_];
    const auto n = static_cast<int>(chunk_length(receive_slice(receive.step), receive.chunk));
    check(MPI_Irecv(receive_target(receive), n, plan_.type, left, plan_.tag, plan_.comm,
                    &receive.request),
          "MPI_Irecv");
    ++next_receive_;
  }
  finished_ = first_open_send_ == sends_.size() && first_open_receive_ == receives_.size();
  return finished_;
}

bool RingReduceScatter::in_flight() const noexcept {
  const auto active = [](const Transfer& t) { return t.request != MPI_REQUEST_NULL; };
  return std::any_of(sends_.begin(), sends_.end(), active) ||
         std::any_of(receives_.begin(), receives_.end(), active);
}

void RingReduceScatter::check(int rc, const char* call) const {
  if (rc != MPI_SUCCESS) {
    throw CommError(ErrorCode::kMpi, std::string(call) + " failed in the ring of " +
                                         plan_.description + ": " + mpi_error_string(rc));
  }
}

}  // namespace zeroshard::detail
