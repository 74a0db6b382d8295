// Command-line parsing for every k3serve subcommand, on CLI11 (Debian's libcli11-dev).
//
// A subcommand declares its flags on a CLI::App with AddXxxFlags(app, &options); the same
// declaration serves the binary (tools/k3serve_main.cc parses all subcommands at once, with --help
// on each) and tests and callers that parse one subcommand's arguments (ParseFlags). CLI11 reports
// errors by throwing; nothing here lets an exception out: errors become INVALID_ARGUMENT naming the
// flag, with the nearest known flag suggested for a typo.
//
// Thread-compatible: an App and the options it fills belong to one thread.
#ifndef K3SERVE_CLUSTER_COMMAND_LINE_H_
#define K3SERVE_CLUSTER_COMMAND_LINE_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/compute_device.h"
#include "base/status_macros.h"

namespace k3 {

// TLS for gRPC, the same on every role and every gRPC client of the cluster (cluster/tls.h turns
// them into credentials): --tls-cert and --tls-key (PEM) are this process's certificate chain and
// key, served by its gRPC server and shown by its clients; --tls-ca (PEM) the certificates that
// sign the peers': a client verifies servers with it, a server with it requires and verifies
// client certificates (mutual TLS). --tls-server-name: the name a client expects in the servers'
// certificates instead of the host of the address it dials (one certificate for every pod).
// All empty: plaintext, as without TLS.
struct TlsFlags {
  std::string cert;
  std::string key;
  std::string ca;
  std::string server_name;

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Declares --tls-cert, --tls-key, --tls-ca and --tls-server-name.
void AddTlsFlags(CLI::App* app, TlsFlags* tls);

// A client's flags for the server it calls: the TLS flags and --auth-token-file (the file holding
// the bearer token the server requires), which needs `server` (its --server option).
void AddClientSecurityFlags(CLI::App* app, CLI::Option* server, TlsFlags* tls,
                            std::string* auth_token_file);

// The flags every node role takes: --coordinator HOST:PORT and --model DIR (required), --host
// (listen address, advertised unless a wildcard), --port (gRPC; 0 picks a free one),
// --metrics-port (HTTP /metrics; -1: none, 0 picks one) and the TLS flags.
struct NodeFlags {
  std::string coordinator;
  std::string model;
  std::string host = "0.0.0.0";
  int port = 0;
  int metrics_port = -1;
  TlsFlags tls;
  // --busy-poll-us: how long a data-plane thread polls the transport before it sleeps
  // (UcxTransportOptions::busy_poll). Only the data-plane roles (AddNodeFlags) have it.
  int busy_poll_us = 100;
  std::string ucx_eager_limit = "1m";  // UcxTransportOptions::eager_limit
  // --trace-file: where the spans of traced requests go (cluster/span_log.h); empty: none.
  std::string trace_file;
};

void AddNodeFlags(CLI::App* app, NodeFlags* flags);
// Only --host, --port, --metrics-port and the TLS flags (a role that registers with no
// coordinator).
void AddListenFlags(CLI::App* app, NodeFlags* flags);

// --name N, an integer in [min, max]; the default shown in --help is *value's.
CLI::Option* AddBoundedInt(CLI::App* app, const std::string& name, int64_t* value, int64_t min,
                           int64_t max, const std::string& help);
CLI::Option* AddBoundedInt(CLI::App* app, const std::string& name, int* value, int64_t min,
                           int64_t max, const std::string& help);

// --name MS, a whole number of milliseconds in [min_ms, max_ms] stored as a duration.
CLI::Option* AddMilliseconds(CLI::App* app, const std::string& name, absl::Duration* value,
                             int64_t min_ms, int64_t max_ms, const std::string& help);

// --name 1,2,3: comma-separated 32-bit integers, each in [min, max]; an empty element ("1,,2"),
// a sign on its own or a value out of range is an error.
CLI::Option* AddIntList(CLI::App* app, const std::string& name, std::vector<int32_t>* values,
                        int64_t min, int64_t max, const std::string& help);

// --device cpu|cuda|cuda:N (base/compute_device.h) into *device; the default shown is *device's.
CLI::Option* AddDeviceFlag(CLI::App* app, ComputeDevice* device, const std::string& help);

// Strict parse of "1,2,3" as AddIntList does; INVALID_ARGUMENT naming `what`.
absl::StatusOr<std::vector<int32_t>> ParseIntList(const std::string& text, const std::string& what,
                                                  int64_t min = INT32_MIN, int64_t max = INT32_MAX);

// Parses `args` (without the program and subcommand names) into `app`. INVALID_ARGUMENT with the
// parser's message (and a suggestion for an unknown flag); --help gives FAILED_PRECONDITION with
// the help text as its message.
absl::Status ParseArgs(CLI::App* app, const std::vector<std::string>& args);

// ParseArgs into a fresh App that `add` declares flags on; returns the options it filled.
template <typename Options>
absl::StatusOr<Options> ParseFlags(const std::function<void(CLI::App*, Options*)>& add,
                                   const std::vector<std::string>& args) {
  CLI::App app;
  Options options;
  add(&app, &options);
  K3_RETURN_IF_ERROR(ParseArgs(&app, args));
  return options;
}

// One subcommand of the k3serve binary, once added to the top-level app: its CLI11 app and what
// runs it with the options its flags filled.
struct Subcommand {
  CLI::App* app;
  std::function<int()> run;
};

// Adds subcommand `name` (`help`) to `top`, its flags added by `add_flags` to options it owns;
// `run(options)` runs it.
template <typename Options, typename Run>
Subcommand AddSubcommand(CLI::App* top, const std::string& name, const std::string& help,
                         void (*add_flags)(CLI::App*, Options*), Run run) {
  auto options = std::make_shared<Options>();
  CLI::App* app = top->add_subcommand(name, help);
  add_flags(app, options.get());
  return {app, [options, run] { return run(*options); }};
}

// For a standalone tool's main (the benchmarks): ParseArgs of `args` (argv without the program
// name). When the tool should not run, prints the help (stdout) or the error (stderr) and returns
// the exit status: 0 for --help, 2 for a bad flag. nullopt: parsed, run.
std::optional<int> ParseToolArgs(CLI::App* app, const std::vector<std::string>& args);

// For the binary: prints the outcome of a failed parse of `app` (help to stdout, errors to stderr
// with a suggestion for an unknown flag or subcommand) and returns the exit status (0 for --help,
// 2 otherwise).
int ReportParseError(const CLI::App& app, const CLI::ParseError& error);

// Prints "k3serve <command>: <message>" to stderr; returns the exit status: 2 for
// INVALID_ARGUMENT (the caller's mistake), 1 otherwise.
int ReportError(const std::string& command, const absl::Status& status);

// The known name nearest `typo` in edit distance, if it is close enough to be a likely typo
// ("" otherwise).
std::string NearestName(const std::string& typo, const std::vector<std::string>& names);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_COMMAND_LINE_H_
