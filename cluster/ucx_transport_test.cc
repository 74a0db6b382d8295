// UcxTransport between real processes: the test binary starts copies of itself (K3_UCX_TEST_ROLE
// selects the child's part), hands them addresses over pipes, and checks every byte they exchange
// against a pattern both sides compute from (sender, receiver, message number).
#include "cluster/ucx_transport.h"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <deque>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cluster/child_process.h"
#include "cluster/test_wait.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr char kRoleEnv[] = "K3_UCX_TEST_ROLE";

// Shared memory between processes of one host, and TCP on loopback; with UCX's own rendezvous
// threshold, or eager up to 1 MiB as the nodes run (kSizes then take both protocols).
struct Wire {
  const char* name;
  const char* tls;
  const char* net_devices;
  const char* eager_limit = "";
};
constexpr Wire kShm = {"shm", "sm,self", ""};
constexpr Wire kTcp = {"tcp", "tcp", "lo"};
constexpr Wire kShmEager = {"shm", "sm,self", "", "1m"};
constexpr Wire kTcpEager = {"tcp", "tcp", "lo", "1m"};

UcxTransportOptions OptionsFor(const std::string& tls, const std::string& net_devices,
                               const std::string& eager_limit = "") {
  UcxTransportOptions options;
  options.tls = tls;
  options.net_devices = net_devices;
  options.eager_limit = eager_limit;
  return options;
}

// Message `index` from `from` to `to`: `size` bytes of a pattern seeded by all three.
std::string Pattern(PeerId from, PeerId to, uint64_t index, size_t size) {
  std::string bytes(size, '\0');
  uint64_t state = (from * 1000003 + to) * 1000003 + index;
  for (size_t i = 0; i < size; i += 8) {
    state += 0x9e3779b97f4a7c15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    memcpy(&bytes[i], &z, std::min<size_t>(8, size - i));
  }
  return bytes;
}

const std::vector<size_t> kSizes = {8, 100, 4096, 8193, 65536, 262144, 1 << 20, 4 << 20};

// Every rank sends each size to every other rank, then checks what it received: the k-th message
// from each sender must be Pattern(sender, rank, k, kSizes[k]).
absl::Status RunExchange(Transport& transport, PeerId rank, int ranks) {
  for (uint64_t k = 0; k < kSizes.size(); ++k) {
    for (PeerId to = 0; to < static_cast<PeerId>(ranks); ++to) {
      if (to == rank) continue;
      absl::Status status = transport.Send(to, Pattern(rank, to, k, kSizes[k]));
      if (!status.ok()) return status;
    }
  }
  std::map<PeerId, uint64_t> next;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  for (size_t n = 0; n < kSizes.size() * (ranks - 1); ++n) {
    absl::StatusOr<Received> received = transport.Receive(deadline);
    if (!received.ok()) return received.status();
    if (received->kind != Received::Kind::kMessage) return received->error;
    uint64_t k = next[received->from]++;
    if (received->from == rank || received->from >= static_cast<PeerId>(ranks) ||
        k >= kSizes.size() || received->bytes != Pattern(received->from, rank, k, kSizes[k])) {
      return absl::DataLossError(absl::StrCat("rank ", rank, ": message ", k, " from ",
                                              received->from, " (", received->bytes.size(),
                                              " bytes) is wrong"));
    }
  }
  return absl::OkStatus();
}

