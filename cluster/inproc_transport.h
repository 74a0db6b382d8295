// A Transport whose peers live in the same process: for unit tests of code that talks over a
// Transport (routers, workers) without starting processes. Messages are moved through in-memory
// queues with the semantics of transport.h, including failure: Kill() makes a transport vanish the
// way a process killed with SIGKILL would, and its peers receive kPeerFailed.
//
// An InProcNetwork is the address space: transports created from one network reach each other,
// and only each other. Thread-safe; the network must outlive its transports.
#ifndef K3SERVE_CLUSTER_INPROC_TRANSPORT_H_
#define K3SERVE_CLUSTER_INPROC_TRANSPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cluster/transport.h"

namespace k3 {

class InProcTransport;

class InProcNetwork {
 public:
  InProcNetwork() = default;
  InProcNetwork(const InProcNetwork&) = delete;
  InProcNetwork& operator=(const InProcNetwork&) = delete;

  std::unique_ptr<InProcTransport> CreateTransport();

 private:
  friend class InProcTransport;
  struct Node;

  std::shared_ptr<Node> Find(uint64_t token);
  void Remove(uint64_t token);

  absl::Mutex mu_;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
};

class InProcTransport : public Transport {
 public:
  ~InProcTransport() override;  // Close()s
  void Close() override;

  std::string LocalAddress() const override;
  absl::Status Connect(PeerId peer, const std::string& address) override;
  void Disconnect(PeerId peer) override;
  absl::Status Send(PeerId peer, std::string message) override;
  absl::StatusOr<Received> Receive(absl::Time deadline) override;

  // Simulates this process dying: every peer that bound it receives kPeerFailed, nothing more is
  // delivered in either direction, and Send/Receive here fail with UNAVAILABLE.
  void Kill();

 private:
  friend class InProcNetwork;
  InProcTransport(InProcNetwork* network, std::shared_ptr<InProcNetwork::Node> node);

  // Tells every transport that knows this one that it is gone; `graceful` says how.
  void Leave(bool graceful);

  InProcNetwork* const network_;
  const std::shared_ptr<InProcNetwork::Node> node_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_INPROC_TRANSPORT_H_
