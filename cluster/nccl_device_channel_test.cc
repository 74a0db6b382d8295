// NCCL device channels (cluster/nccl_device_channel.h) between two GPUs of one process: two
// DeviceChannels (cluster/device_channels.h), "node 1" on device 0 and "node 2" on device 1,
// each opening its ends of a channel pair with OpenNcclDeviceChannel on its own opener thread, as
// two processes would. NCCL refuses two ranks of one communicator on one GPU, so those cases need
// two GPUs and skip themselves with one. The two-process cases run node 2 in a child process on
// the same GPU with another NCCL_HOSTID (as nccl_transport_test does: NCCL then treats the two
// as hosts and connects them through its socket transport on loopback), so one GPU checks the
// channel's Send/Recv matching, sizes and dead-peer handling too. Without a GPU main prints
// "skipped: no GPU".
// Every received byte is checked against a pattern computed from (channel, message, index).
#include "cluster/nccl_device_channel.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/child_process.h"
#include "cluster/device_channels.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace pb = k3serve::cluster::v1;

constexpr char kRoleEnv[] = "K3_DEVICE_CHANNEL_TEST_ROLE";
int gpus = 0;

#define REQUIRE_TWO_GPUS()                 \
  if (gpus == 0) GTEST_SKIP() << "no GPU"; \
  if (gpus < 2) GTEST_SKIP() << "needs two GPUs (found 1)"

uint8_t PatternByte(uint64_t channel, int message, size_t i) {
  return static_cast<uint8_t>((i * 131 + channel * 17 + message * 71) >> 2);
}

// Bytes of message `message`: sizes from 1 byte to a few MiB, not multiples of anything.
size_t MessageBytes(int message) { return static_cast<size_t>(1 + message * 1234567 % 5000000); }

NcclTransport::Options Timeouts(absl::Duration op) {
  NcclTransport::Options options;
  options.init_timeout = absl::Seconds(30);
  options.op_timeout = op;
  return options;
}

// A node's channels on `device`, opened through NCCL.
std::unique_ptr<DeviceChannels> NodeOn(int device, absl::Duration op_timeout) {
  return std::make_unique<DeviceChannels>(
      [device, op_timeout](const DeviceChannelSpec& spec, bool as_sender) {
        return OpenNcclDeviceChannel(spec, as_sender, device, Timeouts(op_timeout));
      });
}

// Channel 1: node 1 -> node 2, channel 2: node 2 -> node 1, with fresh NCCL unique ids.
pb::ClusterState PairState() {
  pb::ClusterState state;
  for (uint64_t id : {1, 2}) {
    pb::DeviceChannel* c = state.add_device_channels();
    c->set_id(id);
    c->set_sender(id == 1 ? 1 : 2);
    c->set_receiver(id == 1 ? 2 : 1);
    c->set_nccl_unique_id(NcclTransport::NewUniqueId().value());
  }
  return state;
}