// Lock-step rounds: in each, every rank sends one message to every other and waits for one from
// each (sizes vary by round and pair, up to ~300 KB).
absl::Status RunAllToAll(Transport& transport, PeerId rank, int ranks, int rounds) {
  auto size_of = [](int round, PeerId from, PeerId to) {
    return static_cast<size_t>((round * 7919 + from * 31337 + to * 104729) % 300000);
  };
  std::map<PeerId, std::deque<MessageBytes>> early;  // lent buffers held a while
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  for (int round = 0; round < rounds; ++round) {
    for (PeerId to = 0; to < static_cast<PeerId>(ranks); ++to) {
      if (to == rank) continue;
      absl::Status status = transport.Send(to, Pattern(rank, to, round, size_of(round, rank, to)));
      if (!status.ok()) return status;
    }
    for (PeerId from = 0; from < static_cast<PeerId>(ranks); ++from) {
      if (from == rank) continue;
      while (early[from].empty()) {
        absl::StatusOr<Received> received = transport.Receive(deadline);
        if (!received.ok()) return received.status();
        if (received->kind != Received::Kind::kMessage) return received->error;
        early[received->from].push_back(std::move(received->bytes));
      }
      if (early[from].front().view() != Pattern(from, rank, round, size_of(round, from, rank))) {
        return absl::DataLossError(
            absl::StrCat("rank ", rank, ": round ", round, " from ", from, " is wrong"));
      }
      early[from].pop_front();
    }
  }
  return absl::OkStatus();
}

// ---- Child side ----

std::string ReadStdinLine() {
  std::string line;
  std::getline(std::cin, line);
  return line;
}

void Say(const std::string& line) { std::cout << line << std::endl; }

// Stdin: N lines of hex addresses (rank order), then "close" (or EOF). Stdout: own address, then
// "ok" or the error, then "clean" / "failed" after closing.
int RunGroupChild(const std::string& role) {
  const PeerId rank = std::stoull(getenv("K3_RANK"));
  const int ranks = std::stoi(getenv("K3_RANKS"));
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create(
      OptionsFor(getenv("K3_TLS"), getenv("K3_NET_DEVICES"), getenv("K3_EAGER_LIMIT")));
  if (!transport.ok()) {
    Say(absl::StrCat("error ", transport.status().ToString()));
    return 1;
  }
  Say(absl::BytesToHexString((*transport)->LocalAddress()));
  for (int r = 0; r < ranks; ++r) {
    std::string address = absl::HexStringToBytes(ReadStdinLine());
    if (r == static_cast<int>(rank)) continue;
    absl::Status status = (*transport)->Connect(r, address);
    if (!status.ok()) {
      Say(absl::StrCat("error connect ", status.ToString()));
      return 1;
    }
  }
  absl::Status status = role == "exchange" ? RunExchange(**transport, rank, ranks)
                                           : RunAllToAll(**transport, rank, ranks, 30);
  Say(status.ok() ? "ok" : absl::StrCat("error ", status.ToString()));
  ReadStdinLine();
  (*transport)->Close();
  return status.ok() ? 0 : 1;
}

// Stdin: the parent's address, then "close" (or EOF). Echoes every message back to the parent,
// except "disconnect", on which it disconnects the parent. Stdout: own address, then at the end
// "clean" if it never saw a failure, else "failed <error>".
int RunEchoChild() {
  absl::StatusOr<std::unique_ptr<UcxTransport>> created =
      UcxTransport::Create(
          OptionsFor(getenv("K3_TLS"), getenv("K3_NET_DEVICES"), getenv("K3_EAGER_LIMIT")));
  if (!created.ok()) {
    Say(absl::StrCat("error ", created.status().ToString()));
    return 1;
  }
  UcxTransport& transport = **created;
  Say(absl::BytesToHexString(transport.LocalAddress()));
  absl::Status status = transport.Connect(0, absl::HexStringToBytes(ReadStdinLine()));
  if (!status.ok()) {
    Say(absl::StrCat("error connect ", status.ToString()));
    return 1;
  }
  std::thread closer([&transport] {
    ReadStdinLine();
    transport.Close();
  });
  std::string verdict = "clean";
  for (;;) {
    absl::StatusOr<Received> received = transport.Receive(absl::Now() + absl::Seconds(30));
    if (!received.ok()) break;
    if (received->kind == Received::Kind::kPeerFailed) {
      verdict = absl::StrCat("failed ", received->error.ToString());
      continue;
    }
    if (received->bytes == "disconnect") {
      transport.Disconnect(0);
      continue;
    }
    status = transport.Send(0, std::move(received->bytes).TakeString());
    if (!status.ok()) verdict = absl::StrCat("failed send ", status.ToString());
  }
  closer.join();
  Say(verdict);
  return 0;
}

