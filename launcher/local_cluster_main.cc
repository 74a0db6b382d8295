#include "launcher/local_cluster_main.h"

#include <pthread.h>
#include <signal.h>

#include <ctime>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "attention_nodes/generate_client.h"
#include "proto/generate.pb.h"
#include "tools/cli_flags.h"

namespace k3 {

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "k3serve local: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<int> IntIn(const CliFlags& flags, const std::string& name, int64_t fallback,
                          int64_t min, int64_t max) {
  absl::StatusOr<int64_t> value = flags.Int(name, fallback);
  if (!value.ok()) return value.status();
  if (*value < min || *value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [", min, ", ", max, "], got ", *value));
  }
  return static_cast<int>(*value);
}

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

}  // namespace

absl::StatusOr<LocalCommandOptions> ParseLocalArgs(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags = CliFlags::Parse(
      args,
      {"model", "attention", "routers", "experts", "expert-slots", "base-port", "host", "log-dir",
       "startup-timeout-ms", "stop-grace-ms", "prompt", "max-new-tokens"},
      {"metrics"});
  if (!flags.ok()) return flags.status();
  LocalCommandOptions options;
  LocalClusterOptions& c = options.cluster;
  absl::StatusOr<std::string> model = flags->String("model");
  absl::StatusOr<int> attention = IntIn(*flags, "attention", 1, 1, 64);
  absl::StatusOr<int> routers = IntIn(*flags, "routers", 1, 1, 64);
  absl::StatusOr<int> experts = IntIn(*flags, "experts", 1, 0, 256);
  absl::StatusOr<int> base_port = IntIn(*flags, "base-port", 0, 0, 65535);
  absl::StatusOr<int> startup_ms = IntIn(*flags, "startup-timeout-ms", 120000, 1, 86400000);
  absl::StatusOr<int> grace_ms = IntIn(*flags, "stop-grace-ms", 5000, 0, 3600000);
  absl::StatusOr<int> max_new = IntIn(*flags, "max-new-tokens", 16, 1, 1 << 20);
  for (const absl::Status& s :
       {model.status(), attention.status(), routers.status(), experts.status(), base_port.status(),
        startup_ms.status(), grace_ms.status(), max_new.status()}) {
    if (!s.ok()) return s;
  }
  c.model = *model;
  c.attention = *attention;
  c.routers = *routers;
  c.experts = *experts;
  c.base_port = *base_port;
  c.metrics = flags->Has("metrics");
  c.log_dir = flags->StringOr("log-dir", "");
  c.startup_timeout = absl::Milliseconds(*startup_ms);
  c.stop_grace = absl::Milliseconds(*grace_ms);
  if (flags->Has("expert-slots")) {
    absl::StatusOr<std::vector<int32_t>> slots = flags->IntList("expert-slots");
    if (!slots.ok()) return slots.status();
    if (static_cast<int>(slots->size()) != c.experts) {
      return absl::InvalidArgumentError(absl::StrCat("--expert-slots lists ", slots->size(),
                                                     " nodes but --experts is ", c.experts));
    }
    c.expert_slots.assign(slots->begin(), slots->end());
  }
  if (flags->Has("host")) {
    const std::string host = *flags->String("host");
    for (NodeRole role :
         {NodeRole::kCoordinator, NodeRole::kAttention, NodeRole::kRouter, NodeRole::kExpert}) {
      c.sites[role].host = host;
    }
  }
  if (flags->Has("prompt")) {
    absl::StatusOr<std::vector<int32_t>> prompt = flags->IntList("prompt");
    if (!prompt.ok()) return prompt.status();
    if (prompt->empty()) return absl::InvalidArgumentError("--prompt is empty");
    options.prompt = *std::move(prompt);
  } else if (flags->Has("max-new-tokens")) {
    return absl::InvalidArgumentError("--max-new-tokens needs --prompt");
  }
  options.max_new_tokens = *max_new;
  return options;
}

int LocalClusterCommand(const std::vector<std::string>& args) {
  // Before any thread exists, so that every thread inherits the mask.
  BlockedStopSignals signals;
  absl::StatusOr<LocalCommandOptions> options = ParseLocalArgs(args);
  if (!options.ok()) return Fail(options.status());
  LocalClusterOptions& c = options->cluster;
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

  int exit_status = 0;
  if (!options->prompt.empty()) {
    k3serve::v1::GenerateRequest request;
    request.set_request_id("k3serve-local-prompt");
    request.mutable_prompt_token_ids()->Add(options->prompt.begin(), options->prompt.end());
    request.mutable_sampling()->set_temperature(0.0f);
    request.mutable_sampling()->set_max_new_tokens(options->max_new_tokens);
    absl::StatusOr<GenerateOutcome> outcome =
        GenerateOverGrpc((*cluster)->generate_addresses()[0], request, absl::Minutes(10));
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
    while (true) {
      const int sig = signals.Wait(absl::Milliseconds(200));
      if (sig != 0) {
        std::cerr << "k3serve local: got signal " << sig << "; stopping the cluster" << std::endl;
        break;
      }
      for (const LocalCluster::Node* node : (*cluster)->Reap()) {
        std::cerr << "k3serve local: " << node->name
                  << (node->exit_status > 128
                          ? absl::StrCat(" was killed by signal ", node->exit_status - 128)
                          : absl::StrCat(" exited with status ", node->exit_status))
                  << "; the end of " << node->log_path << ":\n"
                  << LocalCluster::LogTail(node->log_path) << std::endl;
      }
    }
  }
  if (absl::Status s = (*cluster)->Stop(); !s.ok()) {
    std::cerr << "k3serve local: " << s.message() << std::endl;
    if (exit_status == 0) exit_status = 1;
  }
  return exit_status;
}

}  // namespace k3
