// One thread that runs posted tasks in order, for work that overlaps the caller's (the optimizer
// update during backward under super_offload).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace zeroshard::detail {

class WorkThread {
 public:
  WorkThread();
  /// Drops the tasks not yet started, lets the running one finish and joins the thread.
  ~WorkThread();
  WorkThread(const WorkThread&) = delete;
  WorkThread& operator=(const WorkThread&) = delete;

  void post(std::function<void()> task);
  /// Returns once every posted task has run. The first task that threw ends the queue: the tasks
  /// after it, and those posted until wait() returns, are dropped, and wait() rethrows its
  /// exception, once.
  void wait();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  bool running_task_ = false;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace zeroshard::detail
