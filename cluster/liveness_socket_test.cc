#include "cluster/liveness_socket.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// A BYE frame from token 0x1122334455667788, written out byte by byte from the header's layout.
std::string HandBuiltBye() {
  const unsigned char bytes[] = {0x4b, 0x33, 0x4c, 0x56,   // magic 0x564c334b
                                 0x03, 0x00, 0x00, 0x00,   // type kBye
                                 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  return std::string(reinterpret_cast<const char*>(bytes), sizeof(bytes));
}

TEST(LivenessSocketTest, WritesTheDocumentedBytes) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ASSERT_TRUE(WriteLivenessFrame(fds[0], kBye, 0x1122334455667788ull));
  char buf[64];
  ssize_t n = recv(fds[1], buf, sizeof(buf), 0);
  close(fds[0]);
  close(fds[1]);
  ASSERT_EQ(n, static_cast<ssize_t>(kLivenessFrameSize));
  EXPECT_EQ(std::string(buf, n), HandBuiltBye());
}

TEST(LivenessSocketTest, ParsesTheDocumentedBytes) {
  uint32_t type = 0;
  uint64_t token = 0;
  ASSERT_TRUE(ParseLivenessFrame(HandBuiltBye(), &type, &token));
  EXPECT_EQ(type, 3u);
  EXPECT_EQ(token, 0x1122334455667788ull);
}

TEST(LivenessSocketTest, RejectsWrongMagicAndShortFrames) {
  uint32_t type = 0;
  uint64_t token = 0;
  std::string bad = HandBuiltBye();
  bad[3] = 0;
  EXPECT_FALSE(ParseLivenessFrame(bad, &type, &token));
  EXPECT_FALSE(ParseLivenessFrame(HandBuiltBye().substr(0, 15), &type, &token));
}

TEST(LivenessSocketTest, DialFailsClearlyWhereNobodyListens) {
  // Port 1 on loopback: refused at once (nothing listens there unprivileged).
  absl::StatusOr<int> fd = DialLiveness(htonl(0x7f000001), 1, 1, 2, absl::Now() + absl::Seconds(2));
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fd.status().message().find("127.0.0.1:1"), std::string::npos) << fd.status();
}

}  // namespace
}  // namespace k3