int RunChild(const std::string& role) {
  DieWithParent();
  if (role == "echo") return RunEchoChild();
  return RunGroupChild(role);
}

// ---- Parent side ----

std::unique_ptr<UcxTransport> MakeTransport(const Wire& wire) {
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport =
      UcxTransport::Create(OptionsFor(wire.tls, wire.net_devices, wire.eager_limit));
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? std::move(*transport) : nullptr;
}

std::map<std::string, std::string> ChildEnv(const Wire& wire, const std::string& role) {
  return {{kRoleEnv, role},
          {"K3_TLS", wire.tls},
          {"K3_NET_DEVICES", wire.net_devices},
          {"K3_EAGER_LIMIT", wire.eager_limit}};
}

// Rank 0 is this process; ranks 1..n-1 are children running `role`.
void RunGroup(const Wire& wire, const std::string& role, int ranks) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(wire);
  ASSERT_NE(transport, nullptr);
  std::vector<std::unique_ptr<ChildProcess>> children;
  std::vector<std::string> addresses = {absl::BytesToHexString(transport->LocalAddress())};
  for (int rank = 1; rank < ranks; ++rank) {
    auto env = ChildEnv(wire, role);
    env["K3_RANK"] = absl::StrCat(rank);
    env["K3_RANKS"] = absl::StrCat(ranks);
    children.push_back(ChildProcess::Spawn(env));
    ASSERT_NE(children.back(), nullptr);
    addresses.push_back(children.back()->ReadLine());
    ASSERT_FALSE(absl::StartsWith(addresses.back(), "error")) << addresses.back();
  }
  for (auto& child : children) {
    for (const std::string& address : addresses) child->WriteLine(address);
  }
  for (int rank = 1; rank < ranks; ++rank) {
    ASSERT_TRUE(transport->Connect(rank, absl::HexStringToBytes(addresses[rank])).ok());
  }
  absl::Status status = role == "exchange" ? RunExchange(*transport, 0, ranks)
                                           : RunAllToAll(*transport, 0, ranks, 30);
  EXPECT_TRUE(status.ok()) << status;
  for (auto& child : children) EXPECT_EQ(child->ReadLine(), "ok");
  for (auto& child : children) child->WriteLine("close");
  for (auto& child : children) EXPECT_EQ(child->Wait(), 0);
  // The children closed gracefully: no failure may be reported.
  absl::StatusOr<Received> after = transport->Receive(absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kDeadlineExceeded)
      << (after.ok() ? after->error.ToString() : "");
}

TEST(UcxTransportTest, TwoProcessesExchangeEverySizeOverSharedMemory) {
  RunGroup(kShm, "exchange", 2);
}

TEST(UcxTransportTest, FourProcessesExchangeEverySizeOverSharedMemory) {
  RunGroup(kShm, "exchange", 4);
}

TEST(UcxTransportTest, TwoProcessesExchangeEverySizeOverTcp) { RunGroup(kTcp, "exchange", 2); }

TEST(UcxTransportTest, TwoProcessesExchangeEverySizeEagerUpTo1MiB) {
  RunGroup(kShmEager, "exchange", 2);
  RunGroup(kTcpEager, "exchange", 2);
}

