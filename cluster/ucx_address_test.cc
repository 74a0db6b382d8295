#include "cluster/ucx_address.h"

#include <arpa/inet.h>

#include <string>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// The address of the header's layout written out byte by byte: token 0x0102030405060708, host key
// "hk", port 0x1234, one IPv4 address 127.0.0.1, worker address "WA".
std::string HandBuiltAddress() {
  const unsigned char bytes[] = {
      0x4b, 0x3b, 0x55, 0x58,                          // magic 0x58553b4b
      0x01,                                            // version
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // token
      0x02, 'h',  'k',                                 // host key
      0x34, 0x12,                                      // port
      0x01, 0x01, 0x00, 0x00, 0x7f,                    // one address, 0x7f000001
      0x02, 0x00, 0x00, 0x00, 'W',  'A',               // worker address
  };
  return std::string(reinterpret_cast<const char*>(bytes), sizeof(bytes));
}

UcxAddress HandBuiltFields() {
  UcxAddress a;
  a.token = 0x0102030405060708ull;
  a.host_key = "hk";
  a.port = 0x1234;
  a.ips = {inet_addr("127.0.0.1")};
  a.worker_address = "WA";
  return a;
}

TEST(UcxAddressTest, EncodesTheDocumentedBytes) {
  EXPECT_EQ(EncodeUcxAddress(HandBuiltFields()), HandBuiltAddress());
}

TEST(UcxAddressTest, DecodesTheDocumentedBytes) {
  absl::StatusOr<UcxAddress> a = DecodeUcxAddress(HandBuiltAddress());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->token, 0x0102030405060708ull);
  EXPECT_EQ(a->host_key, "hk");
  EXPECT_EQ(a->port, 0x1234);
  ASSERT_EQ(a->ips.size(), 1u);
  EXPECT_EQ(a->ips[0], inet_addr("127.0.0.1"));
  EXPECT_EQ(a->worker_address, "WA");
}

TEST(UcxAddressTest, RejectsBadMagicAndVersion) {
  std::string bytes = HandBuiltAddress();
  bytes[0] = 0;
  EXPECT_EQ(DecodeUcxAddress(bytes).status().code(), absl::StatusCode::kInvalidArgument);
  bytes = HandBuiltAddress();
  bytes[4] = 2;
  absl::Status status = DecodeUcxAddress(bytes).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("version 2"), std::string::npos) << status;
}

TEST(UcxAddressTest, RejectsEveryTruncationAndTrailingBytes) {
  const std::string bytes = HandBuiltAddress();
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeUcxAddress(bytes.substr(0, n)).ok()) << n << " bytes";
  }
  EXPECT_FALSE(DecodeUcxAddress(bytes + "x").ok());
}

TEST(UcxAddressTest, RejectsZeroTokenPortAndEmptyLists) {
  std::string zero_token = HandBuiltAddress();
  for (int i = 5; i < 13; ++i) zero_token[i] = 0;
  EXPECT_FALSE(DecodeUcxAddress(zero_token).ok());
  std::string zero_port = HandBuiltAddress();
  zero_port[16] = zero_port[17] = 0;
  EXPECT_FALSE(DecodeUcxAddress(zero_port).ok());
  // No IPv4 address: the count byte 0 and the four address bytes gone.
  std::string no_ips = HandBuiltAddress();
  no_ips[18] = 0;
  no_ips.erase(19, 4);
  EXPECT_FALSE(DecodeUcxAddress(no_ips).ok());
  // An empty worker address: length 0, no bytes.
  std::string no_worker = HandBuiltAddress().substr(0, 23) + std::string(4, '\0');
  EXPECT_FALSE(DecodeUcxAddress(no_worker).ok());
}

TEST(UcxAddressTest, Ipv4HelpersReadNetworkOrder) {
  EXPECT_EQ(Ipv4String(inet_addr("10.1.2.3")), "10.1.2.3");
  EXPECT_TRUE(IsLoopbackIpv4(inet_addr("127.0.0.1")));
  EXPECT_TRUE(IsLoopbackIpv4(inet_addr("127.200.0.9")));
  EXPECT_FALSE(IsLoopbackIpv4(inet_addr("10.0.0.127")));
}

}  // namespace
}  // namespace k3
