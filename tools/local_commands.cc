#include "tools/local_commands.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "attention_nodes/server/generate_client.h"
#include "cluster/security.h"
#include "engine/process_engine.h"
#include "model/config.h"
#include "proto/generate.pb.h"
#include "router/qb_tool.h"
#include "tokenizer/text_prompt.h"
#include "tokenizer/tokenizer.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

int Fail(const absl::Status& status) { return ReportError("", status); }

// Prints loading progress to stderr, at most every 10% (big checkpoints take a while): on a
// terminal one line rewritten in place, elsewhere (a log file, a pipe) a whole line each time, so
// that the log holds no carriage returns.
void ShowProgress(size_t done, size_t total) {
  static const bool terminal = isatty(STDERR_FILENO) == 1;
  static int last_decile = -1;
  int decile = total == 0 ? 10 : static_cast<int>(10 * done / total);
  if (decile != last_decile) {
    last_decile = decile;
    std::cerr << (terminal ? "\r" : "") << "loading weights: " << done << "/" << total
              << " tensors" << (!terminal || done == total ? "\n" : "") << std::flush;
  }
}

absl::StatusOr<ModelConfig> ConfigFromFlag(const std::string& value) {
  absl::StatusOr<ModelConfig> named = NamedConfig(value);
  if (named.ok()) return named;
  if (value.find(".json") == std::string::npos && value.find('/') == std::string::npos) {
    return named.status();
  }
  return LoadModelConfig(value);
}

// `generate --server`: one Generate call. Sampling flags that are not given are left unset, so
// the server's defaults apply (greedy, 16 new tokens, a random seed). Prints the new tokens like
// the local mode, each as it arrives; a failed call (a timeout, say) ends the line of the tokens
// made so far and prints its gRPC code and message.
int RemoteGenerate(const GenerateCommandOptions& o) {
  k3serve::v1::GenerateRequest request;
  request.set_request_id(o.request_id);
  request.mutable_prompt_token_ids()->Add(o.tokens.begin(), o.tokens.end());
  if (o.chat) {
    k3serve::v1::ChatMessage* message = request.add_messages();
    message->set_role("user");
    message->set_content(o.prompt);
  } else if (!o.prompt.empty()) {
    request.set_prompt_text(o.prompt);
  }
  k3serve::v1::SamplingParams& sampling = *request.mutable_sampling();
  const GenerationRequest& g = o.generate;
  if (o.has_max_new_tokens) sampling.set_max_new_tokens(g.max_new_tokens);
  if (o.has_temperature) sampling.set_temperature(g.sampling.temperature);
  if (o.has_top_p) sampling.set_top_p(g.sampling.top_p);
  if (o.has_top_k) sampling.set_top_k(g.sampling.top_k);
  if (o.has_seed) sampling.set_seed(g.sampling.seed);
  sampling.mutable_stop_token_ids()->Add(g.stop_token_ids.begin(), g.stop_token_ids.end());
  if (g.ignore_eos) sampling.set_ignore_eos(true);
  // Token ids print as they stream; text prints once the call ends.
  bool first = true;
  std::function<void(absl::Span<const int32_t>)> print_tokens;
  if (o.prompt.empty()) {
    print_tokens = [&first](absl::Span<const int32_t> new_tokens) {
      for (int32_t token : new_tokens) {
        std::cout << (first ? "" : " ") << token;
        first = false;
      }
      std::cout << std::flush;
    };
  }
  GenerateClientOptions client;
  absl::StatusOr<ClientTls> tls = LoadClientTls(o.tls);
  if (!tls.ok()) return ReportError("generate", tls.status());
  client.tls = *std::move(tls);
  if (!o.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile("--auth-token-file", o.auth_token_file);
    if (!token.ok()) return ReportError("generate", token.status());
    client.auth_token = *std::move(token);
  }
  absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
      client, o.server, request,
      o.timeout_ms > 0 ? absl::Milliseconds(o.timeout_ms) : absl::InfiniteDuration(),
      print_tokens);
  if (outcome.ok() && !o.prompt.empty()) std::cout << outcome->text;
  std::cout << "\n";
  if (!outcome.ok()) {
    std::cerr << "k3serve: " << absl::StatusCodeToString(outcome.status().code()) << ": "
              << outcome.status().message() << "\n";
    return outcome.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const k3serve::v1::Complete& complete = outcome->complete;
  if (complete.finish_reason() == k3serve::v1::Complete::LENGTH ||
      complete.finish_reason() == k3serve::v1::Complete::STOP) {
    return 0;
  }
  std::cerr << "k3serve: request " << outcome->request_id << " ended with "
            << k3serve::v1::Complete::FinishReason_Name(complete.finish_reason()) << ": "
            << complete.message() << "\n";
  return 1;
}

