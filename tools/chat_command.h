// `k3serve chat --model DIR | --server HOST:PORT [--max-new-tokens N] [--temperature T]
//   [--seed S] [--thinking] [--system TEXT] [--tls-cert F --tls-key F --tls-ca F]
//   [--auth-token-file F]`: an interactive chat in the terminal (TLS and the bearer token: with
//   --server, as `generate --server` takes them).
//
// Reads one user message per line from stdin (EOF or "/exit" ends), keeps the conversation, and
// streams each answer to stdout as it is generated: in process with the model's tokenizer and
// the single-process engine (--model), or through an attention worker's text API (--server; the
// worker renders the messages and sends text deltas).
#ifndef K3SERVE_TOOLS_CHAT_COMMAND_H_
#define K3SERVE_TOOLS_CHAT_COMMAND_H_

#include <cstdint>
#include <string>

#include "cluster/command_line.h"

#include <CLI/CLI.hpp>

namespace k3 {

struct ChatCommandOptions {
  std::string model;
  std::string server;
  int max_new_tokens = 256;
  double temperature = 0;  // greedy
  uint64_t seed = 0;
  bool thinking = false;  // K3: answers open with a think block
  std::string system;     // an optional system message
  TlsFlags tls;                 // with --server
  std::string auth_token_file;  // with --server
};

void AddChatFlags(CLI::App* app, ChatCommandOptions* options);
int ChatCommand(const ChatCommandOptions& options);
// `k3serve chat`: AddChatFlags and ChatCommand as a subcommand of `top`.
Subcommand AddChatCommand(CLI::App* top);

}  // namespace k3

#endif  // K3SERVE_TOOLS_CHAT_COMMAND_H_
