// The update thread super_offload runs the overlapped update on: tasks run in the order posted,
// off the caller's thread; the first one to throw ends the queue and its error reaches wait(),
// once; and the thread can be destroyed with tasks still queued.
#include "util/work_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace zeroshard::detail {
namespace {

TEST(WorkThread, RunsTasksInOrderOffTheCallersThread) {
  WorkThread worker;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int k = 0; k < 100; ++k) {
    worker.post([&, k] {
      order.push_back(k);
      threads.push_back(std::this_thread::get_id());
    });
  }
  worker.wait();
  ASSERT_EQ(order.size(), 100u);
  for (int k = 0; k < 100; ++k) EXPECT_EQ(order[k], k);
  for (const std::thread::id id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads.front());
  }
}

TEST(WorkThread, WaitReturnsOnlyOnceTheRunningTaskHasFinished) {
  WorkThread worker;
  std::atomic<bool> finished{false};
  worker.post([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    finished = true;
  });
  worker.wait();
  EXPECT_TRUE(finished);
}

TEST(WorkThread, TheFirstErrorEndsTheQueueAndReachesWaitOnce) {
  WorkThread worker;
  int ran = 0;
  worker.post([&] { ++ran; });
  worker.post([] { throw std::runtime_error("first"); });
  worker.post([] { throw std::runtime_error("second"); });
  worker.post([&] { ++ran; });
  try {
    worker.wait();
    FAIL() << "wait() did not rethrow the task's error";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "first");
  }
  EXPECT_EQ(ran, 1);
  // Reported once: the queue takes tasks again afterwards.
  worker.post([&] { ++ran; });
  EXPECT_NO_THROW(worker.wait());
  EXPECT_EQ(ran, 2);
}

TEST(WorkThread, DestroyedWithTasksQueuedRunsNoMoreOfThem) {
  std::atomic<int> ran{0};
  std::atomic<bool> started{false};
  {
    WorkThread worker;
    worker.post([&] {
      started = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ++ran;
    });
    for (int k = 0; k < 10; ++k) worker.post([&] { ++ran; });
    while (!started) std::this_thread::yield();
  }
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace zeroshard::detail