// --name X, a number in [min, max] stored in *value; *given records that the command line set
// it (with --server, only what was given overrides the server's defaults).
CLI::Option* AddGivenFloat(CLI::App* app, const std::string& name, float* value, bool* given,
                           double min, double max, const std::string& help) {
  return app
      ->add_option_function<double>(
          name,
          [value, given](double v) {
            *value = static_cast<float>(v);
            *given = true;
          },
          help)
      ->check(CLI::Range(min, max));
}

}  // namespace

void AddRandomCheckpointFlags(CLI::App* app, RandomCheckpointCommandOptions* options) {
  app->add_option("--config", options->config,
                  "k3-tiny | k3-tiny-8 | kimi-linear-tiny | k3-perf | FILE.json")
      ->required();
  app->add_option("--seed", options->seed, "random seed")->capture_default_str();
  app->add_option("--out", options->out, "folder to write")->required();
  AddBoundedInt(app, "--shards", &options->shards, 1, 1 << 16, "safetensors files");
  app->add_flag("--mxfp4", options->mxfp4, "routed experts in the release's MXFP4 layout");
  app->add_flag("--headers-only", options->headers_only,
                "no tensor data: a checkpoint for `plan` (sizing a cluster)");
}

int RandomCheckpointCommand(const RandomCheckpointCommandOptions& options) {
  absl::StatusOr<ModelConfig> config = ConfigFromFlag(options.config);
  if (!config.ok()) return Fail(config.status());
  RandomCheckpointOptions write;
  write.shards = options.shards;
  write.mxfp4 = options.mxfp4;
  write.headers_only = options.headers_only;
  if (absl::Status s =
          WriteRandomModelFolder(*config, static_cast<uint64_t>(options.seed), options.out, write);
      !s.ok()) {
    return Fail(s);
  }
  std::cerr << "wrote a random " << options.config << " checkpoint to " << options.out << "\n";
  return 0;
}

Subcommand AddRandomCheckpointCommand(CLI::App* top) {
  return AddSubcommand(top, "random-checkpoint", "write a random-weight checkpoint",
                       AddRandomCheckpointFlags, RandomCheckpointCommand);
}

constexpr char kModelDeviceHelp[] =
    "where the model runs: cpu (default), cuda or cuda:N (the whole model on that GPU)";

void AddLogitsFlags(CLI::App* app, LogitsOptions* options) {
  app->add_option("--model", options->model, "checkpoint folder")->required();
  AddDeviceFlag(app, &options->device, kModelDeviceHelp);
  AddIntList(app, "--tokens", &options->tokens, 0, INT32_MAX, "prompt token ids")->required();
  app->add_option("--out", options->out, "raw little-endian float32 [tokens, vocab]")->required();
  app->add_flag("--decode", options->decode, "one token at a time (the decode path)");
}

