// UcxReceiver: where a UcxTransport's active messages land. UCX calls OnMessage for each (inside
// ucp_worker_progress), and the receiver turns it into the Inbox's deliveries:
// - a message that arrived eagerly is lent in place (Received::bytes reads UCX's buffer) when UCX
//   lets us keep that buffer and it is aligned for any scalar (moe_wire's in-place decoding
//   needs 4 bytes; UCX's shared-memory buffers are 8-byte aligned), else copied into a string;
// - a rendezvous message is fetched (ucp_am_recv_data_nbx) into a string of the announced size; its
//   place in the sender's order is reserved in the Inbox when it is announced.
// The active message's header is the sender's 8-byte token (ucx_address.h). A message with another
// header is dropped, a rendezvous one after it is fetched (so the sender's request completes).
//
// Ownership: the Inbox is the transport's and outlives the receiver. The receiver owns its fetches
// in flight and the books of the buffers it lent (shared with their borrowers, who may outlive it:
// buffer_lender.h); UCX owns the buffers themselves.
// Thread-safety: none. Every call, like every call into the worker, under the transport's lock.
#ifndef K3SERVE_CLUSTER_UCX_RECEIVER_H_
#define K3SERVE_CLUSTER_UCX_RECEIVER_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>

#include "cluster/buffer_lender.h"
#include "cluster/inbox.h"

namespace k3 {

class UcxReceiver {
 public:
  explicit UcxReceiver(Inbox* inbox) : inbox_(inbox) {}
  UcxReceiver(const UcxReceiver&) = delete;
  UcxReceiver& operator=(const UcxReceiver&) = delete;

  // The worker whose messages come here, once made (it calls OnMessage only while it progresses).
  void set_worker(ucp_worker_h worker) { worker_ = worker; }

  // UCX's active-message callback (ucp_am_recv_callback_t) with this receiver as `arg`, for a
  // worker made with UCP_AM_FLAG_WHOLE_MSG (ucx_worker.h). UCS_INPROGRESS when it keeps `data`.
  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);

  // Gives UCX back the buffers whose borrowers let go (they may let go on any thread, so the
  // buffers wait for whoever drives the worker next).
  void ReleaseReturned();

  // Whether rendezvous fetches are still in flight.
  bool Fetching() const { return !fetches_.empty(); }

  // The worker is closing: `retiree` keeps it alive until the last lent buffer is given back.
  void Retire(std::unique_ptr<BufferLender::Retiree> retiree);
  // The worker is gone: its fetches that never completed are forgotten (never delivered).
  void ForgetFetches();

 private:
  struct Fetch;

  void StartFetch(bool valid, uint64_t token, void* data, size_t length);
  static void OnFetched(void* request, ucs_status_t status, size_t length, void* user_data);

  Inbox* const inbox_;
  ucp_worker_h worker_ = nullptr;
  std::set<Fetch*> fetches_;
  BufferLender lender_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_UCX_RECEIVER_H_
