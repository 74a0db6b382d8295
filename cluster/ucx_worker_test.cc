#include "cluster/ucx_worker.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace k3 {
namespace {

ucs_status_t IgnoreMessage(void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
  return UCS_OK;
}

// UCX_TLS lists transports to use, or with a leading '^' transports to leave out; "sm"/"shm" name
// every shared-memory transport, "posix" and "sysv" two of them, "all" everything.
TEST(UcxWorkerTest, SharedMemoryEnabledFollowsTheUcxTlsSyntax) {
  unsetenv("UCX_TLS");
  EXPECT_TRUE(SharedMemoryEnabled(""));
  EXPECT_TRUE(SharedMemoryEnabled("all"));
  EXPECT_TRUE(SharedMemoryEnabled("posix,cma,self"));
  EXPECT_TRUE(SharedMemoryEnabled("tcp,sysv"));
  EXPECT_TRUE(SharedMemoryEnabled("shm"));
  EXPECT_FALSE(SharedMemoryEnabled("tcp"));
  EXPECT_FALSE(SharedMemoryEnabled("tcp,cma,self"));
  EXPECT_TRUE(SharedMemoryEnabled("^tcp"));
  EXPECT_TRUE(SharedMemoryEnabled("^posix"));  // sysv is still there
  EXPECT_FALSE(SharedMemoryEnabled("^posix,sysv"));
  EXPECT_FALSE(SharedMemoryEnabled("^sm"));
  // Empty means the environment's choice.
  setenv("UCX_TLS", "tcp", 1);
  EXPECT_FALSE(SharedMemoryEnabled(""));
  EXPECT_TRUE(SharedMemoryEnabled("posix"));
  unsetenv("UCX_TLS");
}

TEST(UcxWorkerTest, CreatesAWorkerWithAnEventFdAndAnAddress) {
  absl::StatusOr<UcxWorker> ucx = CreateUcxWorker({}, 7, &IgnoreMessage, nullptr);
  ASSERT_TRUE(ucx.ok()) << ucx.status();
  EXPECT_NE(ucx->context, nullptr);
  EXPECT_NE(ucx->worker, nullptr);
  EXPECT_GE(ucx->event_fd, 0);
  absl::StatusOr<std::string> address = UcxWorkerAddress(ucx->worker);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_FALSE(address->empty());
  DestroyUcxWorker(*ucx);
}

TEST(UcxWorkerTest, SettingsUcxRefusesAreInvalidArguments) {
  UcxWorkerSettings settings;
  settings.eager_limit = "a lot";
  absl::StatusOr<UcxWorker> ucx = CreateUcxWorker(settings, 7, &IgnoreMessage, nullptr);
  EXPECT_EQ(ucx.status().code(), absl::StatusCode::kInvalidArgument) << ucx.status();
  EXPECT_NE(ucx.status().message().find("a lot"), std::string::npos) << ucx.status();
}

}  // namespace
}  // namespace k3
