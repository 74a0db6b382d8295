// k3serve: one binary for every role and tool; the first argument picks the subcommand, and
// `k3serve <command> --help` lists its flags.

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "attention_nodes/server/attention_server.h"
#include "cluster/command_line.h"
#include "cluster/process_tuning.h"
#include "coordinator/coordinator_main.h"
#include "expert_nodes/expert_node.h"
#include "http_front/http_front.h"
#include "launcher/local_cluster_main.h"
#include "router/router_node.h"
#include "tools/chat_command.h"
#include "tools/local_commands.h"
#include "tools/serve_command.h"

int main(int argc, char** argv) {
  k3::TuneServingProcess();
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  CLI::App top{"k3serve: the K3 inference service (every role and tool in one binary)",
               "k3serve"};
  top.require_subcommand(1);
  using namespace k3;
  std::vector<Subcommand> commands;
  for (Subcommand (*add)(CLI::App*) :
       {AddRandomCheckpointCommand, AddLogitsCommand, AddGenerateCommand, AddChatCommand,
        AddCoordinatorCommand, AddAttentionCommand, AddRouterNodeCommand, AddExpertNodeCommand,
        AddHttpFrontCommand, AddServeCommand, AddLocalCommand, AddPlanCommand, AddQbCommand}) {
    commands.push_back(add(&top));
  }

  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const Subcommand& c : commands) names.push_back(c.app->get_name());
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
  for (const Subcommand& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 2;  // require_subcommand(1) makes this unreachable
}
