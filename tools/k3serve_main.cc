// k3serve: one binary for every role and tool; the first argument picks the subcommand.
#include <malloc.h>

#include <iostream>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "attention_nodes/attention_server.h"
#include "cluster/coordinator_main.h"
#include "cluster/local_cluster_main.h"
#include "expert_nodes/expert_node.h"
#include "router/router_node.h"
#include "tools/local_commands.h"

namespace {

constexpr char kUsage[] = R"(usage: k3serve <command> [flags]

commands:
  random-checkpoint --config k3-tiny|k3-tiny-8|kimi-linear-tiny|k3-perf|FILE.json --seed N --out DIR [--shards N]
            [--mxfp4]  (routed experts in the release's MXFP4 layout)
            [--headers-only]  (no tensor data: a checkpoint for `plan`)
  logits    --model DIR --tokens 1,2,3 --out FILE [--decode]
  generate  (--model DIR | --server HOST:PORT) --tokens 1,2,3 --max-new-tokens N
            [--temperature T --top-p P --top-k K --seed S --stop-token-ids a,b]
            [--request-id ID --timeout-ms T]  (with --server)
  attention --coordinator HOST:PORT --model DIR [--port P --host H --metrics-port P]
            [--max-batch-tokens N --max-sequences N --max-new-tokens-limit N]
            [--max-prompt-tokens N --moe-timeout-ms T --drain-timeout-ms T]
  coordinator [--port P --host H --metrics-port P] --model M [--expected-experts E]
            [--required-roles attention,router,expert] [--load-stats-interval-ms T]
            [--rebalance-interval-ms T --spare-slots-per-worker S]
            [--online-bias-interval-ms T (changes outputs)] (see cluster/coordinator_main.h)
  router    --coordinator HOST:PORT --model DIR [--port P --host H --metrics-port P]
            [--step-timeout-ms T --qb-bins B]
  expert    --coordinator HOST:PORT --model DIR --slots N [--port P --host H --metrics-port P]
  local     --model DIR [--attention A --routers R --experts E --expert-slots 3,5,8]
            [--base-port P --host H --metrics --log-dir DIR] [--prompt 1,2,3 --max-new-tokens N]
  plan      --model DIR [--attention A --routers R --experts E]  (bytes per process and per
            token, from config.json and safetensors headers only)
  qb        --scores FILE --tokens T --experts N --top-k K [--bias FILE] [--bins B | --exact]
)";

}  // namespace

int main(int argc, char** argv) {
  // Data-plane buffers of 128 KiB and more would otherwise be fresh mappings on every step, and
  // their page faults dominate an all-to-all round (measured in bench/transport_bench).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "random-checkpoint") return k3::RandomCheckpointCommand(args);
  if (command == "logits") return k3::LogitsCommand(args);
  if (command == "generate") return k3::GenerateCommand(args);
  if (command == "attention") return k3::RunAttentionNode(args);
  if (command == "router") return k3::RunRouterNode(args);
  if (command == "expert") return k3::RunExpertNode(args);
  if (command == "coordinator") {
    absl::StatusOr<k3::CoordinatorMainOptions> options = k3::ParseCoordinatorArgs(args);
    if (!options.ok()) {
      std::cerr << "k3serve coordinator: " << options.status().message() << "\n";
      return 2;
    }
    return k3::RunCoordinator(*options);
  }
  if (command == "local") return k3::LocalClusterCommand(args);
  if (command == "qb") return k3::QbCommand(args);
  if (command == "plan") return k3::PlanCommand(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "k3serve: unknown command '" << command << "'\n" << kUsage;
  return 2;
}
