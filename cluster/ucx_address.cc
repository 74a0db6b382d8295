#include "cluster/ucx_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

constexpr uint32_t kAddressMagic = 0x58553b4b;
constexpr uint8_t kAddressVersion = 1;

}  // namespace

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

bool LittleEndianReader::Le(int bytes, uint64_t* value) {
  if (bytes_.size() - pos_ < static_cast<size_t>(bytes)) return false;
  *value = 0;
  for (int i = 0; i < bytes; ++i) {
    *value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i])) << (8 * i);
  }
  pos_ += bytes;
  return true;
}

bool LittleEndianReader::Bytes(size_t n, std::string* out) {
  if (bytes_.size() - pos_ < n) return false;
  out->assign(bytes_, pos_, n);
  pos_ += n;
  return true;
}

std::string EncodeUcxAddress(const UcxAddress& a) {
  std::string out;
  AppendLittleEndian(out, kAddressMagic, 4);
  AppendLittleEndian(out, kAddressVersion, 1);
  AppendLittleEndian(out, a.token, 8);
  AppendLittleEndian(out, a.host_key.size(), 1);
  out += a.host_key;
  AppendLittleEndian(out, a.port, 2);
  AppendLittleEndian(out, a.ips.size(), 1);
  for (uint32_t ip : a.ips) AppendLittleEndian(out, ntohl(ip), 4);
  AppendLittleEndian(out, a.worker_address.size(), 4);
  out += a.worker_address;
  return out;
}

absl::StatusOr<UcxAddress> DecodeUcxAddress(const std::string& bytes) {
  LittleEndianReader r(bytes);
  UcxAddress a;
  uint64_t magic = 0, version = 0, len = 0, port = 0, count = 0;
  if (!r.Le(4, &magic) || magic != kAddressMagic) {
    return absl::InvalidArgumentError("not a UCX transport address (bad magic)");
  }
  if (!r.Le(1, &version) || version != kAddressVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX transport address version ", version, ", expected ", kAddressVersion));
  }
  bool ok = r.Le(8, &a.token) && r.Le(1, &len) && r.Bytes(len, &a.host_key) && r.Le(2, &port) &&
            r.Le(1, &count);
  for (uint64_t i = 0; ok && i < count; ++i) {
    uint64_t ip = 0;
    ok = r.Le(4, &ip);
    a.ips.push_back(htonl(static_cast<uint32_t>(ip)));
  }
  ok = ok && r.Le(4, &len) && r.Bytes(len, &a.worker_address) && r.AtEnd();
  if (!ok || a.token == 0 || port == 0 || a.ips.empty() || a.worker_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed UCX transport address (", bytes.size(), " bytes)"));
  }
  a.port = static_cast<uint16_t>(port);
  return a;
}

std::string Ipv4String(uint32_t ip) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &ip, text, sizeof(text));
  return text;
}

bool IsLoopbackIpv4(uint32_t ip) { return (ntohl(ip) >> 24) == 127; }

}  // namespace k3
