// Dispatch+combine round trips over UcxTransport: one "router" process sends a block of token rows
// to each of E "expert" processes and waits for a same-size answer from each (the expert echoes
// it), the data movement of one MoE layer with expert parallelism. The router starts the experts
// as copies of this binary.
//
//   transport_bench --experts=3 --tokens=1,16,128 --hidden=512 --tls=sm,self
//
// Prints one line per shape: bytes per peer, rounds, p50/p99/mean round time, and the bytes moved
// per second (2 * E * bytes per peer / mean round time).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/child_process.h"
#include "cluster/process_tuning.h"
#include "cluster/ucx_transport.h"

ABSL_FLAG(int, experts, 3, "expert processes (E)");
ABSL_FLAG(std::string, tokens, "1,16,128", "token rows per expert, one shape each");
ABSL_FLAG(int, hidden, 512, "values per token row");
ABSL_FLAG(int, value_bytes, 4, "bytes per value (4: float32, 2: bf16)");
ABSL_FLAG(double, seconds, 1.0, "measuring time per shape");
ABSL_FLAG(int, warmup, 20, "unmeasured rounds per shape");
ABSL_FLAG(std::string, tls, "", "UCX_TLS for every process (empty: UCX's own setting)");
ABSL_FLAG(std::string, net_devices, "", "UCX_NET_DEVICES for every process");
ABSL_FLAG(int, busy_poll_us, 100,
          "UcxTransportOptions::busy_poll for every process (100: the nodes' --busy-poll-us)");
ABSL_FLAG(std::string, eager_limit, "1m",
          "UcxTransportOptions::eager_limit for every process (1m: the nodes' --ucx-eager-limit)");
ABSL_FLAG(std::string, role, "router", "internal: router, or expert (a started child)");

namespace k3 {
namespace {

constexpr PeerId kRouter = 0;

k3::UcxTransportOptions Options() {
  UcxTransportOptions options;
  options.tls = absl::GetFlag(FLAGS_tls);
  options.net_devices = absl::GetFlag(FLAGS_net_devices);
  options.busy_poll = absl::Microseconds(absl::GetFlag(FLAGS_busy_poll_us));
  options.eager_limit = absl::GetFlag(FLAGS_eager_limit);
  return options;
}

// Stdout: own address. Stdin: the router's address. Echoes until an empty message arrives.
int RunExpert() {
  DieWithParent();
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create(Options());
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

// Starts `experts` copies of this binary as experts (peers 1..experts) and connects `transport`
// to each; every child started lands in `children`, also when a later one fails.
absl::Status StartExperts(int experts, UcxTransport& transport,
                          std::vector<std::unique_ptr<ChildProcess>>* children) {
  const std::vector<std::string> args = {
      "--role=expert", "--tls=" + absl::GetFlag(FLAGS_tls),
      "--net_devices=" + absl::GetFlag(FLAGS_net_devices),
      absl::StrCat("--busy_poll_us=", absl::GetFlag(FLAGS_busy_poll_us)),
      "--eager_limit=" + absl::GetFlag(FLAGS_eager_limit)};
  const std::string router = absl::BytesToHexString(transport.LocalAddress());
  for (int e = 0; e < experts; ++e) {
    std::unique_ptr<ChildProcess> child = ChildProcess::Spawn({}, {}, args);
    if (child == nullptr) return absl::InternalError("cannot start an expert process");
    children->push_back(std::move(child));
    const std::string address = children->back()->ReadLine(absl::Seconds(20));
    if (address == "timeout") return absl::DeadlineExceededError("expert is silent");
    if (address == "eof") return absl::UnavailableError("expert exited");
    children->back()->WriteLine(router);
    absl::Status status = transport.Connect(e + 1, absl::HexStringToBytes(address));
    if (!status.ok()) return status;
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
    if (absl::Status status = transport.Send(e, payload); !status.ok()) return status;
  }
  for (int e = 0; e < experts; ++e) {
    absl::StatusOr<Received> answer = transport.Receive(absl::Now() + absl::Seconds(10));
    if (!answer.ok()) return answer.status();
    if (answer->kind == Received::Kind::kPeerFailed) return answer->error;
    if (answer->bytes.size() != payload.size()) {
      return absl::DataLossError("answer of the wrong size");
    }
  }
  return absl::OkStatus();
}

// Times round trips of `tokens` rows per expert (--warmup unmeasured rounds, then at least 10
// and at least --seconds) and prints the shape's line.
absl::Status MeasureShape(UcxTransport& transport, int experts, int64_t tokens) {
  const size_t bytes = tokens * absl::GetFlag(FLAGS_hidden) * absl::GetFlag(FLAGS_value_bytes);
  const std::string payload(bytes, '\x5a');
  std::vector<double> rounds_us;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const absl::Time stop_at = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  for (int round = 0;; ++round) {
    if (round >= warmup && absl::Now() > stop_at && rounds_us.size() >= 10) break;
    const absl::Time start = absl::Now();
    if (absl::Status status = RoundTrip(transport, experts, payload); !status.ok()) return status;
    if (round >= warmup) rounds_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
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

// --tokens as a list of positive row counts.
absl::StatusOr<std::vector<int64_t>> TokenShapes() {
  std::vector<int64_t> shapes;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int64_t tokens = 0;
    if (!absl::SimpleAtoi(text, &tokens) || tokens <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad --tokens entry '", text, "'"));
    }
    shapes.push_back(tokens);
  }
  return shapes;
}

absl::Status RunRouter() {
  const int experts = absl::GetFlag(FLAGS_experts);
  absl::StatusOr<std::vector<int64_t>> shapes = TokenShapes();
  if (!shapes.ok()) return shapes.status();
  if (experts < 1) return absl::InvalidArgumentError("--experts must be at least 1");

  absl::StatusOr<std::unique_ptr<UcxTransport>> created = UcxTransport::Create(Options());
  if (!created.ok()) return created.status();
  UcxTransport& transport = **created;
  std::vector<std::unique_ptr<ChildProcess>> children;
  absl::Status status = StartExperts(experts, transport, &children);

  printf("# experts=%d hidden=%d value_bytes=%d tls=%s net_devices=%s busy_poll_us=%d "
         "eager_limit=%s\n",
         experts, absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_value_bytes),
         absl::GetFlag(FLAGS_tls).c_str(), absl::GetFlag(FLAGS_net_devices).c_str(),
         absl::GetFlag(FLAGS_busy_poll_us), absl::GetFlag(FLAGS_eager_limit).c_str());
  for (int64_t tokens : *shapes) {
    if (!status.ok()) break;
    status = MeasureShape(transport, experts, tokens);
  }
  StopExperts(transport, children);
  transport.Close();
  return status;
}

}  // namespace
}  // namespace k3

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  k3::TuneServingProcess();
  if (absl::GetFlag(FLAGS_role) == "expert") return k3::RunExpert();
  absl::Status status = k3::RunRouter();
  if (!status.ok()) {
    fprintf(stderr, "transport_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
