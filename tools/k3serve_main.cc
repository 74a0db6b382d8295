// k3serve: one binary for every role and tool; the first argument picks the subcommand, and
// `k3serve <command> --help` lists its flags.

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "attention_nodes/attention_server.h"
#include "cluster/command_line.h"
#include "cluster/process_tuning.h"
#include "coordinator/coordinator_main.h"
#include "expert_nodes/expert_node.h"
#include "http_front/http_front.h"
#include "launcher/local_cluster_main.h"
#include "router/router_node.h"
#include "tools/chat_command.h"
#include "tools/local_commands.h"

namespace {

// A parsed subcommand runs through its `run`, which holds the options its flags filled.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

template <typename Options, typename Run>
void AddCommand(CLI::App* top, std::vector<Command>* commands, const std::string& name,
                const std::string& help, void (*add_flags)(CLI::App*, Options*), Run run) {
  auto options = std::make_shared<Options>();
  CLI::App* app = top->add_subcommand(name, help);
  add_flags(app, options.get());
  commands->push_back({app, [options, run] { return run(*options); }});
}

}  // namespace

int main(int argc, char** argv) {
  k3::TuneServingProcess();
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  CLI::App top{"k3serve: the K3 inference service (every role and tool in one binary)",
               "k3serve"};
  top.require_subcommand(1);
  std::vector<Command> commands;
  using namespace k3;
  AddCommand(&top, &commands, "random-checkpoint", "write a random-weight checkpoint",
             AddRandomCheckpointFlags, RandomCheckpointCommand);
  AddCommand(&top, &commands, "logits", "raw logits of a prompt, in process", AddLogitsFlags,
             LogitsCommand);
  AddCommand(&top, &commands, "generate", "generate tokens in process or through a server",
             AddGenerateFlags, GenerateCommand);
  AddCommand(&top, &commands, "chat", "an interactive chat in process or through a server",
             AddChatFlags, ChatCommand);
  AddCommand(&top, &commands, "coordinator", "the coordinator: membership, placement, balancing",
             AddCoordinatorFlags, RunCoordinator);
  AddCommand(&top, &commands, "attention", "an attention worker: the public Generate API",
             AddAttentionFlags, RunAttentionNode);
  AddCommand(&top, &commands, "router", "a router: gate, dispatch and combine of MoE layers",
             AddRouterNodeFlags, RunRouterNode);
  AddCommand(&top, &commands, "expert", "an expert worker: a slice of the routed experts",
             AddExpertNodeFlags, RunExpertNode);
  AddCommand(&top, &commands, "http", "the OpenAI-compatible HTTP front of the attention workers",
             AddHttpFrontFlags, RunHttpFront);
  AddCommand(&top, &commands, "local", "a local cluster of processes on this host",
             AddLocalFlags, [](const LocalCommandOptions& o) { return LocalClusterCommand(o); });
  AddCommand(&top, &commands, "plan",
             "bytes each process of a topology maps and each tier reads per token",
             AddPlanFlags, PlanCommand);
  AddCommand(&top, &commands, "qb", "offline QB (quantile balancing) statistics", AddQbFlags,
             QbCommand);

  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const Command& c : commands) names.push_back(c.app->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      const std::string nearest = NearestName(argv[1], names);
      std::cerr << "k3serve: unknown command '" << argv[1] << "'"
                << (nearest.empty() ? "" : "; did you mean '" + nearest + "'?") << "\n"
                << top.help();
      return 2;
    }
  }
  try {
    top.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ReportParseError(top, e);
  }
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 2;  // require_subcommand(1) makes this unreachable
}
