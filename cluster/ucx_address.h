// The address a UcxTransport advertises (UcxTransport::LocalAddress) and a peer passes to Connect:
// what a peer needs to reach this process, as a byte string the cluster's control plane carries.
//
// Layout (integers little-endian):
//   u32 magic 0x58553b4b, u8 version 1, u64 token (nonzero; names this transport instance),
//   u8 host key length + host key bytes (equal keys: same kernel and network namespace),
//   u16 liveness port (nonzero; the TCP liveness socket), u8 IPv4 count (at least 1) + that many
//   u32 addresses (written as host-order numbers, 127.0.0.1 -> 0x7f000001),
//   u32 worker address length (at least 1) + the UCX worker address bytes.
// Nothing may follow. The helpers here are pure functions, safe from any thread.
#ifndef K3_CLUSTER_UCX_ADDRESS_H_
#define K3_CLUSTER_UCX_ADDRESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

struct UcxAddress {
  uint64_t token = 0;
  std::string host_key;
  uint16_t port = 0;
  std::vector<uint32_t> ips;  // network byte order (as in sockaddr_in::sin_addr.s_addr)
  std::string worker_address;
};

// Encodes `address` in the layout above. The host key and the IPv4 list must each fit a u8 count.
std::string EncodeUcxAddress(const UcxAddress& address);

// Decodes the layout above; InvalidArgument on a wrong magic or version, on truncated or trailing
// bytes, and on a zero token, a zero port, no IPv4 address or an empty worker address.
absl::StatusOr<UcxAddress> DecodeUcxAddress(const std::string& bytes);

// "a.b.c.d" for an IPv4 address in network byte order.
std::string Ipv4String(uint32_t ip);

// Whether an IPv4 address (network byte order) is in 127.0.0.0/8.
bool IsLoopbackIpv4(uint32_t ip);

// The little-endian byte codec the address and the liveness socket's frames share.
void AppendLittleEndian(std::string& out, uint64_t value, int bytes);

// Reads little-endian integers and byte runs from the front of a string it does not own (which
// must outlive it); each read fails, without moving, when too few bytes are left.
class LittleEndianReader {
 public:
  explicit LittleEndianReader(const std::string& bytes) : bytes_(bytes) {}
  bool Le(int bytes, uint64_t* value);
  bool Bytes(size_t n, std::string* out);
  bool AtEnd() const { return pos_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  size_t pos_ = 0;
};

}  // namespace k3

#endif  // K3_CLUSTER_UCX_ADDRESS_H_
