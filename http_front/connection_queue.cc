#include "http_front/connection_queue.h"

#include <utility>

namespace k3 {
namespace {

thread_local bool shedding = false;

}  // namespace

ConnectionQueue::ConnectionQueue(int max_connections, absl::Duration idle_timeout,
                                 std::function<void()> on_shed)
    : max_connections_(max_connections),
      idle_timeout_(idle_timeout),
      on_shed_(std::move(on_shed)) {}

ConnectionQueue::~ConnectionQueue() { shutdown(); }

bool ConnectionQueue::Shedding() { return shedding; }

void ConnectionQueue::enqueue(std::function<void()> task) {
  bool shed;
  {
    absl::MutexLock lock(&mu_);
    ReapExited();
    shed = serving_ >= max_connections_;
    ++(shed ? shedding_ : serving_);
    tasks_.push_back({std::move(task), shed});
    // A new thread when every thread is busy; the cap only makes connections past the limit wait
    // for one of the kShedThreads (those within it never find all threads busy).
    if (tasks_.size() > static_cast<size_t>(idle_) &&
        threads_.size() < static_cast<size_t>(max_connections_ + kShedThreads)) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  if (shed && on_shed_) on_shed_();
}

void ConnectionQueue::Work() {
  mu_.Lock();
  for (;;) {
    ++idle_;
    auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !tasks_.empty() || stopping_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&has_work), idle_timeout_);
    --idle_;
    if (tasks_.empty()) {  // idle too long, or shutting down with nothing left to serve
      if (!stopping_) exited_.push_back(std::this_thread::get_id());
      break;
    }
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    shedding = task.shed;
    task.run();
    shedding = false;
    mu_.Lock();
    --(task.shed ? shedding_ : serving_);
  }
  mu_.Unlock();
}

void ConnectionQueue::ReapExited() {
  for (const std::thread::id id : exited_) {
    for (auto it = threads_.begin(); it != threads_.end(); ++it) {
      if (it->get_id() != id) continue;
      it->join();  // it has left Work (or is about to): no wait for work
      threads_.erase(it);
      break;
    }
  }
  exited_.clear();
}

void ConnectionQueue::shutdown() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
    exited_.clear();
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace k3
