// The data plane between k3serve processes: a small message transport. Attention workers send token
// rows to routers, routers dispatch latent rows to expert workers and collect their answers over
// it. gRPC carries only control messages (including the addresses this transport hands out).
//
// Model: every process owns one Transport. LocalAddress() returns opaque bytes that the control
// plane ships to other processes; Connect(peer, address) binds a caller-chosen PeerId (e.g. the
// coordinator's node id) to that address. Links are directional in naming only: a message sent by
// A is delivered to B with `from` = the PeerId that B itself bound to A's address, so both sides
// must Connect each other (each with its own ids). Messages that arrive from a process B has not
// (yet) connected are held (without limit) and delivered, in order, once B connects it.
//
// Delivery: reliable and in order per sender. Send is asynchronous; it fails immediately for an
// unknown, failed or closed peer, and a failure that happens after it returned is reported as a
// kPeerFailed event from Receive. A peer's failure (its process died, its host or link dropped) is
// reported once, promptly (within about a second of the process dying), after every message that
// had arrived from it. A graceful close (Disconnect, or the peer's Close/destructor) produces no
// event: later Sends to that peer return FAILED_PRECONDITION.
//
// Thread-safety: all methods may be called from any thread concurrently.
#ifndef K3SERVE_CLUSTER_TRANSPORT_H_
#define K3SERVE_CLUSTER_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/message_bytes.h"

namespace k3 {

using PeerId = uint64_t;

struct Received {
  enum class Kind {
    kMessage,     // `bytes` is a message from `from`.
    kPeerFailed,  // `from` failed; `error` (UNAVAILABLE) names it and says why. No more messages
                  // from it will be delivered, Sends to it fail; Connect it again to recover.
  };
  Kind kind = Kind::kMessage;
  PeerId from = 0;
  // Owned, or lent by the transport (its receive buffer, read in place): keep it only as long as
  // needed, and destroy it before the Transport.
  MessageBytes bytes;
  absl::Status error;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Bytes to give to other processes' Connect. Stable for the Transport's life.
  virtual std::string LocalAddress() const = 0;

  // Binds `peer` to the process at `address` and makes it reachable. Connecting a bound, healthy
  // peer to the same address again is a no-op. Errors: INVALID_ARGUMENT (malformed address, or
  // this Transport's own address), ALREADY_EXISTS (`peer` is bound to another address, or another
  // PeerId to this one), UNAVAILABLE (the process does not answer within a few seconds, or it is
  // not the one that published the address). A PeerId whose peer failed or closed may be bound
  // again (to a restarted process's new address).
  virtual absl::Status Connect(PeerId peer, const std::string& address) = 0;

  // Gracefully closes the link to `peer` after delivering what was sent to it; neither side sees
  // a failure. No-op for unknown peers.
  virtual void Disconnect(PeerId peer) = 0;

  // Queues `message` for `peer`. Errors: NOT_FOUND (never connected), FAILED_PRECONDITION (closed
  // gracefully, by either side, or Close() was called), UNAVAILABLE (the peer failed).
  virtual absl::Status Send(PeerId peer, std::string message) = 0;

  // Waits for the next message or peer failure until `deadline`. DEADLINE_EXCEEDED when nothing
  // arrived in time; CANCELLED once Close() was called and nothing is left to deliver.
  virtual absl::StatusOr<Received> Receive(absl::Time deadline) = 0;

  // Gracefully disconnects every peer and wakes blocked Receive calls. Idempotent; the destructor
  // calls it.
  virtual void Close() = 0;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_TRANSPORT_H_