bool WaitOpen(DeviceChannels& a, DeviceChannels& b) {
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (a.OpenIds().size() < 2 || b.OpenIds().size() < 2) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Sends `messages` patterned messages on `channel` from `device`.
absl::Status SendAll(DeviceChannel& channel, uint64_t id, int device, int messages) {
  cudaSetDevice(device);
  void* buffer = nullptr;
  if (cudaMalloc(&buffer, MessageBytes(messages)) != cudaSuccess) {
    return absl::InternalError("cudaMalloc");
  }
  absl::Status status;
  for (int m = 0; m < messages && status.ok(); ++m) {
    std::vector<uint8_t> host(MessageBytes(m));
    for (size_t i = 0; i < host.size(); ++i) host[i] = PatternByte(id, m, i);
    cudaMemcpy(buffer, host.data(), host.size(), cudaMemcpyHostToDevice);
    status = channel.Send(buffer, host.size());
  }
  cudaFree(buffer);
  return status;
}

// Receives `messages` messages on `channel` into `device` memory and checks every byte.
absl::Status ReceiveAll(DeviceChannel& channel, uint64_t id, int device, int messages) {
  cudaSetDevice(device);
  void* buffer = nullptr;
  if (cudaMalloc(&buffer, MessageBytes(messages)) != cudaSuccess) {
    return absl::InternalError("cudaMalloc");
  }
  absl::Status status;
  for (int m = 0; m < messages && status.ok(); ++m) {
    std::vector<uint8_t> host(MessageBytes(m));
    status = channel.Recv(buffer, host.size());
    if (!status.ok()) break;
    cudaMemcpy(host.data(), buffer, host.size(), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < host.size(); ++i) {
      if (host[i] != PatternByte(id, m, i)) {
        status = absl::DataLossError(
            absl::StrCat("channel ", id, " message ", m, ": byte ", i, " differs"));
        break;
      }
    }
  }
  cudaFree(buffer);
  return status;
}

// The two channels' unique ids as one line of hex for the child.
std::string IdsLine(const pb::ClusterState& state) {
  return absl::BytesToHexString(state.device_channels(0).nccl_unique_id() +
                                state.device_channels(1).nccl_unique_id());
}

// Child: node 2 on device 0. Reads the unique ids, opens its ends of the pair, then receives
// K3_MESSAGES messages on channel 1 and sends as many on channel 2 (0: none, it waits to be
// killed), and prints "ok" or the error.
int RunChild() {
  DieWithParent();
  std::string line;
  std::getline(std::cin, line);
  const std::string ids = absl::HexStringToBytes(line);
  pb::ClusterState state;
  for (uint64_t id : {1, 2}) {
    pb::DeviceChannel* c = state.add_device_channels();
    c->set_id(id);
    c->set_sender(id == 1 ? 1 : 2);
    c->set_receiver(id == 1 ? 2 : 1);
    c->set_nccl_unique_id(ids.substr((id - 1) * ids.size() / 2, ids.size() / 2));
  }
  auto node2 = NodeOn(0, absl::Seconds(10));
  node2->Apply(state, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (node2->OpenIds().size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (node2->OpenIds().size() < 2) {
    std::cout << "error: channels not open" << std::endl;
    return 1;
  }
  std::cout << "open" << std::endl;
  const int messages = std::atoi(getenv("K3_MESSAGES"));
  absl::Status status;
  if (messages > 0) {
    status = ReceiveAll(*node2->FromPeer(1), 1, 0, messages);
    if (status.ok()) status = SendAll(*node2->ToPeer(1), 2, 0, messages);
  }
  std::cout << (status.ok() ? "ok" : absl::StrCat("error ", status.ToString())) << std::endl;
  std::getline(std::cin, line);  // stay until the parent is done
  return status.ok() ? 0 : 1;
}

// Node 1 here on device 0, node 2 in a child process on device 0; both ends open.
struct TwoProcesses {
  std::unique_ptr<ChildProcess> child;
  std::unique_ptr<DeviceChannels> node1;
};

TwoProcesses StartTwoProcesses(int child_messages, absl::Duration op_timeout) {
  TwoProcesses pair;
  const pb::ClusterState state = PairState();
  pair.child = ChildProcess::Spawn({{kRoleEnv, "node2"},
                                    {"NCCL_HOSTID", "k3-device-channel-test-node2"},
                                    {"K3_MESSAGES", absl::StrCat(child_messages)}});
  EXPECT_NE(pair.child, nullptr);
  if (pair.child == nullptr) return pair;
  pair.child->WriteLine(IdsLine(state));
  pair.node1 = NodeOn(0, op_timeout);
  pair.node1->Apply(state, 1);
  EXPECT_EQ(pair.child->ReadLine(absl::Seconds(45)), "open");
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (pair.node1->OpenIds().size() < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(pair.node1->OpenIds().size(), 2u);
  return pair;
}

TEST(NcclDeviceChannelTest, TwoProcessesOnOneGpuSendBothWays) {
  if (gpus == 0) GTEST_SKIP() << "no GPU";
  constexpr int kMessages = 5;
  TwoProcesses pair = StartTwoProcesses(kMessages, absl::Seconds(20));
  ASSERT_NE(pair.node1, nullptr);
  ASSERT_EQ(pair.node1->OpenIds().size(), 2u);
  absl::Status sent = SendAll(*pair.node1->ToPeer(2), 1, 0, kMessages);
  EXPECT_TRUE(sent.ok()) << sent;
  absl::Status got = ReceiveAll(*pair.node1->FromPeer(2), 2, 0, kMessages);
  EXPECT_TRUE(got.ok()) << got;
  EXPECT_EQ(pair.child->ReadLine(), "ok");
  pair.child->WriteLine("done");
  pair.node1.reset();
  EXPECT_EQ(pair.child->Wait(), 0);
}

TEST(NcclDeviceChannelTest, AKilledPeerFailsTheRecvInsteadOfHanging) {
  if (gpus == 0) GTEST_SKIP() << "no GPU";
  const absl::Duration op_timeout = absl::Seconds(5);
  TwoProcesses pair = StartTwoProcesses(/*child_messages=*/0, op_timeout);
  ASSERT_NE(pair.node1, nullptr);
  ASSERT_EQ(pair.node1->OpenIds().size(), 2u);
  EXPECT_EQ(pair.child->ReadLine(), "ok");  // it exchanged nothing
  pair.child->Kill();
  std::shared_ptr<DeviceChannel> receiving = pair.node1->FromPeer(2);
  cudaSetDevice(0);
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 4096), cudaSuccess);
  const absl::Time start = absl::Now();
  const absl::Status status = receiving->Recv(buffer, 4096);
  EXPECT_TRUE(status.code() == absl::StatusCode::kDeadlineExceeded ||
              status.code() == absl::StatusCode::kUnavailable)
      << status;
  EXPECT_LT(absl::Now() - start, op_timeout + absl::Seconds(3));
  EXPECT_EQ(receiving->Recv(buffer, 4096).code(), absl::StatusCode::kFailedPrecondition);
  pair.node1->ReportBrokenChannel(receiving.get(), status);
  EXPECT_EQ(pair.node1->TakeBroken(), std::vector<uint64_t>{2});
  cudaFree(buffer);
}

TEST(NcclDeviceChannelTest, GpuUuidLooksLikeNvidiaSmis) {
  if (gpus == 0) {
    EXPECT_EQ(CudaGpuUuid(0).status().code(), absl::StatusCode::kUnavailable);
    GTEST_SKIP() << "no GPU";
  }
  absl::StatusOr<std::string> uuid = CudaGpuUuid(0);
  ASSERT_TRUE(uuid.ok()) << uuid.status();
  EXPECT_EQ(uuid->size(), 40u) << *uuid;
  EXPECT_EQ(uuid->rfind("GPU-", 0), 0u) << *uuid;
  EXPECT_EQ(CudaGpuUuid(gpus).status().code(), absl::StatusCode::kUnavailable);
  if (gpus >= 2) {
    EXPECT_NE(*uuid, CudaGpuUuid(1).value());
  }
}

TEST(NcclDeviceChannelTest, ABadUniqueIdIsRefused) {
  DeviceChannelSpec spec{7, 1, 2, "short"};
  EXPECT_EQ(OpenNcclDeviceChannel(spec, true, 0, Timeouts(absl::Seconds(5))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclDeviceChannelTest, TwoGpusSendBothWays) {
  REQUIRE_TWO_GPUS();
  auto node1 = NodeOn(0, absl::Seconds(20));
  auto node2 = NodeOn(1, absl::Seconds(20));
  const pb::ClusterState state = PairState();
  node1->Apply(state, 1);
  node2->Apply(state, 2);
  ASSERT_TRUE(WaitOpen(*node1, *node2));

  constexpr int kMessages = 6;
  absl::Status sent12, got12, sent21, got21;
  std::thread t1([&] {
    sent12 = SendAll(*node1->ToPeer(2), 1, 0, kMessages);
    got21 = ReceiveAll(*node1->FromPeer(2), 2, 0, kMessages);
  });
  std::thread t2([&] {
    got12 = ReceiveAll(*node2->FromPeer(1), 1, 1, kMessages);
    sent21 = SendAll(*node2->ToPeer(1), 2, 1, kMessages);
  });
  t1.join();
  t2.join();
  EXPECT_TRUE(sent12.ok()) << sent12;
  EXPECT_TRUE(got12.ok()) << got12;
  EXPECT_TRUE(sent21.ok()) << sent21;
  EXPECT_TRUE(got21.ok()) << got21;
  // The wrong direction on an end is refused, not sent.
  EXPECT_EQ(node1->ToPeer(2)->Recv(nullptr, 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NcclDeviceChannelTest, AbortMakesABlockedRecvFailWithinItsDeadline) {
  REQUIRE_TWO_GPUS();
  const absl::Duration op_timeout = absl::Seconds(20);
  auto node1 = NodeOn(0, op_timeout);
  auto node2 = NodeOn(1, op_timeout);
  const pb::ClusterState state = PairState();
  node1->Apply(state, 1);
  node2->Apply(state, 2);
  ASSERT_TRUE(WaitOpen(*node1, *node2));

  std::shared_ptr<DeviceChannel> receiving = node2->FromPeer(1);
  cudaSetDevice(1);
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 4096), cudaSuccess);
  absl::Status received;
  const absl::Time start = absl::Now();
  std::thread waiter([&] { received = receiving->Recv(buffer, 4096); });  // nothing is sent
  absl::SleepFor(absl::Milliseconds(300));
  node2->ReportBroken(1, absl::CancelledError("test"));  // aborts the channel
  waiter.join();
  EXPECT_EQ(received.code(), absl::StatusCode::kFailedPrecondition) << received;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(receiving->Recv(buffer, 4096).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(node2->TakeBroken(), std::vector<uint64_t>{1});
  EXPECT_EQ(node2->FromPeer(1), nullptr);
  cudaFree(buffer);
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
  if (getenv(k3::kRoleEnv) != nullptr) return k3::RunChild();
  setenv("NCCL_HOSTID", "k3-device-channel-test-node1", 1);
  absl::StatusOr<int> devices = k3::NcclTransport::DeviceCount();
  k3::gpus = devices.ok() ? *devices : 0;
  if (!devices.ok()) printf("skipped: no GPU (%s)\n", devices.status().ToString().c_str());
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
