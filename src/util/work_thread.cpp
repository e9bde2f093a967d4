#include "util/work_thread.h"

#include <utility>

namespace zeroshard::detail {

WorkThread::WorkThread() : thread_([this] { run(); }) {}

WorkThread::~WorkThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    tasks_.clear();
  }
  changed_.notify_all();
  thread_.join();
}

void WorkThread::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (failure_) return;  // the queue has ended; wait() reports why
    tasks_.push_back(std::move(task));
  }
  changed_.notify_all();
}

void WorkThread::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return tasks_.empty() && !running_task_; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void WorkThread::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (stopping_) return;
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    running_task_ = true;
    lock.unlock();
    std::exception_ptr failure;
    try {
      task();
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    running_task_ = false;
    if (failure && !failure_) {
      failure_ = failure;
      tasks_.clear();
    }
    changed_.notify_all();
  }
}

}  // namespace zeroshard::detail
