// BufferLender: the books of the receive buffers a transport lends out as MessageBytes instead of
// copying them (UcxTransport's "Receiving in place", ucx_transport.h).
//
// The transport owns the buffers' memory (UCX's receive buffers) and may free a buffer only while
// it drives UCX; a borrower may let go anywhere, on any thread, even while it holds the
// transport's or the Inbox's lock. So a buffer given back while the transport lives is only
// queued, and the transport's next driver takes the queue (TakeReturned) and frees those buffers.
//
// A transport that closes while buffers are still lent hands the lender a Retiree: whatever owns
// the buffers' memory (UCX's worker and context), kept alive past the transport. From then on
// every buffer given back goes straight to the Retiree, and the last one destroys it.
//
// Ownership: the books are shared by the lender and every MessageBytes it lent, so a borrower may
// outlive both the lender and the transport. The lender never owns the buffers themselves.
// Thread-safety: every method from any thread. The internal lock is a leaf: taken under the
// transport's lock, never the other way round, and held while a Retiree releases or is destroyed.
#ifndef K3SERVE_CLUSTER_BUFFER_LENDER_H_
#define K3SERVE_CLUSTER_BUFFER_LENDER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cluster/message_bytes.h"

namespace k3 {

class BufferLender {
 public:
  // Frees the buffers given back after the transport closed; destroyed right after the last one
  // (its destructor frees what the buffers lived in).
  class Retiree {
   public:
    virtual ~Retiree() = default;
    virtual void Release(void* buffer) = 0;
  };

  BufferLender();
  BufferLender(const BufferLender&) = delete;
  BufferLender& operator=(const BufferLender&) = delete;

  // Lends [data, data + size) in place: the MessageBytes reads it there and gives `data` back
  // when it is destroyed or assigned over. Not after Retire.
  MessageBytes Lend(const char* data, size_t size);

  // Whether TakeReturned may find buffers: a lock-free hint for drivers polling in a loop (false
  // right after a TakeReturned, true from a give-back until the next TakeReturned).
  bool AnyReturned() const;

  // Empties the queue of buffers given back: they count as lent no longer, and the caller frees
  // them.
  std::vector<void*> TakeReturned();

  // The transport is closing: `retiree` frees every buffer already given back, and every one given
  // back from now on. It is destroyed before Retire returns when nothing is lent any more, else
  // right after the last lent buffer comes back.
  void Retire(std::unique_ptr<Retiree> retiree);

  // Buffers lent and not yet handed to their freer (TakeReturned or the Retiree).
  int64_t Outstanding() const;

 private:
  struct Books;
  const std::shared_ptr<Books> books_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_BUFFER_LENDER_H_
