#include "cluster/liveness_socket.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr uint64_t kOurToken = 0x1122334455667788;
constexpr uint64_t kTheirToken = 0x0102030405060708;

// Reads exactly `n` bytes from a blocking or non-blocking socket within a few seconds.
std::string ReadBytes(int fd, size_t n) {
  std::string bytes;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (bytes.size() < n && absl::Now() < deadline) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) != 1) continue;
    char buf[64];
    ssize_t got = recv(fd, buf, std::min(sizeof(buf), n - bytes.size()), 0);
    if (got <= 0) break;
    bytes.append(buf, got);
  }
  return bytes;
}

TEST(LivenessSocketTest, FrameBytesFollowTheLayout) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ASSERT_TRUE(WriteLivenessFrame(fds[0], kBye, kOurToken));
  // Magic 0x564c334b, type 3, token, each little-endian.
  const std::string expected("\x4b\x33\x4c\x56\x03\x00\x00\x00\x88\x77\x66\x55\x44\x33\x22\x11",
                             16);
  const std::string got = ReadBytes(fds[1], kLivenessFrameSize);
  EXPECT_EQ(got, expected);
  uint32_t type = 0;
  uint64_t token = 0;
  ASSERT_TRUE(ParseLivenessFrame(expected, &type, &token));
  EXPECT_EQ(type, kBye);
  EXPECT_EQ(token, kOurToken);
  close(fds[0]);
  close(fds[1]);
}

TEST(LivenessSocketTest, ParseRefusesAWrongMagicAndAShortFrame) {
  uint32_t type = 0;
  uint64_t token = 0;
  std::string frame("\x4b\x33\x4c\x57\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00", 16);
  EXPECT_FALSE(ParseLivenessFrame(frame, &type, &token));
  frame[3] = '\x56';
  EXPECT_TRUE(ParseLivenessFrame(frame, &type, &token));
  EXPECT_FALSE(ParseLivenessFrame(frame.substr(0, 15), &type, &token));
}

TEST(LivenessSocketTest, AdvertisedIpv4sParsesGivenAddressesInNetworkOrder) {
  absl::StatusOr<std::vector<uint32_t>> ips = AdvertisedIpv4s({"10.1.2.3", "127.0.0.1"});
  ASSERT_TRUE(ips.ok()) << ips.status();
  EXPECT_EQ(*ips, (std::vector<uint32_t>{htonl(0x0a010203), htonl(0x7f000001)}));
  EXPECT_EQ(AdvertisedIpv4s({"10.1.2"}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<uint32_t>> found = AdvertisedIpv4s({});
  ASSERT_TRUE(found.ok()) << found.status();  // loopback at least is up
  EXPECT_NE(std::find(found->begin(), found->end(), htonl(0x7f000001)), found->end());
}

// Accepts one connection on `listen_fd`, reads HELLO and answers HELLO_ACK with `token` (or
// nothing, when `answer` is false); returns the HELLO's bytes.
std::string ServeOneHandshake(int listen_fd, uint64_t token, bool answer) {
  int fd = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (fd < 0 && absl::Now() < deadline) {
    pollfd p = {listen_fd, POLLIN, 0};
    if (poll(&p, 1, 100) == 1) fd = AcceptLiveness(listen_fd);
  }
  if (fd < 0) return "";
  std::string hello = ReadBytes(fd, kLivenessFrameSize);
  if (answer) WriteLivenessFrame(fd, kHelloAck, token);
  ReadBytes(fd, 1);  // until the dialer closes (or gives up)
  close(fd);
  return hello;
}

TEST(LivenessSocketTest, DialShakesHandsWithTheExpectedProcess) {
  absl::StatusOr<LivenessListener> listener = ListenForLiveness();
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_NE(listener->port, 0);
  std::string hello;
  std::thread peer([&] { hello = ServeOneHandshake(listener->fd, kTheirToken, true); });
  absl::StatusOr<int> fd = DialLiveness(htonl(INADDR_LOOPBACK), listener->port, kOurToken,
                                        kTheirToken, absl::Now() + absl::Seconds(3));
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  peer.join();
  uint32_t type = 0;
  uint64_t token = 0;
  ASSERT_TRUE(ParseLivenessFrame(hello, &type, &token));
  EXPECT_EQ(type, kHello);
  EXPECT_EQ(token, kOurToken);
  close(listener->fd);
}

TEST(LivenessSocketTest, DialRefusesAnotherProcessAtTheAddress) {
  absl::StatusOr<LivenessListener> listener = ListenForLiveness();
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::thread peer([&] { ServeOneHandshake(listener->fd, kTheirToken + 1, true); });
  absl::StatusOr<int> fd = DialLiveness(htonl(INADDR_LOOPBACK), listener->port, kOurToken,
                                        kTheirToken, absl::Now() + absl::Seconds(3));
  peer.join();
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fd.status().message().find("stale"), std::string::npos) << fd.status();
  close(listener->fd);
}

TEST(LivenessSocketTest, DialGivesUpAtTheDeadlineWhenNoAnswerComes) {
  absl::StatusOr<LivenessListener> listener = ListenForLiveness();
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::thread peer([&] { ServeOneHandshake(listener->fd, kTheirToken, false); });
  const absl::Time start = absl::Now();
  absl::StatusOr<int> fd = DialLiveness(htonl(INADDR_LOOPBACK), listener->port, kOurToken,
                                        kTheirToken, start + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  peer.join();
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fd.status().message().find("no answer"), std::string::npos) << fd.status();
  EXPECT_GE(took, absl::Milliseconds(290));
  close(listener->fd);
}

TEST(LivenessSocketTest, PollTimeoutRoundsUpAndNeverGoesNegative) {
  EXPECT_EQ(PollTimeoutMillis(absl::Now() - absl::Seconds(1)), 0);
  const int ms = PollTimeoutMillis(absl::Now() + absl::Milliseconds(1500));
  EXPECT_GE(ms, 1499);
  EXPECT_LE(ms, 1500);
}

}  // namespace
}  // namespace k3