TEST(UcxTransportTest, AnEagerLimitUcxDoesNotReadIsAnError) {
  if (getenv("UCX_RNDV_THRESH") != nullptr) GTEST_SKIP() << "UCX_RNDV_THRESH is set: it wins";
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport =
      UcxTransport::Create(OptionsFor("sm,self", "", "lots"));
  ASSERT_EQ(transport.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(transport.status().message().find("eager_limit='lots'"), std::string::npos)
      << transport.status();
}

TEST(UcxTransportTest, ThreeProcessesAllToAllRounds) { RunGroup(kShm, "alltoall", 3); }

TEST(UcxTransportTest, ThreeProcessesAllToAllRoundsOverTcp) { RunGroup(kTcp, "alltoall", 3); }

TEST(UcxTransportTest, ReceiveHonorsItsDeadline) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(kShm);
  ASSERT_NE(transport, nullptr);
  for (absl::Duration wait : {absl::ZeroDuration(), absl::Milliseconds(300)}) {
    const absl::Time start = absl::Now();
    absl::StatusOr<Received> received = transport->Receive(start + wait);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(received.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_GE(took, wait);
    EXPECT_LT(took, wait + absl::Milliseconds(500));
  }
}

TEST(UcxTransportTest, CloseWakesABlockedReceive) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(kShm);
  ASSERT_NE(transport, nullptr);
  absl::Status result;
  std::atomic<pid_t> receiver_tid{0};
  std::thread receiver([&] {
    receiver_tid = gettid();
    result = transport->Receive(absl::Now() + absl::Seconds(20)).status();
  });
  // Close only once the receiver has gone to sleep inside Receive.
  ASSERT_TRUE(WaitFor([&] { return receiver_tid != 0 && ThreadIsAsleep(receiver_tid); }));
  const absl::Time start = absl::Now();
  transport->Close();
  receiver.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(transport->Send(1, "x").code(), absl::StatusCode::kFailedPrecondition);
}

// An echo child connected both ways to `transport` (as peer `id`), checked with one round trip.
std::unique_ptr<ChildProcess> StartEcho(const Wire& wire, UcxTransport& transport, PeerId id,
                                        const std::vector<std::string>& wrapper = {}) {
  std::unique_ptr<ChildProcess> child = ChildProcess::Spawn(ChildEnv(wire, "echo"), wrapper);
  if (child == nullptr) {
    ADD_FAILURE() << "cannot start a child process";
    return nullptr;
  }
  std::string address = child->ReadLine();
  child->WriteLine(absl::BytesToHexString(transport.LocalAddress()));
  absl::Status status = transport.Connect(id, absl::HexStringToBytes(address));
  EXPECT_TRUE(status.ok()) << status << " child said " << address;
  EXPECT_TRUE(transport.Send(id, "ping").ok());
  absl::StatusOr<Received> echo = transport.Receive(absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(echo.ok() && echo->kind == Received::Kind::kMessage && echo->bytes == "ping" &&
              echo->from == id);
  return child;
}

void KillIsDetected(const Wire& wire) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(wire);
  ASSERT_NE(transport, nullptr);
  std::unique_ptr<ChildProcess> victim = StartEcho(wire, *transport, 7);
  ASSERT_NE(victim, nullptr);
  // Large messages in flight in both directions when it dies.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(transport->Send(7, Pattern(0, 7, i, 1 << 20)).ok());
  // The first echo back shows traffic flowing both ways; the rest are still on their way.
  absl::StatusOr<Received> first = transport->Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->kind, Received::Kind::kMessage) << first->error;
  EXPECT_EQ(first->bytes.size(), 1u << 20);
  kill(victim->pid(), SIGKILL);
  const absl::Time killed = absl::Now();
  for (;;) {
    absl::StatusOr<Received> received = transport->Receive(killed + absl::Seconds(2));
    ASSERT_TRUE(received.ok()) << "no failure reported within 2 s: " << received.status();
    if (received->kind == Received::Kind::kMessage) {
      // Echoes that arrived before the death are delivered first, and intact.
      EXPECT_EQ(received->bytes.size(), 1u << 20);
      continue;
    }
    EXPECT_EQ(received->from, 7u);
    EXPECT_EQ(received->error.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(received->error.message().find("peer 7"), std::string::npos) << received->error;
    break;
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(2));
  EXPECT_EQ(transport->Send(7, "anyone?").code(), absl::StatusCode::kUnavailable);
  victim->Kill();
  // The survivor keeps working with other processes.
  std::unique_ptr<ChildProcess> other = StartEcho(wire, *transport, 8);
  ASSERT_NE(other, nullptr);
  other->WriteLine("close");
  EXPECT_EQ(other->ReadLine(), "clean");
}

