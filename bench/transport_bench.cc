// Dispatch+combine round trips over UcxTransport: one "router" process sends a block of token rows
// to each of E "expert" processes and waits for a same-size answer from each (the expert echoes
// it), the data movement of one MoE layer with expert parallelism. The router starts the experts
// as copies of this binary.
//
//   transport_bench --experts 3 --tokens 1,16,128 --hidden 512 --tls sm,self
//
// Prints one line per shape: bytes per peer, rounds, p50/p99/mean round time, and the bytes moved
// per second (2 * E * bytes per peer / mean round time).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cluster/child_process.h"
#include "cluster/command_line.h"
#include "cluster/process_tuning.h"
#include "cluster/ucx_transport.h"

namespace k3 {
namespace {

constexpr PeerId kRouter = 0;

struct Flags {
  int experts = 3;
  std::vector<int32_t> tokens = {1, 16, 128};
  int hidden = 512;
  int value_bytes = 4;
  double seconds = 1.0;
  int warmup = 20;
  std::string tls;
  std::string net_devices;
  int busy_poll_us = 100;
  std::string eager_limit = "1m";
  std::string role = "router";
};

// Parses the command line into `flags`; the exit status when the bench should not run.
std::optional<int> ParseBenchFlags(int argc, char** argv, Flags* flags) {
  constexpr int kMost = std::numeric_limits<int>::max();
  CLI::App app{"transport_bench: dispatch+combine round trips over UcxTransport"};
  AddBoundedInt(&app, "--experts", &flags->experts, 1, 1024, "expert processes (E)");
  AddIntList(&app, "--tokens", &flags->tokens, 1, kMost, "token rows per expert, one shape each")
      ->default_str("1,16,128");
  AddBoundedInt(&app, "--hidden", &flags->hidden, 1, kMost, "values per token row");
  AddBoundedInt(&app, "--value-bytes", &flags->value_bytes, 1, 8,
                "bytes per value (4: float32, 2: bf16)");
  app.add_option("--seconds", flags->seconds, "measuring time per shape")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  AddBoundedInt(&app, "--warmup", &flags->warmup, 0, kMost, "unmeasured rounds per shape");
  app.add_option("--tls", flags->tls, "UCX_TLS for every process (empty: UCX's own setting)");
  app.add_option("--net-devices", flags->net_devices, "UCX_NET_DEVICES for every process");
  AddBoundedInt(&app, "--busy-poll-us", &flags->busy_poll_us, 0, 1000 * 1000,
                "UcxTransportOptions::busy_poll for every process (100: the nodes' --busy-poll-us)");
  app.add_option("--eager-limit", flags->eager_limit,
                 "UcxTransportOptions::eager_limit for every process (1m: the nodes' "
                 "--ucx-eager-limit)")
      ->capture_default_str();
  app.add_option("--role", flags->role, "internal: router, or expert (a started child)")
      ->check(CLI::IsMember({"router", "expert"}))
      ->capture_default_str();
  return ParseToolArgs(&app, {argv + 1, argv + argc});
}

UcxTransportOptions TransportOptions(const Flags& flags) {
  UcxTransportOptions options;
  options.tls = flags.tls;
  options.net_devices = flags.net_devices;
  options.busy_poll = absl::Microseconds(flags.busy_poll_us);
  options.eager_limit = flags.eager_limit;
  return options;
}

// Stdout: own address. Stdin: the router's address. Echoes until an empty message arrives.
int RunExpert(const Flags& flags) {
  DieWithParent();
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport =
      UcxTransport::Create(TransportOptions(flags));
  if (!transport.ok()) {
    std::cerr << "expert: " << transport.status() << "\n";
    return 1;
  }
  std::cout << absl::BytesToHexString((*transport)->LocalAddress()) << std::endl;
  std::string router;
  std::getline(std::cin, router);
  absl::Status status = (*transport)->Connect(kRouter, absl::HexStringToBytes(router));
  while (status.ok()) {
    absl::StatusOr<Received> received = (*transport)->Receive(absl::InfiniteFuture());
    if (!received.ok()) {
      status = received.status();
    } else if (received->kind == Received::Kind::kPeerFailed) {
      status = received->error;
    } else if (received->bytes.empty()) {
      break;
    } else {
      // The answer is a new message of the same size, as an expert worker writes one (a lent
      // receive buffer is copied into it; an owned one is sent back as it is).
      status = (*transport)->Send(kRouter, std::move(received->bytes).TakeString());
    }
  }
  if (!status.ok()) std::cerr << "expert: " << status << "\n";
  (*transport)->Close();
  return status.ok() ? 0 : 1;
}

// Starts --experts copies of this binary as experts (peers 1..experts) and connects `transport`
// to each; every child started lands in `children`, also when a later one fails.
absl::Status StartExperts(const Flags& flags, UcxTransport& transport,
                          std::vector<std::unique_ptr<ChildProcess>>* children) {
  // Values as arguments of their own: CLI11 reads "--tls=" as a flag waiting for its value.
  const std::vector<std::string> args = {"--role",         "expert",
                                         "--tls",          flags.tls,
                                         "--net-devices",  flags.net_devices,
                                         "--busy-poll-us", absl::StrCat(flags.busy_poll_us),
                                         "--eager-limit",  flags.eager_limit};
  const std::string router = absl::BytesToHexString(transport.LocalAddress());
  for (int e = 0; e < flags.experts; ++e) {
    std::unique_ptr<ChildProcess> child = ChildProcess::Spawn({}, {}, args);
    if (child == nullptr) return absl::InternalError("cannot start an expert process");
    children->push_back(std::move(child));
    const std::string address = children->back()->ReadLine(absl::Seconds(20));
    if (address == "timeout") return absl::DeadlineExceededError("expert is silent");
    if (address == "eof") return absl::UnavailableError("expert exited");
    children->back()->WriteLine(router);
    K3_RETURN_IF_ERROR(transport.Connect(e + 1, absl::HexStringToBytes(address)));
  }
  return absl::OkStatus();
}

// Asks every expert to stop (an empty message), gives each 5 seconds to exit, then kills it.
void StopExperts(UcxTransport& transport, std::vector<std::unique_ptr<ChildProcess>>& children) {
  for (int e = 1; e <= static_cast<int>(children.size()); ++e) transport.Send(e, "").IgnoreError();
  for (std::unique_ptr<ChildProcess>& child : children) {
    if (child->Wait(absl::Seconds(5)) < 0) child->Kill();
  }
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

// One round: `payload` to each of the experts, then an answer of its size from each.
absl::Status RoundTrip(UcxTransport& transport, int experts, const std::string& payload) {
  for (int e = 1; e <= experts; ++e) {
    K3_RETURN_IF_ERROR(transport.Send(e, payload));
  }
  for (int e = 0; e < experts; ++e) {
    K3_ASSIGN_OR_RETURN(Received answer, transport.Receive(absl::Now() + absl::Seconds(10)));
    if (answer.kind == Received::Kind::kPeerFailed) return answer.error;
    if (answer.bytes.size() != payload.size()) {
      return absl::DataLossError("answer of the wrong size");
    }
  }
  return absl::OkStatus();
}

// Times round trips of `tokens` rows per expert (--warmup unmeasured rounds, then at least 10
// and at least --seconds) and prints the shape's line.
absl::Status MeasureShape(const Flags& flags, UcxTransport& transport, int64_t tokens) {
  const int experts = flags.experts;
  const size_t bytes = tokens * flags.hidden * flags.value_bytes;
  const std::string payload(bytes, '\x5a');
  std::vector<double> rounds_us;
  const absl::Time stop_at = absl::Now() + absl::Seconds(flags.seconds);
  for (int round = 0;; ++round) {
    if (round >= flags.warmup && absl::Now() > stop_at && rounds_us.size() >= 10) break;
    const absl::Time start = absl::Now();
    K3_RETURN_IF_ERROR(RoundTrip(transport, experts, payload));
    if (round >= flags.warmup) rounds_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  double mean = 0;
  for (double us : rounds_us) mean += us;
  mean /= rounds_us.size();
  printf(
      "tokens=%lld bytes_per_peer=%zu rounds=%zu p50_us=%.1f p99_us=%.1f mean_us=%.1f "
      "GBps=%.3f\n",
      static_cast<long long>(tokens), bytes, rounds_us.size(), Percentile(rounds_us, 0.5),
      Percentile(rounds_us, 0.99), mean, 2.0 * experts * bytes / (mean * 1e3));
  fflush(stdout);
  return absl::OkStatus();
}

absl::Status RunRouter(const Flags& flags) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> created,
                      UcxTransport::Create(TransportOptions(flags)));
  UcxTransport& transport = *created;
  std::vector<std::unique_ptr<ChildProcess>> children;
  absl::Status status = StartExperts(flags, transport, &children);

  printf("# experts=%d hidden=%d value_bytes=%d tls=%s net_devices=%s busy_poll_us=%d "
         "eager_limit=%s\n",
         flags.experts, flags.hidden, flags.value_bytes, flags.tls.c_str(),
         flags.net_devices.c_str(), flags.busy_poll_us, flags.eager_limit.c_str());
  for (int64_t tokens : flags.tokens) {
    if (!status.ok()) break;
    status = MeasureShape(flags, transport, tokens);
  }
  StopExperts(transport, children);
  transport.Close();
  return status;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  k3::Flags flags;
  if (std::optional<int> exit_status = k3::ParseBenchFlags(argc, argv, &flags)) return *exit_status;
  k3::TuneServingProcess();
  if (flags.role == "expert") return k3::RunExpert(flags);
  absl::Status status = k3::RunRouter(flags);
  if (!status.ok()) {
    fprintf(stderr, "transport_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
