// The UCX objects a UcxTransport drives: one context and one worker, made for active messages with
// a wake-up event fd, in UCS_THREAD_MODE_SERIALIZED (the caller makes every call on them under one
// lock), plus what decides how they are made.
//
// Ownership: CreateUcxWorker hands both to the caller, who destroys them with DestroyUcxWorker, or
// hands them to a UcxRetiree when received buffers still point into the worker (buffer_lender.h).
// The functions keep no state; each is safe from any thread for objects no other thread uses.
#ifndef K3SERVE_CLUSTER_UCX_WORKER_H_
#define K3SERVE_CLUSTER_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <string>

#include "absl/status/statusor.h"
#include "cluster/buffer_lender.h"

namespace k3 {

// UcxTransportOptions' fields of the same names (ucx_transport.h); empty: UCX's own setting.
struct UcxWorkerSettings {
  std::string tls;
  std::string net_devices;
  std::string eager_limit;  // UCX_RNDV_THRESH, unless that environment variable is set
};

struct UcxWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int event_fd = -1;  // the worker's; poll it after ucp_worker_arm
};

// Creates the context and the worker; `on_message(arg, ...)` receives every active message `am_id`
// whole (UCP_AM_FLAG_WHOLE_MSG). InvalidArgument for settings UCX refuses, Unavailable when UCX
// cannot start; nothing is left behind on failure.
absl::StatusOr<UcxWorker> CreateUcxWorker(const UcxWorkerSettings& settings, unsigned am_id,
                                          ucp_am_recv_callback_t on_message, void* arg);

void DestroyUcxWorker(const UcxWorker& ucx);

// The worker's address, as a peer passes it to ucp_ep_create.
absl::StatusOr<std::string> UcxWorkerAddress(ucp_worker_h worker);

// Whether UCX may pick a shared-memory transport under `tls` (UCX_TLS syntax; empty: the UCX_TLS
// environment variable, else all).
bool SharedMemoryEnabled(std::string tls);

// Keeps a context and worker alive past a transport that closed while received buffers were still
// lent (they point into the worker's memory), releases those buffers as they come back, and
// destroys both after the last.
class UcxRetiree final : public BufferLender::Retiree {
 public:
  explicit UcxRetiree(const UcxWorker& ucx) : ucx_(ucx) {}
  ~UcxRetiree() override { DestroyUcxWorker(ucx_); }
  void Release(void* buffer) override { ucp_am_data_release(ucx_.worker, buffer); }

 private:
  const UcxWorker ucx_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_UCX_WORKER_H_
