// The single-process k3serve subcommands: random-checkpoint, logits, generate (in process or
// through a server), the memory plan and the offline QB tool. Each declares its flags on a CLI::App (AddXxxFlags)
// and runs from the parsed options, returning the process exit status after printing errors to
// stderr.
#ifndef K3SERVE_TOOLS_LOCAL_COMMANDS_H_
#define K3SERVE_TOOLS_LOCAL_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/command_line.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "expert_nodes/device_experts.h"
#include "router/qb_tool.h"
#include "tools/memory_plan.h"

namespace k3 {

struct RandomCheckpointCommandOptions {
  std::string config;  // a named test config or a config.json
  int64_t seed = 0;
  std::string out;
  int shards = 1;
  bool mxfp4 = false;         // routed experts in the release's MXFP4 layout
  bool headers_only = false;  // no tensor data: a checkpoint for `plan`
};
void AddRandomCheckpointFlags(CLI::App* app, RandomCheckpointCommandOptions* options);
int RandomCheckpointCommand(const RandomCheckpointCommandOptions& options);
// `k3serve random-checkpoint`: these flags and RandomCheckpointCommand as a subcommand of `top`.
Subcommand AddRandomCheckpointCommand(CLI::App* top);

struct LogitsOptions {
  std::string model;
  ComputeDevice device;  // --device: cpu, cuda or cuda:N (engine/process_engine.h)
  std::vector<int32_t> tokens;
  std::string out;
  bool decode = false;
};
void AddLogitsFlags(CLI::App* app, LogitsOptions* options);
int LogitsCommand(const LogitsOptions& options);
// `k3serve logits`: AddLogitsFlags and LogitsCommand as a subcommand of `top`.
Subcommand AddLogitsCommand(CLI::App* top);

struct GenerateCommandOptions {
  std::string model;   // in process
  ComputeDevice device;  // in process: cpu, cuda or cuda:N (engine/process_engine.h)
  std::string server;  // or through a server (HOST:PORT)
  std::vector<int32_t> tokens;
  // Or the prompt as text (the model's tokenizer encodes it; the answer prints as text), as one
  // user message of a chat with `chat`.
  std::string prompt;
  bool chat = false;
  // The request (its prompt from --tokens or --prompt): sampling, max_new_tokens, stop tokens,
  // ignore_eos.
  GenerationRequest generate;
  std::string request_id;  // with --server
  int64_t timeout_ms = 0;  // with --server; 0: none
  TlsFlags tls;                 // with --server: the server's TLS (README "Security")
  std::string auth_token_file;  // with --server: the bearer token to send
  // With --server, the sampling flags the user gave: the others stay unset (server defaults).
  bool has_max_new_tokens = false, has_temperature = false, has_top_p = false, has_top_k = false,
       has_seed = false;
};
void AddGenerateFlags(CLI::App* app, GenerateCommandOptions* options);
int GenerateCommand(const GenerateCommandOptions& options);
// `k3serve generate`: AddGenerateFlags and GenerateCommand as a subcommand of `top`.
Subcommand AddGenerateCommand(CLI::App* top);

// `plan`: what each process of a topology maps and each tier reads per token.
struct PlanCommandOptions {
  std::string model;
  MemoryPlanTopology topology;
};
void AddPlanFlags(CLI::App* app, PlanCommandOptions* options);
int PlanCommand(const PlanCommandOptions& options);
// `k3serve plan`: AddPlanFlags and PlanCommand as a subcommand of `top`.
Subcommand AddPlanCommand(CLI::App* top);

void AddQbFlags(CLI::App* app, QbToolOptions* options);
int QbCommand(const QbToolOptions& options);
// `k3serve qb`: AddQbFlags and QbCommand as a subcommand of `top`.
Subcommand AddQbCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_TOOLS_LOCAL_COMMANDS_H_
