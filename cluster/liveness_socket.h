// The TCP liveness sidecar of UcxTransport (ucx_transport.h, "Liveness"): a plain TCP socket per
// connection between two transports, whose EOF without a goodbye means the peer's process died.
// This file holds its wire format and its socket calls; which frame means what in the transport's
// close handshake stays with the transport.
//
// Frames: 16 bytes, u32 magic 0x564c334b, u32 type (LivenessFrame), u64 sender's token, all
// little-endian. Dialing shakes hands: HELLO with our token, HELLO_ACK with theirs.
//
// Functions only, on file descriptors the caller owns (each says when it hands one over); safe
// from any thread.
#ifndef K3SERVE_CLUSTER_LIVENESS_SOCKET_H_
#define K3SERVE_CLUSTER_LIVENESS_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3 {

constexpr size_t kLivenessFrameSize = 16;
enum LivenessFrame : uint32_t { kHello = 1, kHelloAck = 2, kBye = 3, kByeAck = 4 };

// Sends one frame without blocking; false unless all of it went out.
bool WriteLivenessFrame(int fd, uint32_t type, uint64_t token);

// Reads a frame from the first kLivenessFrameSize bytes of `bytes`; false on too few bytes or a
// wrong magic.
bool ParseLivenessFrame(const std::string& bytes, uint32_t* type, uint64_t* token);

// The IPv4 addresses (network byte order) a transport advertises: `advertise_ips` parsed, or when
// empty every IPv4 address of an interface that is up. InvalidArgument on a text that is not an
// IPv4 address, Unavailable when no interface has one.
absl::StatusOr<std::vector<uint32_t>> AdvertisedIpv4s(
    const std::vector<std::string>& advertise_ips);

struct LivenessListener {
  int fd = -1;  // non-blocking; the caller owns it
  uint16_t port = 0;
};

// Listens on every interface at a port the kernel picks.
absl::StatusOr<LivenessListener> ListenForLiveness();

// Accepts one waiting connection (non-blocking, with keepalive probes of about 5 s); the caller
// owns the descriptor. -1 when none is waiting.
int AcceptLiveness(int listen_fd);

// Opens the liveness socket to `ip:port` (network byte order) and shakes hands: HELLO with
// `our_token`, HELLO_ACK with theirs, which must be `expected_token` (else the address is stale).
// The caller owns the returned descriptor (non-blocking, with keepalive probes). Unavailable,
// naming `ip:port`, when it cannot connect or the handshake fails by `deadline`.
absl::StatusOr<int> DialLiveness(uint32_t ip, uint16_t port, uint64_t our_token,
                                 uint64_t expected_token, absl::Time deadline);

// poll()'s timeout for `deadline`: milliseconds left, rounded up, at least 0.
int PollTimeoutMillis(absl::Time deadline);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_LIVENESS_SOCKET_H_
