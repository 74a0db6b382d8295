#include "cluster/command_line.h"

#include <algorithm>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace k3 {
namespace {

template <typename Int>
CLI::Option* AddBounded(CLI::App* app, const std::string& name, Int* value, int64_t min,
                        int64_t max, const std::string& help) {
  // Parsed as int64 first, so that a value beyond Int's range is reported as out of range
  // instead of wrapping.
  CLI::Option* option = app->add_option_function<int64_t>(
      name, [value](int64_t v) { *value = static_cast<Int>(v); }, help);
  option->check(CLI::Range(min, max));
  option->default_str(std::to_string(*value));
  option->type_name("INT");
  return option;
}

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The deepest subcommand the parse reached: where unknown flags were left over.
const CLI::App* ParsedLeaf(const CLI::App& app) {
  const CLI::App* leaf = &app;
  for (bool descended = true; descended;) {
    descended = false;
    for (const CLI::App* sub : leaf->get_subcommands()) {
      leaf = sub;
      descended = true;
      break;
    }
  }
  return leaf;
}

// " (did you mean --port?)" for the first leftover argument that looks like a misspelt flag.
std::string Suggestion(const CLI::App& app) {
  const CLI::App* leaf = ParsedLeaf(app);
  std::vector<std::string> names;
  for (const CLI::Option* option : leaf->get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  }
  for (const std::string& arg : leaf->remaining()) {
    if (arg.rfind("--", 0) != 0) continue;
    const std::string flag = arg.substr(0, arg.find('='));
    const std::string nearest = NearestName(flag, names);
    if (!nearest.empty()) return absl::StrCat(" (did you mean ", nearest, "?)");
  }
  return "";
}

}  // namespace

void AddNodeFlags(CLI::App* app, NodeFlags* flags) {
  app->add_option("--coordinator", flags->coordinator, "coordinator HOST:PORT")->required();
  app->add_option("--model", flags->model, "checkpoint folder")->required();
  AddBoundedInt(app, "--busy-poll-us", &flags->busy_poll_us, 0, 1000 * 1000,
                "microseconds a thread waiting for token rows polls before it sleeps (it yields "
                "its core meanwhile; 0: sleep at once)");
  app->add_option("--ucx-eager-limit", flags->ucx_eager_limit,
                  "token-row messages up to this size (UCX units: 256k, 1m; empty: UCX's choice) "
                  "are sent eagerly instead of by rendezvous; UCX_RNDV_THRESH wins when set")
      ->capture_default_str();
  app->add_option("--trace-file", flags->trace_file,
                  "append the spans of requests traced with a sampled W3C traceparent to this "
                  "file, one JSON object per line");
  AddListenFlags(app, flags);
}

void AddListenFlags(CLI::App* app, NodeFlags* flags) {
  app->add_option("--host", flags->host, "listen address (advertised unless a wildcard)")
      ->capture_default_str();
  AddBoundedInt(app, "--port", &flags->port, 0, 65535, "gRPC port (0 picks a free one)");
  AddBoundedInt(app, "--metrics-port", &flags->metrics_port, -1, 65535,
                "HTTP /metrics port (-1: none, 0 picks a free one)");
  AddTlsFlags(app, &flags->tls);
}

void AddTlsFlags(CLI::App* app, TlsFlags* tls) {
  app->add_option("--tls-cert", tls->cert,
                  "PEM certificate (chain) of this process for gRPC TLS (needs --tls-key)");
  app->add_option("--tls-key", tls->key, "PEM private key of --tls-cert");
  app->add_option("--tls-ca", tls->ca,
                  "PEM CA certificates that sign the peers': clients verify servers with them, "
                  "servers require client certificates signed by them (mutual TLS)");
  app->add_option("--tls-server-name", tls->server_name,
                  "the name clients expect in the servers' certificates (default: the host "
                  "dialled)");
}

void AddClientSecurityFlags(CLI::App* app, CLI::Option* server, TlsFlags* tls,
                            std::string* auth_token_file) {
  AddTlsFlags(app, tls);
  app->add_option("--auth-token-file", *auth_token_file,
                  "with --server: file holding the bearer token the server requires")
      ->needs(server);
}

