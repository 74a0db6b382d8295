// NcclTransport's sends and receives. Without a GPU it prints "skipped: no GPU" and runs only the
// checks that need none. With one GPU or more, the two-rank tests run two processes on device 0
// device: each sets a different NCCL_HOSTID, so NCCL treats them as two hosts (it refuses two ranks
// of one host on one GPU) and connects them through its socket transport on loopback. Every
// received byte is checked against a pattern computed from (sender, receiver, round).
#include "cluster/nccl_transport.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cluster/child_process.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr char kRoleEnv[] = "K3_NCCL_TEST_ROLE";
bool have_gpu = false;

#define REQUIRE_GPU() \
  if (!have_gpu) GTEST_SKIP() << "no GPU"

// Bytes rank `from` sends to rank `to` in round `round`: sizes vary, some are empty.
size_t BlockSize(int from, int to, int round) {
  return static_cast<size_t>(((from * 7 + to * 13 + round * 29) % 11) * 40961 % 300000);
}

uint8_t PatternByte(int from, int to, int round, size_t i) {
  return static_cast<uint8_t>((i * 131 + from * 17 + to * 71 + round * 5) >> 2);
}

// One rank's side of `rounds` exchanges between ranks 0 and 1: per round rank 0 sends its block
// and receives rank 1's, rank 1 the other way round; each checks every byte it receives.
absl::Status RunRank(NcclTransport& transport, int rounds) {
  const int me = transport.rank(), peer = 1 - me;
  void* send = nullptr;
  void* recv = nullptr;
  constexpr size_t kMaxBytes = 1 << 20;
  if (cudaSetDevice(transport.device()) != cudaSuccess ||
      cudaMalloc(&send, kMaxBytes) != cudaSuccess || cudaMalloc(&recv, kMaxBytes) != cudaSuccess) {
    return absl::InternalError("cudaMalloc");
  }
  absl::Status status;
  for (int round = 0; round < rounds && status.ok(); ++round) {
    const size_t out_bytes = BlockSize(me, peer, round), in_bytes = BlockSize(peer, me, round);
    std::vector<uint8_t> host(out_bytes);
    for (size_t i = 0; i < out_bytes; ++i) host[i] = PatternByte(me, peer, round, i);
    cudaMemcpy(send, host.data(), out_bytes, cudaMemcpyHostToDevice);
    cudaMemset(recv, 0xee, kMaxBytes);
    for (int step = 0; step < 2 && status.ok(); ++step) {
      status = (step == 0) == (me == 0) ? transport.Send(send, out_bytes, peer)
                                        : transport.Recv(recv, in_bytes, peer);
    }
    if (!status.ok()) break;
    std::vector<uint8_t> got(in_bytes);
    cudaMemcpy(got.data(), recv, in_bytes, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < in_bytes && status.ok(); ++i) {
      if (got[i] != PatternByte(peer, me, round, i)) {
        status = absl::DataLossError(
            absl::StrCat("rank ", me, " round ", round, ": byte ", i, " from ", peer, " differs"));
      }
    }
  }
  cudaFree(send);
  cudaFree(recv);
  return status;
}

NcclTransport::Options ShortTimeouts() {
  NcclTransport::Options options;
  options.init_timeout = absl::Seconds(30);
  options.op_timeout = absl::Seconds(5);
  return options;
}

// Child: reads the unique id (hex), joins as rank 1 of 2 on device 0, runs K3_ROUNDS rounds (0:
// none, it just waits to be killed), prints "ok" or the error.
int RunChild() {
  DieWithParent();
  std::string id_hex;
  std::getline(std::cin, id_hex);
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      NcclTransport::Create(absl::HexStringToBytes(id_hex), 1, 2, 0, ShortTimeouts());
  if (!transport.ok()) {
    std::cout << "error " << transport.status() << std::endl;
    return 1;
  }
  std::cout << "joined" << std::endl;
  absl::Status status = RunRank(**transport, std::atoi(getenv("K3_ROUNDS")));
  std::cout << (status.ok() ? "ok" : absl::StrCat("error ", status.ToString())) << std::endl;
  std::string line;
  std::getline(std::cin, line);  // stay until the parent is done
  return status.ok() ? 0 : 1;
}