int LogitsCommand(const LogitsOptions& options) {
  absl::StatusOr<std::unique_ptr<ProcessEngine>> engine =
      ProcessEngine::Open(options.model, options.device, SchedulerOptions(), ShowProgress);
  if (!engine.ok()) return Fail(engine.status());
  absl::StatusOr<std::vector<float>> logits = (*engine)->Logits(options.tokens, options.decode);
  if (!logits.ok()) return Fail(logits.status());
  std::ofstream file(options.out, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(logits->data()),
             static_cast<std::streamsize>(logits->size() * sizeof(float)));
  file.close();
  if (!file) return Fail(absl::InternalError(absl::StrCat("cannot write ", options.out)));
  return 0;
}

Subcommand AddLogitsCommand(CLI::App* top) {
  return AddSubcommand(top, "logits", "raw logits of a prompt, in process", AddLogitsFlags,
                       LogitsCommand);
}

void AddGenerateFlags(CLI::App* app, GenerateCommandOptions* options) {
  GenerationRequest& g = options->generate;
  CLI::Option* model = app->add_option("--model", options->model, "checkpoint folder (in process)");
  CLI::Option* server = app->add_option("--server", options->server, "HOST:PORT of a cluster");
  model->excludes(server);
  AddDeviceFlag(app, &options->device, kModelDeviceHelp)->excludes(server);
  CLI::Option* tokens = AddIntList(app, "--tokens", &options->tokens, 0, INT32_MAX,
                                   "prompt token ids");
  CLI::Option* prompt = app->add_option("--prompt", options->prompt,
                                        "prompt text (the model's tokenizer); the answer as text");
  prompt->excludes(tokens);
  app->add_flag("--chat", options->chat, "send --prompt as a user message in the chat format")
      ->needs(prompt);
  AddBoundedInt(app, "--max-new-tokens", &g.max_new_tokens, 1, 1 << 24, "new tokens at most")
      ->each([options](const std::string&) { options->has_max_new_tokens = true; });
  AddGivenFloat(app, "--temperature", &g.sampling.temperature, &options->has_temperature, 0.0,
                100.0, "0 is greedy");
  AddGivenFloat(app, "--top-p", &g.sampling.top_p, &options->has_top_p, 0.0, 1.0,
                "nucleus sampling mass");
  AddBoundedInt(app, "--top-k", &g.sampling.top_k, 0, 1 << 24, "0: no top-k cut")
      ->each([options](const std::string&) { options->has_top_k = true; });
  app->add_option_function<uint64_t>(
      "--seed",
      [options](uint64_t seed) {
        options->generate.sampling.seed = seed;
        options->has_seed = true;
      },
      "sampling seed");
  AddIntList(app, "--stop-token-ids", &g.stop_token_ids, 0, INT32_MAX,
             "tokens that end the generation");
  app->add_flag("--ignore-eos", g.ignore_eos,
                "the model's eos_token_id does not end the generation");
  app->add_option("--request-id", options->request_id, "with --server")->needs(server);
  AddBoundedInt(app, "--timeout-ms", &options->timeout_ms, 0, int64_t{1} << 40,
                "with --server; 0: none")
      ->needs(server);
  AddClientSecurityFlags(app, server, &options->tls, &options->auth_token_file);
  app->final_callback([options] {
    if (options->model.empty() && options->server.empty()) {
      throw CLI::ValidationError("give --model DIR or --server HOST:PORT");
    }
    if (options->tokens.empty() && options->prompt.empty()) {
      throw CLI::ValidationError("give --tokens N,N,... or --prompt TEXT");
    }
  });
}

