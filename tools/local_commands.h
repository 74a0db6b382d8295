// The single-process k3serve subcommands: random-checkpoint, logits, local generate,
// the offline QB tool and the memory plan.
// Each takes the arguments after the subcommand name and returns the process exit status after
// printing errors to stderr.
#ifndef K3SERVE_TOOLS_LOCAL_COMMANDS_H_
#define K3SERVE_TOOLS_LOCAL_COMMANDS_H_

#include <string>
#include <vector>

namespace k3 {

int RandomCheckpointCommand(const std::vector<std::string>& args);
int LogitsCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);
int QbCommand(const std::vector<std::string>& args);
int PlanCommand(const std::vector<std::string>& args);

}  // namespace k3

#endif  // K3SERVE_TOOLS_LOCAL_COMMANDS_H_