// Rank 0 here, rank 1 in a child process, both on device 0.
struct TwoRanks {
  std::unique_ptr<ChildProcess> child;
  std::unique_ptr<NcclTransport> transport;
};

TwoRanks StartTwoRanks(int child_rounds) {
  TwoRanks pair;
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return pair;
  pair.child = ChildProcess::Spawn({{kRoleEnv, "rank1"},
                                    {"NCCL_HOSTID", "k3-nccl-test-rank1"},
                                    {"K3_ROUNDS", absl::StrCat(child_rounds)}});
  EXPECT_NE(pair.child, nullptr);
  if (pair.child == nullptr) return pair;
  pair.child->WriteLine(absl::BytesToHexString(*id));
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      NcclTransport::Create(*id, 0, 2, 0, ShortTimeouts());
  EXPECT_TRUE(transport.ok()) << transport.status();
  EXPECT_EQ(pair.child->ReadLine(absl::Seconds(40)), "joined");
  if (transport.ok()) pair.transport = std::move(*transport);
  return pair;
}

TEST(NcclTransportTest, UniqueIdsAreFreshAndArgumentsAreChecked) {
  absl::StatusOr<std::string> a = NcclTransport::NewUniqueId();
  absl::StatusOr<std::string> b = NcclTransport::NewUniqueId();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), sizeof(ncclUniqueId));
  EXPECT_NE(*a, *b);
  EXPECT_EQ(NcclTransport::Create("short", 0, 1, 0, ShortTimeouts()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclTransport::Create(*a, 2, 2, 0, ShortTimeouts()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusCode no_device =
      NcclTransport::Create(*a, 0, 1, 999, ShortTimeouts()).status().code();
  EXPECT_EQ(no_device,
            have_gpu ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kUnavailable);
}

// A peer outside the communicator (or this rank itself) is refused and aborts it.
TEST(NcclTransportTest, ABadPeerIsRefusedAndAborts) {
  REQUIRE_GPU();
  absl::StatusOr<std::string> id = NcclTransport::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      NcclTransport::Create(*id, 0, 1, 0, ShortTimeouts());
  ASSERT_TRUE(transport.ok()) << transport.status();
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 1024), cudaSuccess);
  EXPECT_EQ((*transport)->Send(buffer, 1024, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*transport)->Recv(buffer, 1024, 0).code(), absl::StatusCode::kFailedPrecondition);
  cudaFree(buffer);
}

TEST(NcclTransportTest, TwoProcessesExchangeVariableBlocks) {
  REQUIRE_GPU();
  TwoRanks pair = StartTwoRanks(/*child_rounds=*/6);
  ASSERT_NE(pair.transport, nullptr);
  absl::Status status = RunRank(*pair.transport, 6);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(pair.child->ReadLine(), "ok");
  pair.child->WriteLine("done");
  pair.transport.reset();
  EXPECT_EQ(pair.child->Wait(), 0);
}

TEST(NcclTransportTest, DeadPeerAbortsTheExchangeInsteadOfHanging) {
  REQUIRE_GPU();
  TwoRanks pair = StartTwoRanks(/*child_rounds=*/0);
  ASSERT_NE(pair.transport, nullptr);
  EXPECT_EQ(pair.child->ReadLine(), "ok");  // it ran no rounds
  pair.child->Kill();
  const absl::Time start = absl::Now();
  absl::Status status = RunRank(*pair.transport, 1);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(status.code() == absl::StatusCode::kDeadlineExceeded ||
              status.code() == absl::StatusCode::kUnavailable)
      << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_EQ(RunRank(*pair.transport, 1).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  // NCCL reads these once; the child gets its own NCCL_HOSTID through its environment.
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
  if (getenv(k3::kRoleEnv) != nullptr) return k3::RunChild();
  setenv("NCCL_HOSTID", "k3-nccl-test-rank0", 1);
  absl::StatusOr<int> devices = k3::NcclTransport::DeviceCount();
  k3::have_gpu = devices.ok();
  if (!k3::have_gpu) printf("skipped: no GPU (%s)\n", devices.status().ToString().c_str());
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