int GenerateCommand(const GenerateCommandOptions& options) {
  if (!options.server.empty()) return RemoteGenerate(options);
  // One request: the scheduler takes whatever the command line asks for, and has no earlier
  // conversation to reuse (no prefix cache).
  SchedulerOptions scheduler;
  scheduler.max_new_tokens_limit = std::max(options.generate.max_new_tokens, 1);
  scheduler.max_prompt_tokens = INT32_MAX;
  scheduler.prefix_cache_bytes = 0;
  absl::StatusOr<std::unique_ptr<ProcessEngine>> engine =
      ProcessEngine::Open(options.model, options.device, scheduler, ShowProgress);
  if (!engine.ok()) return Fail(engine.status());
  GenerationRequest request = options.generate;
  if (options.prompt.empty()) {
    request.prompt = options.tokens;
    absl::StatusOr<std::vector<int32_t>> generated = (*engine)->Generate(std::move(request));
    if (!generated.ok()) return Fail(generated.status());
    std::cout << absl::StrJoin(*generated, " ") << "\n";
    return 0;
  }
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(options.model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  absl::StatusOr<EncodedPrompt> prompt =
      EncodePrompt(*tokenizer, options.prompt, {.chat = options.chat});
  if (!prompt.ok()) return Fail(prompt.status());
  request.prompt = prompt->ids;
  if (prompt->stop_id.has_value()) request.stop_token_ids.push_back(*prompt->stop_id);
  absl::StatusOr<std::vector<int32_t>> generated = (*engine)->Generate(std::move(request));
  if (!generated.ok()) return Fail(generated.status());
  // The turn end is where the answer stops, not part of it.
  if (prompt->stop_id.has_value() && !generated->empty() &&
      generated->back() == *prompt->stop_id) {
    generated->pop_back();
  }
  absl::StatusOr<std::string> text = DecodeForDisplay(*tokenizer, *generated);
  if (!text.ok()) return Fail(text.status());
  std::cout << *text << "\n";
  return 0;
}

Subcommand AddGenerateCommand(CLI::App* top) {
  return AddSubcommand(top, "generate", "generate tokens in process or through a server",
                       AddGenerateFlags, GenerateCommand);
}

void AddPlanFlags(CLI::App* app, PlanCommandOptions* options) {
  app->add_option("--model", options->model, "checkpoint folder (headers are enough)")->required();
  AddBoundedInt(app, "--attention", &options->topology.attention, 1, 1 << 16, "attention workers");
  AddBoundedInt(app, "--routers", &options->topology.routers, 1, 1 << 16, "routers");
  AddBoundedInt(app, "--experts", &options->topology.experts, 1, 1 << 16, "expert workers");
}

int PlanCommand(const PlanCommandOptions& options) {
  absl::StatusOr<MemoryPlan> plan = PlanMemory(options.model, options.topology);
  if (!plan.ok()) return Fail(plan.status());
  std::cout << FormatMemoryPlan(*plan);
  return 0;
}

Subcommand AddPlanCommand(CLI::App* top) {
  return AddSubcommand(top, "plan",
                       "bytes each process of a topology maps and each tier reads per token",
                       AddPlanFlags, PlanCommand);
}

void AddQbFlags(CLI::App* app, QbToolOptions* options) {
  app->add_option("--scores", options->scores_path, "float32 [tokens, experts] gate scores")
      ->required();
  AddBoundedInt(app, "--tokens", &options->tokens, 1, int64_t{1} << 40, "tokens")->required();
  AddBoundedInt(app, "--experts", &options->experts, 1, 1 << 20, "experts")->required();
  AddBoundedInt(app, "--top-k", &options->top_k, 1, 1 << 20, "experts per token")->required();
  app->add_option("--bias", options->bias_path, "float32 [experts] bias (default zero)");
  CLI::Option* bins = AddBoundedInt(app, "--bins", &options->bins, 1, 1 << 20, "histogram bins");
  app->add_flag("--exact", options->exact, "type-7 quantiles of the raw values")->excludes(bins);
}

int QbCommand(const QbToolOptions& options) {
  if (absl::Status s = RunQbTool(options, std::cout); !s.ok()) return Fail(s);
  return 0;
}

Subcommand AddQbCommand(CLI::App* top) {
  return AddSubcommand(top, "qb", "offline QB (quantile balancing) statistics", AddQbFlags,
                       QbCommand);
}

}  // namespace k3
