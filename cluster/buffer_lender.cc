#include "cluster/buffer_lender.h"

#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace k3 {

struct BufferLender::Books {
  mutable absl::Mutex mu;
  // Buffers given back, for the transport's next driver to free.
  std::vector<void*> returned ABSL_GUARDED_BY(mu);
  // Whether `returned` may be non-empty: read without the lock by drivers polling in a loop.
  std::atomic<bool> any_returned{false};
  // Lent and not yet handed to a freer (returned ones included).
  int64_t outstanding ABSL_GUARDED_BY(mu) = 0;
  // Set once the transport closed with buffers still lent.
  std::unique_ptr<Retiree> retiree ABSL_GUARDED_BY(mu);

  std::vector<void*> TakeReturned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<void*> taken;
    taken.swap(returned);
    outstanding -= static_cast<int64_t>(taken.size());
    any_returned.store(false, std::memory_order_relaxed);
    return taken;
  }

  void GiveBack(void* buffer) {
    absl::MutexLock lock(&mu);
    if (retiree == nullptr) {
      returned.push_back(buffer);
      any_returned.store(true, std::memory_order_release);
      return;
    }
    retiree->Release(buffer);
    if (--outstanding == 0) retiree.reset();
  }
};

BufferLender::BufferLender() : books_(std::make_shared<Books>()) {}

MessageBytes BufferLender::Lend(const char* data, size_t size) {
  {
    absl::MutexLock lock(&books_->mu);
    ++books_->outstanding;
  }
  return MessageBytes::Lent(data, size, [books = books_, data] {
    books->GiveBack(const_cast<char*>(data));
  });
}

bool BufferLender::AnyReturned() const {
  return books_->any_returned.load(std::memory_order_acquire);
}

std::vector<void*> BufferLender::TakeReturned() {
  absl::MutexLock lock(&books_->mu);
  return books_->TakeReturned();
}

void BufferLender::Retire(std::unique_ptr<Retiree> retiree) {
  // From here on borrowers wait for the lock, then find the retiree.
  absl::MutexLock lock(&books_->mu);
  for (void* buffer : books_->TakeReturned()) retiree->Release(buffer);
  if (books_->outstanding > 0) {
    books_->retiree = std::move(retiree);
  } else {
    retiree.reset();
  }
}

int64_t BufferLender::Outstanding() const {
  absl::MutexLock lock(&books_->mu);
  return books_->outstanding;
}

}  // namespace k3
