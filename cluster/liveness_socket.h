// The UCX transport's TCP liveness sidecar (see ucx_transport.h, "Liveness"): the frames both
// ends exchange on it and the dialing side's handshake. A frame is 16 bytes, little-endian:
// u32 magic 0x564c334b, u32 type (LivenessFrame), u64 the sender's transport token.
// All functions are safe from any thread; each works on the descriptor it is given.
#ifndef K3_CLUSTER_LIVENESS_SOCKET_H_
#define K3_CLUSTER_LIVENESS_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3 {

constexpr size_t kLivenessFrameSize = 16;
enum LivenessFrame : uint32_t { kHello = 1, kHelloAck = 2, kBye = 3, kByeAck = 4 };

// "what: strerror(errno)".
std::string ErrnoMessage(const char* what);

// Milliseconds for poll() until `deadline`, rounded up, at least 0.
int PollMillisUntil(absl::Time deadline);

// Keepalive probes (a vanished host is noticed in about 5 s) and TCP_NODELAY on `fd`.
void SetLivenessKeepalive(int fd);

// Sends one frame without blocking; false unless all 16 bytes went out at once.
bool WriteLivenessFrame(int fd, uint32_t type, uint64_t token);

// Reads one frame from the first 16 bytes of `bytes`; false on too few bytes or a wrong magic.
bool ParseLivenessFrame(const std::string& bytes, uint32_t* type, uint64_t* token);

// Opens the liveness socket to `ip:port` (IPv4, network byte order) and shakes hands: HELLO with
// `our_token`, HELLO_ACK with theirs, which must be `expected_token`. Returns the connected,
// non-blocking descriptor with keepalive on, which the caller owns; UNAVAILABLE naming the
// address and the reason otherwise (no answer by `deadline`, not a transport, a stale address).
absl::StatusOr<int> DialLiveness(uint32_t ip, uint16_t port, uint64_t our_token,
                                 uint64_t expected_token, absl::Time deadline);

}  // namespace k3

#endif  // K3_CLUSTER_LIVENESS_SOCKET_H_