// Eager messages are handed out in UCX's receive buffer (ucx_transport.h, "Receiving in place"),
// 8-byte aligned; they stay readable after the transport is gone, until the last is dropped.
// `min_lent`: how many of the five UCX lends on this wire (on shared memory all but the 1-byte one,
// which goes by UCX's short protocol; over TCP only messages of several fragments, which UCX
// assembles in a buffer of its own).
void ReceivedBuffersAreLentAndOutliveTheTransport(const Wire& wire, int min_lent) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(wire);
  ASSERT_NE(transport, nullptr);
  std::unique_ptr<ChildProcess> echo = StartEcho(wire, *transport, 5);
  ASSERT_NE(echo, nullptr);
  const std::vector<size_t> sizes = {1, 100, 4096, 65536 + 3, 300000};
  std::vector<MessageBytes> kept;
  int lent = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_TRUE(transport->Send(5, Pattern(0, 5, static_cast<int>(k), sizes[k])).ok());
    absl::StatusOr<Received> received = transport->Receive(absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(received.ok()) << received.status();
    ASSERT_EQ(received->kind, Received::Kind::kMessage) << received->error;
    ASSERT_TRUE(received->bytes.view() == Pattern(0, 5, static_cast<int>(k), sizes[k]))
        << "message " << k;
    if (received->bytes.lent()) {
      ++lent;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(received->bytes.data()) % 8, 0u) << "message " << k;
    }
    kept.push_back(std::move(received->bytes));
  }
  // Every size here goes eagerly (1 MiB eager limit, as the nodes run).
  EXPECT_GE(lent, min_lent) << "UCX lent too few of the eager messages";
  // One more on its way when the transport closes: it stays in the Inbox and is freed with it.
  ASSERT_TRUE(transport->Send(5, Pattern(0, 5, 99, 2048)).ok());
  ASSERT_TRUE(WaitFor([&] { return transport->QueuedForReceive() == 1; }));
  transport.reset();
  for (size_t k = 0; k < kept.size(); ++k) {
    EXPECT_TRUE(kept[k].view() == Pattern(0, 5, static_cast<int>(k), sizes[k])) << "message " << k;
  }
  kept.clear();  // the last borrower destroys UCX's worker (ASan: no leak, no use after free)
}

TEST(UcxTransportTest, ReceivedBuffersAreLentAndOutliveTheTransportOverSharedMemory) {
  ReceivedBuffersAreLentAndOutliveTheTransport(kShmEager, /*min_lent=*/4);
}

TEST(UcxTransportTest, ReceivedBuffersAreLentAndOutliveTheTransportOverTcp) {
  ReceivedBuffersAreLentAndOutliveTheTransport(kTcpEager, /*min_lent=*/2);
}

TEST(UcxTransportTest, KilledPeerIsReportedWithinTwoSecondsOverSharedMemory) {
  KillIsDetected(kShm);
}

TEST(UcxTransportTest, KilledPeerIsReportedWithinTwoSecondsOverTcp) { KillIsDetected(kTcp); }