CLI::Option* AddBoundedInt(CLI::App* app, const std::string& name, int64_t* value, int64_t min,
                           int64_t max, const std::string& help) {
  return AddBounded(app, name, value, min, max, help);
}

CLI::Option* AddBoundedInt(CLI::App* app, const std::string& name, int* value, int64_t min,
                           int64_t max, const std::string& help) {
  return AddBounded(app, name, value, std::max<int64_t>(min, INT32_MIN),
                    std::min<int64_t>(max, INT32_MAX), help);
}

CLI::Option* AddMilliseconds(CLI::App* app, const std::string& name, absl::Duration* value,
                             int64_t min_ms, int64_t max_ms, const std::string& help) {
  CLI::Option* option = app->add_option_function<int64_t>(
      name, [value](int64_t ms) { *value = absl::Milliseconds(ms); }, help);
  option->check(CLI::Range(min_ms, max_ms));
  option->default_str(std::to_string(absl::ToInt64Milliseconds(*value)));
  option->type_name("MS");
  return option;
}

absl::StatusOr<std::vector<int32_t>> ParseIntList(const std::string& text, const std::string& what,
                                                  int64_t min, int64_t max) {
  std::vector<int32_t> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < min || v > max) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", part, "' in '", text,
                                                     "' is not an integer in [", min, ", ", max,
                                                     "]"));
    }
    values.push_back(static_cast<int32_t>(v));
  }
  return values;
}

CLI::Option* AddIntList(CLI::App* app, const std::string& name, std::vector<int32_t>* values,
                        int64_t min, int64_t max, const std::string& help) {
  CLI::Option* option = app->add_option_function<std::string>(
      name,
      [values, name, min, max](const std::string& text) {
        absl::StatusOr<std::vector<int32_t>> parsed = ParseIntList(text, name, min, max);
        if (!parsed.ok()) throw CLI::ValidationError(std::string(parsed.status().message()));
        *values = *std::move(parsed);
      },
      help);
  option->type_name("N,N,...");
  return option;
}

CLI::Option* AddDeviceFlag(CLI::App* app, ComputeDevice* device, const std::string& help) {
  CLI::Option* option = app->add_option_function<std::string>(
      "--device",
      [device](const std::string& text) {
        absl::StatusOr<ComputeDevice> parsed = ParseComputeDevice(text);
        if (!parsed.ok()) {
          throw CLI::ValidationError("--device", std::string(parsed.status().message()));
        }
        *device = *parsed;
      },
      help);
  option->type_name("DEVICE")->default_str(ComputeDeviceName(*device));
  return option;
}

absl::Status ParseArgs(CLI::App* app, const std::vector<std::string>& args) {
  // CLI11 takes the arguments last-first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app->parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return absl::FailedPreconditionError(app->help());
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(absl::StrCat(e.what(), Suggestion(*app)));
  }
  return absl::OkStatus();
}

std::optional<int> ParseToolArgs(CLI::App* app, const std::vector<std::string>& args) {
  absl::Status status = ParseArgs(app, args);
  if (status.ok()) return std::nullopt;
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    std::cout << status.message();
    return 0;
  }
  std::cerr << status.message() << "\n";
  return 2;
}

int ReportParseError(const CLI::App& app, const CLI::ParseError& error) {
  if (dynamic_cast<const CLI::CallForHelp*>(&error) != nullptr ||
      dynamic_cast<const CLI::CallForAllHelp*>(&error) != nullptr) {
    std::cout << ParsedLeaf(app)->help();
    return 0;
  }
  std::cerr << ParsedLeaf(app)->get_name() << ": " << error.what() << Suggestion(app)
            << "\nRun with --help for more information.\n";
  return 2;
}

int ReportError(const std::string& command, const absl::Status& status) {
  std::cerr << "k3serve" << (command.empty() ? "" : " ") << command << ": " << status.message()
            << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

std::string NearestName(const std::string& typo, const std::vector<std::string>& names) {
  std::string best;
  int best_distance = 0;
  for (const std::string& name : names) {
    const int d = EditDistance(typo, name);
    if (best.empty() || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  // More than a third of the name changed is not a typo.
  return best_distance > 0 && best_distance * 3 <= static_cast<int>(best.size()) ? best : "";
}

}  // namespace k3
