#include "launcher/local_cluster_main.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <ctime>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention_nodes/server/generate_client.h"
#include "expert_nodes/device_experts.h"
#include "cluster/security.h"
#include "proto/generate.pb.h"
#include "cluster/command_line.h"

namespace k3 {

namespace {

int Fail(const absl::Status& status) { return ReportError("local", status); }

// SIGINT and SIGTERM stay blocked in every thread; the command takes them with sigtimedwait.
class BlockedStopSignals {
 public:
  BlockedStopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~BlockedStopSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

  // The signal that arrived within `timeout`, else 0.
  int Wait(absl::Duration timeout) {
    timespec ts = absl::ToTimespec(timeout);
    const int sig = sigtimedwait(&set_, nullptr, &ts);
    return sig > 0 ? sig : 0;
  }

 private:
  sigset_t set_;
  sigset_t previous_;
};

// Serves until a stop signal, restarting processes that exit (see the header); 0, or 1 after
// giving up on a process.
int Supervise(LocalCluster& cluster, const RestartPolicy& policy, BlockedStopSignals& signals) {
  RestartSupervisor supervisor(policy);
  for (const LocalCluster::Node& node : cluster.nodes()) {
    supervisor.Started(node.name, absl::Now());
  }
  // True to go on; false after giving up on `name`.
  auto exited = [&](const std::string& name, int exit_status) {
    const RestartSupervisor::Decision decision = supervisor.Exited(name, exit_status, absl::Now());
    std::cerr << "k3serve local: " << decision.message << std::endl;
    if (decision.give_up) {
      std::cerr << "k3serve local: stopping the cluster" << std::endl;
      return false;
    }
    return true;
  };
  while (true) {
    const absl::Duration wait = std::clamp(supervisor.NextDue() - absl::Now(), absl::ZeroDuration(),
                                           absl::Milliseconds(100));
    const int sig = signals.Wait(wait);
    if (sig != 0) {
      std::cerr << "k3serve local: got signal " << sig << "; stopping the cluster" << std::endl;
      return 0;
    }
    for (const LocalCluster::Node* node : cluster.Reap()) {
      std::cerr << "k3serve local: " << node->name << " "
                << (node->exit_status > 128
                        ? absl::StrCat("was killed by signal ", node->exit_status - 128)
                        : absl::StrCat("exited with status ", node->exit_status))
                << "; the end of " << node->log_path << ":\n"
                << LocalCluster::LogTail(node->log_path) << std::endl;
      // A drained expert node (SIGTERM or the coordinator's Drain RPC) handed its experts over;
      // restarted, it joins again, so the expert tier gets its capacity and replicas back.
      if (!exited(node->name, node->exit_status)) return 1;
    }
    for (const std::string& name : supervisor.TakeDue(absl::Now())) {
      if (absl::Status s = cluster.Restart(name); !s.ok()) {
        std::cerr << "k3serve local: restarting " << name << " failed: " << s.message()
                  << std::endl;
        if (!exited(name, 127)) return 1;
        continue;
      }
      supervisor.Started(name, absl::Now());
    }
  }
}

// --attention-device, --expert-device and --nccl-host-per-node.
void AddDeviceFlags(CLI::App* app, LocalClusterOptions* c) {
  // --attention-device and --expert-device go to every node of their role as --device.
  const auto add_role_device = [c, app](const std::string& flag, NodeRole role,
                                        const std::string& help) {
    app->add_option_function<std::string>(
        flag,
        [c, flag, role](const std::string& text) {
          absl::StatusOr<ComputeDevice> device = ParseComputeDevice(text);
          if (!device.ok()) {
            throw CLI::ValidationError(flag, std::string(device.status().message()));
          }
          std::vector<std::string>& args = c->extra_args[role];
          args.insert(args.end(), {"--device", ComputeDeviceName(*device)});
        },
        help);
  };
  add_role_device("--attention-device", NodeRole::kAttention,
                  "where the attention workers run the forward pass: cpu (default), cuda or "
                  "cuda:N (every attention worker on that GPU; docs/GPU.md)");
  add_role_device("--expert-device", NodeRole::kExpert,
                  "where the expert workers compute: cpu (default), cuda or cuda:N (every expert "
                  "worker on that GPU, MXFP4 experts only; docs/GPU.md)");
  app->add_flag("--nccl-host-per-node", c->nccl_host_per_node,
                "give each attention and expert worker its own NCCL_HOSTID, so that GPU workers "
                "sharing one GPU get device channels between them (testing the GPU-to-GPU path "
                "on one GPU; docs/GPU.md)");
}

}  // namespace

void AddLocalFlags(CLI::App* app, LocalCommandOptions* options) {
  LocalClusterOptions& c = options->cluster;
  auto host = std::make_shared<std::string>();
  auto slots = std::make_shared<std::vector<int32_t>>();
  app->add_option("--model", c.model, "checkpoint folder")->required();
  AddBoundedInt(app, "--attention", &c.attention, 1, 64, "attention workers");
  AddBoundedInt(app, "--routers", &c.routers, 1, 64, "routers");
  AddBoundedInt(app, "--experts", &c.experts, 0, 256, "expert workers");
  CLI::Option* expert_slots =
      AddIntList(app, "--expert-slots", slots.get(), 1, 1 << 20, "slots of each expert worker");
  AddBoundedInt(app, "--spare-expert-slots", &c.spare_expert_slots, -1, 1 << 20,
                "spare slots per MoE layer of each expert worker, holding replicas so that a "
                "killed or drained expert worker costs no request (-1: each worker's share when "
                "there are two or more, so every expert lives on two workers; 0: none)");
  AddDeviceFlags(app, &c);
  AddBoundedInt(app, "--base-port", &c.base_port, 0, 65535,
                "first port of a consecutive range (0: free ports)");
  CLI::Option* host_flag = app->add_option("--host", *host, "the address every process listens on");
  c.metrics = true;  // `k3serve local` gives every process a /metrics port unless told not to
  CLI::Option* metrics_flag =
      app->add_flag("--metrics,!--no-metrics", c.metrics,
                    "every process serves HTTP /metrics, printed as `metrics address: NODE "
                    "HOST:PORT` (default: on, off with --prompt)");
  c.http_port = 0;  // `k3serve local` starts the HTTP front unless told not to
  CLI::Option* http_flag =
      AddBoundedInt(app, "--http-port", &c.http_port, -1, 65535,
                    "the OpenAI-compatible HTTP front's port (0: a free one, -1: no front; "
                    "none by default with --prompt)");
  app->add_option("--log-dir", c.log_dir, "where each process's log goes (default: a new folder)");
  AddTlsFlags(app, &c.tls);
  app->add_option("--auth-token-file", c.auth_token_file,
                  "bearer token file of the attention workers and the HTTP front");
  AddMilliseconds(app, "--startup-timeout-ms", &c.startup_timeout, 1, 86400000,
                  "how long the cluster may take to become ready");
  AddMilliseconds(app, "--stop-grace-ms", &c.stop_grace, 0, 3600000,
                  "how long a process may take to stop after SIGTERM");
  CLI::Option* prompt = AddIntList(app, "--prompt", &options->prompt, 0, INT32_MAX,
                                   "generate from these token ids, print them and stop");
  AddBoundedInt(app, "--max-new-tokens", &options->max_new_tokens, 1, 1 << 20,
                "new tokens for --prompt")
      ->needs(prompt);
  AddBoundedInt(app, "--node-threads", &c.node_threads, 0, 4096,
                "kernel threads of each attention, router and expert process (0: this machine's "
                "threads split among them; K3SERVE_THREADS in the environment wins)");
  AddBoundedInt(app, "--max-restarts", &options->restart.max_failures_in_a_row, 0, 1000,
                "restarts of a process that keeps dying (each within 10 s) before the launcher "
                "gives up (0: never restart)");
  app->final_callback([options, host, slots, expert_slots, host_flag, http_flag, metrics_flag] {
    LocalClusterOptions& c = options->cluster;
    // A one-shot --prompt run has no use for the front or metrics.
    if (!options->prompt.empty() && http_flag->count() == 0) c.http_port = -1;
    if (!options->prompt.empty() && metrics_flag->count() == 0) c.metrics = false;
    if (expert_slots->count() > 0) {
      if (static_cast<int>(slots->size()) != c.experts) {
        throw CLI::ValidationError(absl::StrCat("--expert-slots lists ", slots->size(),
                                                " nodes but --experts is ", c.experts));
      }
      c.expert_slots.assign(slots->begin(), slots->end());
    }
    if (host_flag->count() > 0) {
      for (NodeRole role : {NodeRole::kCoordinator, NodeRole::kAttention, NodeRole::kRouter,
                            NodeRole::kExpert, NodeRole::kHttp}) {
        c.sites[role].host = *host;
      }
    }
  });
}

int LocalClusterCommand(LocalCommandOptions options) {
  // Before any thread exists, so that every thread inherits the mask.
  BlockedStopSignals signals;
  LocalClusterOptions& c = options.cluster;
  c.progress = [](const std::string& line) { std::cerr << line << std::endl; };
  int interrupted_by = 0;
  c.cancelled = [&] {
    if (interrupted_by == 0) interrupted_by = signals.Wait(absl::ZeroDuration());
    return interrupted_by != 0;
  };

  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(c);
  if (!cluster.ok()) {
    if (interrupted_by != 0) {
      std::cerr << "k3serve local: interrupted during startup; the cluster is stopped\n";
      return 130;
    }
    return Fail(cluster.status());
  }
  std::cerr << "cluster ready; logs in " << (*cluster)->log_dir() << std::endl;
  for (const std::string& address : (*cluster)->generate_addresses()) {
    std::cout << "generate address: " << address << std::endl;
  }
  if (const std::string http = (*cluster)->http_address(); !http.empty()) {
    std::cout << "http address: " << http << std::endl;
    std::cout << "front generate address: " << (*cluster)->front_grpc_address() << std::endl;
  }
  for (const LocalCluster::Node& node : (*cluster)->nodes()) {
    if (!node.metrics_address.empty()) {
      std::cout << "metrics address: " << node.name << " " << node.metrics_address << std::endl;
    }
  }

  int exit_status = 0;
  if (!options.prompt.empty()) {
    const k3serve::v1::GenerateRequest request =
        GreedyRequest("k3serve-local-prompt", options.prompt, options.max_new_tokens);
    GenerateClientOptions client;
    absl::StatusOr<ClientTls> tls = LoadClientTls(c.tls);
    absl::StatusOr<std::string> token = c.auth_token_file.empty()
                                            ? std::string()
                                            : ReadTokenFile("--auth-token-file", c.auth_token_file);
    // Both were read when the cluster started.
    if (tls.ok()) client.tls = *std::move(tls);
    if (token.ok()) client.auth_token = *std::move(token);
    absl::StatusOr<GenerateOutcome> outcome =
        GenerateOverGrpc(client, (*cluster)->generate_addresses()[0], request, absl::Minutes(10));
    if (!outcome.ok()) {
      exit_status = Fail(outcome.status());
    } else if (outcome->complete.finish_reason() == k3serve::v1::Complete::ERROR ||
               outcome->complete.finish_reason() == k3serve::v1::Complete::CANCELLED) {
      exit_status = Fail(absl::InternalError(
          absl::StrCat("generation ended early: ", outcome->complete.message())));
    } else {
      std::cout << absl::StrJoin(outcome->tokens, " ") << std::endl;
    }
  } else {
    std::cerr << "serving; Ctrl-C stops the cluster" << std::endl;
    exit_status = Supervise(**cluster, options.restart, signals);
  }
  if (absl::Status s = (*cluster)->Stop(); !s.ok()) {
    std::cerr << "k3serve local: " << s.message() << std::endl;
    if (exit_status == 0) exit_status = 1;
  }
  return exit_status;
}

Subcommand AddLocalCommand(CLI::App* top) {
  return AddSubcommand(top, "local", "a local cluster of processes on this host", AddLocalFlags,
                       LocalClusterCommand);
}

}  // namespace k3