void GracefulCloseIsSilent(const Wire& wire) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(wire);
  ASSERT_NE(transport, nullptr);
  // The child closes its transport and exits.
  std::unique_ptr<ChildProcess> leaving = StartEcho(wire, *transport, 1);
  ASSERT_NE(leaving, nullptr);
  leaving->WriteLine("close");
  EXPECT_EQ(leaving->ReadLine(), "clean");
  EXPECT_EQ(leaving->Wait(), 0);
  // We disconnect the other child (asked by message, so we know it has processed everything);
  // neither side may see a failure.
  std::unique_ptr<ChildProcess> staying = StartEcho(wire, *transport, 2);
  ASSERT_NE(staying, nullptr);
  transport->Disconnect(2);
  EXPECT_EQ(transport->Send(2, "x").code(), absl::StatusCode::kFailedPrecondition);
  std::unique_ptr<ChildProcess> asking = StartEcho(wire, *transport, 3);
  ASSERT_NE(asking, nullptr);
  ASSERT_TRUE(transport->Send(3, "disconnect").ok());
  absl::StatusOr<Received> received = transport->Receive(absl::Now() + absl::Milliseconds(500));
  EXPECT_EQ(received.status().code(), absl::StatusCode::kDeadlineExceeded)
      << (received.ok() ? received->error.ToString() : "");
  EXPECT_EQ(transport->Send(1, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(transport->Send(3, "x").code(), absl::StatusCode::kFailedPrecondition);
  for (ChildProcess* child : {staying.get(), asking.get()}) {
    child->WriteLine("close");
    EXPECT_EQ(child->ReadLine(), "clean");
    EXPECT_EQ(child->Wait(), 0);
  }
  transport->Close();
  EXPECT_EQ(transport->Receive(absl::Now() + absl::Seconds(5)).status().code(),
            absl::StatusCode::kCancelled);
}

TEST(UcxTransportTest, GracefulCloseIsNotAFailureOverSharedMemory) { GracefulCloseIsSilent(kShm); }

TEST(UcxTransportTest, GracefulCloseIsNotAFailureOverTcp) { GracefulCloseIsSilent(kTcp); }

// A network namespace joined to this one by a veth pair: a second host, as far as the transport
// can tell (another kernel network stack, no loopback or shared-memory path in common). Needs root.
class VethHost {
 public:
  VethHost() {
    const int id = getpid() % 100000;
    name_ = absl::StrCat("k3ns", id);
    local_dev_ = absl::StrCat("k3a", id);
    remote_dev_ = absl::StrCat("k3b", id);
    const std::string subnet = absl::StrCat("10.213.", id % 250, ".");
    local_ip_ = subnet + "1";
    remote_ip_ = subnet + "2";
    ok_ = Run("ip netns add " + name_) &&
          Run(absl::StrCat("ip link add ", local_dev_, " type veth peer name ", remote_dev_)) &&
          Run(absl::StrCat("ip link set ", remote_dev_, " netns ", name_)) &&
          Run(absl::StrCat("ip addr add ", local_ip_, "/24 dev ", local_dev_)) &&
          Run(absl::StrCat("ip link set ", local_dev_, " up")) &&
          Run(absl::StrCat("ip netns exec ", name_, " ip addr add ", remote_ip_, "/24 dev ",
                           remote_dev_)) &&
          Run(absl::StrCat("ip netns exec ", name_, " ip link set ", remote_dev_, " up")) &&
          Run(absl::StrCat("ip netns exec ", name_, " ip link set lo up"));
  }
  ~VethHost() {
    Run("ip netns del " + name_ + " 2>/dev/null");  // takes the veth pair with it
    Run("ip link del " + local_dev_ + " 2>/dev/null");
  }

  bool ok() const { return ok_; }
  const std::string& local_dev() const { return local_dev_; }
  const std::string& remote_dev() const { return remote_dev_; }
  std::vector<std::string> wrapper() const { return {"ip", "netns", "exec", name_}; }

 private:
  static bool Run(const std::string& command) {
    return system((command + " >/dev/null 2>&1").c_str()) == 0;
  }

  bool ok_ = false;
  std::string name_, local_dev_, remote_dev_, local_ip_, remote_ip_;
};

TEST(UcxTransportTest, PeerOnAnotherHostExchangesAndItsDeathIsReported) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace";
  VethHost host;
  if (!host.ok()) GTEST_SKIP() << "cannot create a network namespace here";
  const Wire local = {"veth", "tcp", host.local_dev().c_str()};
  const Wire remote = {"veth", "tcp", host.remote_dev().c_str()};
  std::unique_ptr<UcxTransport> transport = MakeTransport(local);
  ASSERT_NE(transport, nullptr);
  // The child's address lists its namespace's IPs only; ours lists every interface, of which only
  // the veth is reachable from there.
  std::unique_ptr<ChildProcess> child = StartEcho(remote, *transport, 4, host.wrapper());
  ASSERT_NE(child, nullptr);
  for (uint64_t k = 0; k < kSizes.size(); ++k) {
    ASSERT_TRUE(transport->Send(4, Pattern(0, 4, k, kSizes[k])).ok());
  }
  for (uint64_t k = 0; k < kSizes.size(); ++k) {
    absl::StatusOr<Received> echo = transport->Receive(absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(echo.ok()) << echo.status();
    ASSERT_EQ(echo->kind, Received::Kind::kMessage) << echo->error;
    EXPECT_TRUE(echo->bytes == Pattern(0, 4, k, kSizes[k])) << "message " << k;
  }
  kill(child->pid(), SIGKILL);
  const absl::Time killed = absl::Now();
  absl::StatusOr<Received> failure = transport->Receive(killed + absl::Seconds(2));
  ASSERT_TRUE(failure.ok()) << "no failure reported within 2 s: " << failure.status();
  EXPECT_EQ(failure->kind, Received::Kind::kPeerFailed);
  EXPECT_EQ(failure->from, 4u);
}

TEST(UcxTransportTest, BogusAddressesFailCleanly) {
  std::unique_ptr<UcxTransport> transport = MakeTransport(kShm);
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(transport->Connect(1, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transport->Connect(1, "hello world").code(), absl::StatusCode::kInvalidArgument);
  const std::string own = transport->LocalAddress();
  EXPECT_EQ(transport->Connect(1, own).code(), absl::StatusCode::kInvalidArgument);
  for (size_t cut : {size_t{5}, own.size() / 2, own.size() - 1}) {
    EXPECT_EQ(transport->Connect(1, own.substr(0, cut)).code(), absl::StatusCode::kInvalidArgument);
  }
  // A well-formed address of a process that is gone.
  std::string gone_address;
  {
    std::unique_ptr<UcxTransport> gone = MakeTransport(kShm);
    ASSERT_NE(gone, nullptr);
    gone_address = gone->LocalAddress();
  }
  const absl::Time start = absl::Now();
  absl::Status status = transport->Connect(1, gone_address);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(transport->Send(1, "x").code(), absl::StatusCode::kNotFound);
}

TEST(UcxTransportTest, ConnectRejectsConflictingBindings) {
  std::unique_ptr<UcxTransport> a = MakeTransport(kShm);
  std::unique_ptr<UcxTransport> b = MakeTransport(kShm);
  std::unique_ptr<UcxTransport> c = MakeTransport(kShm);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(a->Connect(1, b->LocalAddress()).ok());
  EXPECT_TRUE(a->Connect(1, b->LocalAddress()).ok());
  EXPECT_EQ(a->Connect(1, c->LocalAddress()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a->Connect(2, b->LocalAddress()).code(), absl::StatusCode::kAlreadyExists);
}

TEST(UcxTransportTest, MessagesWaitUntilTheReceiverConnectsTheSender) {
  // Two transports in one process are as separate as two processes for UCX.
  std::unique_ptr<UcxTransport> a = MakeTransport(kShm);
  std::unique_ptr<UcxTransport> b = MakeTransport(kShm);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Connect(1, b->LocalAddress()).ok());
  ASSERT_TRUE(a->Send(1, "early").ok());
  ASSERT_TRUE(a->Send(1, Pattern(0, 1, 0, 1 << 20)).ok());
  EXPECT_EQ(b->Receive(absl::Now() + absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(b->Connect(5, a->LocalAddress()).ok());
  absl::StatusOr<Received> first = b->Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->from, 5u);
  EXPECT_EQ(first->bytes, "early");
  absl::StatusOr<Received> second = b->Receive(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->bytes == Pattern(0, 1, 0, 1 << 20));
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  if (const char* role = getenv(k3::kRoleEnv)) return k3::RunChild(role);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
