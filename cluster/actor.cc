#include "cluster/actor.h"

#include <pthread.h>

#include <utility>

#include "glog/logging.h"

namespace k3 {

Actor::Actor(std::string name) : name_(std::move(name)) {
  // thread_id_ is written before the thread runs anything that reads it.
  absl::MutexLock lock(&mu_);
  thread_ = std::thread([this] { Loop(); });
  thread_id_ = thread_.get_id();
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

Actor::~Actor() { Stop(); }

bool Actor::Post(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  ready_.push_back(std::move(fn));
  wake_.Signal();
  return true;
}

bool Actor::PostAfter(absl::Duration delay, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  timers_.push(Timer{absl::Now() + delay, next_seq_++, std::move(fn)});
  wake_.Signal();
  return true;
}

void Actor::Stop() {
  CHECK(!IsCurrent()) << "Actor " << name_ << " cannot stop itself";
  absl::MutexLock stop_lock(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void Actor::Loop() {
  {
    // Wait for the constructor to finish publishing thread_id_.
    absl::MutexLock lock(&mu_);
  }
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        const absl::Time now = absl::Now();
        while (!stopping_ && !timers_.empty() && timers_.top().due <= now) {
          // priority_queue::top is const; the closure is moved out just before pop.
          ready_.push_back(std::move(const_cast<Timer&>(timers_.top()).fn));
          timers_.pop();
        }
        if (!ready_.empty()) break;
        if (stopping_) return;  // pending timers are dropped with the actor
        if (timers_.empty()) {
          wake_.Wait(&mu_);
        } else {
          wake_.WaitWithDeadline(&mu_, timers_.top().due);
        }
      }
      fn = std::move(ready_.front());
      ready_.pop_front();
    }
    fn();
  }
}

}  // namespace k3
