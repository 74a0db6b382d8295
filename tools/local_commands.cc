#include "tools/local_commands.h"

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "attention_nodes/generate_client.h"
#include "attention_nodes/local_engine.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "proto/generate.pb.h"
#include "router/qb_tool.h"
#include "tools/cli_flags.h"
#include "tools/memory_plan.h"

namespace k3 {
namespace {

int Fail(const absl::Status& status) {
  std::cerr << "k3serve: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// Prints loading progress to stderr, at most every 10% (big checkpoints take a while).
void ShowProgress(size_t done, size_t total) {
  static int last_decile = -1;
  int decile = total == 0 ? 10 : static_cast<int>(10 * done / total);
  if (decile != last_decile) {
    last_decile = decile;
    std::cerr << "\rloading weights: " << done << "/" << total << " tensors" << (done == total ? "\n" : "")
              << std::flush;
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
// the local mode; a failed call prints its gRPC code and message.
int RemoteGenerate(const CliFlags& flags, const std::vector<int32_t>& tokens) {
  absl::StatusOr<std::string> server = flags.String("server");
  absl::StatusOr<int64_t> timeout_ms = flags.Int("timeout-ms", 0);
  for (const absl::Status& s : {server.status(), timeout_ms.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (*timeout_ms < 0) return Fail(absl::InvalidArgumentError("--timeout-ms must be >= 0"));
  k3serve::v1::GenerateRequest request;
  request.set_request_id(flags.StringOr("request-id", ""));
  request.mutable_prompt_token_ids()->Add(tokens.begin(), tokens.end());
  k3serve::v1::SamplingParams& sampling = *request.mutable_sampling();
  absl::StatusOr<int64_t> max_new = flags.Int("max-new-tokens", 0);
  absl::StatusOr<double> temperature = flags.Double("temperature", 0.0);
  absl::StatusOr<double> top_p = flags.Double("top-p", 1.0);
  absl::StatusOr<int64_t> top_k = flags.Int("top-k", 0);
  absl::StatusOr<int64_t> seed = flags.Int("seed", 0);
  for (const absl::Status& s : {max_new.status(), temperature.status(), top_p.status(),
                                top_k.status(), seed.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (flags.Has("max-new-tokens")) sampling.set_max_new_tokens(static_cast<int32_t>(*max_new));
  if (flags.Has("temperature")) sampling.set_temperature(static_cast<float>(*temperature));
  if (flags.Has("top-p")) sampling.set_top_p(static_cast<float>(*top_p));
  if (flags.Has("top-k")) sampling.set_top_k(static_cast<int32_t>(*top_k));
  if (flags.Has("seed")) sampling.set_seed(static_cast<uint64_t>(*seed));
  if (flags.Has("stop-token-ids")) {
    absl::StatusOr<std::vector<int32_t>> stops = flags.IntList("stop-token-ids");
    if (!stops.ok()) return Fail(stops.status());
    sampling.mutable_stop_token_ids()->Add(stops->begin(), stops->end());
  }
  absl::StatusOr<GenerateOutcome> outcome = GenerateOverGrpc(
      *server, request,
      *timeout_ms > 0 ? absl::Milliseconds(*timeout_ms) : absl::InfiniteDuration());
  if (!outcome.ok()) {
    std::cerr << "k3serve: " << absl::StatusCodeToString(outcome.status().code()) << ": "
              << outcome.status().message() << "\n";
    return outcome.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << absl::StrJoin(outcome->tokens, " ") << "\n";
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

}  // namespace

int RandomCheckpointCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags =
      CliFlags::Parse(args, {"config", "seed", "out", "shards"}, {"mxfp4", "headers-only"});
  if (!flags.ok()) return Fail(flags.status());
  absl::StatusOr<std::string> config_name = flags->String("config");
  absl::StatusOr<std::string> out = flags->String("out");
  absl::StatusOr<int64_t> seed = flags->Int("seed", 0);
  absl::StatusOr<int64_t> shards = flags->Int("shards", 1);
  for (const absl::Status& s : {config_name.status(), out.status(), seed.status(), shards.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (*shards < 1) return Fail(absl::InvalidArgumentError("--shards must be at least 1"));
  absl::StatusOr<ModelConfig> config = ConfigFromFlag(*config_name);
  if (!config.ok()) return Fail(config.status());
  RandomCheckpointOptions options;
  options.shards = static_cast<int>(*shards);
  options.mxfp4 = flags->Has("mxfp4");
  options.headers_only = flags->Has("headers-only");
  if (absl::Status s = WriteRandomCheckpoint(*config, static_cast<uint64_t>(*seed), *out, options);
      !s.ok()) {
    return Fail(s);
  }
  std::cerr << "wrote a random " << *config_name << " checkpoint to " << *out << "\n";
  return 0;
}

int LogitsCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags = CliFlags::Parse(args, {"model", "tokens", "out"}, {"decode"});
  if (!flags.ok()) return Fail(flags.status());
  absl::StatusOr<std::string> model = flags->String("model");
  absl::StatusOr<std::string> out = flags->String("out");
  absl::StatusOr<std::vector<int32_t>> tokens = flags->IntList("tokens");
  for (const absl::Status& s : {model.status(), out.status(), tokens.status()}) {
    if (!s.ok()) return Fail(s);
  }
  absl::StatusOr<std::unique_ptr<LocalEngine>> engine = LocalEngine::Open(*model, ShowProgress);
  if (!engine.ok()) return Fail(engine.status());
  absl::StatusOr<std::vector<float>> logits = (*engine)->Logits(*tokens, flags->Has("decode"));
  if (!logits.ok()) return Fail(logits.status());
  std::ofstream file(*out, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(logits->data()),
             static_cast<std::streamsize>(logits->size() * sizeof(float)));
  file.close();
  if (!file) return Fail(absl::InternalError(absl::StrCat("cannot write ", *out)));
  return 0;
}

int GenerateCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags = CliFlags::Parse(
      args, {"model", "server", "tokens", "max-new-tokens", "temperature", "top-p", "top-k", "seed",
             "stop-token-ids", "request-id", "timeout-ms"});
  if (!flags.ok()) return Fail(flags.status());
  absl::StatusOr<std::vector<int32_t>> tokens = flags->IntList("tokens");
  absl::StatusOr<int64_t> max_new = flags->Int("max-new-tokens", 16);
  absl::StatusOr<double> temperature = flags->Double("temperature", 0.0);
  absl::StatusOr<double> top_p = flags->Double("top-p", 1.0);
  absl::StatusOr<int64_t> top_k = flags->Int("top-k", 0);
  absl::StatusOr<int64_t> seed = flags->Int("seed", 0);
  for (const absl::Status& s : {tokens.status(), max_new.status(), temperature.status(),
                                top_p.status(), top_k.status(), seed.status()}) {
    if (!s.ok()) return Fail(s);
  }
  GenerateOptions options;
  options.max_new_tokens = static_cast<int>(*max_new);
  options.sampling.temperature = static_cast<float>(*temperature);
  options.sampling.top_p = static_cast<float>(*top_p);
  options.sampling.top_k = static_cast<int>(*top_k);
  options.sampling.seed = static_cast<uint64_t>(*seed);
  if (flags->Has("stop-token-ids")) {
    absl::StatusOr<std::vector<int32_t>> stops = flags->IntList("stop-token-ids");
    if (!stops.ok()) return Fail(stops.status());
    options.stop_token_ids = *stops;
  }
  if (flags->Has("server")) {
    if (flags->Has("model")) {
      return Fail(absl::InvalidArgumentError("give --model or --server, not both"));
    }
    return RemoteGenerate(*flags, *tokens);
  }
  absl::StatusOr<std::string> model = flags->String("model");
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<std::unique_ptr<LocalEngine>> engine = LocalEngine::Open(*model, ShowProgress);
  if (!engine.ok()) return Fail(engine.status());
  absl::StatusOr<std::vector<int32_t>> generated = (*engine)->Generate(*tokens, options);
  if (!generated.ok()) return Fail(generated.status());
  std::cout << absl::StrJoin(*generated, " ") << "\n";
  return 0;
}

int QbCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags =
      CliFlags::Parse(args, {"scores", "tokens", "experts", "top-k", "bias", "bins"}, {"exact"});
  if (!flags.ok()) return Fail(flags.status());
  QbToolOptions options;
  absl::StatusOr<std::string> scores = flags->String("scores");
  absl::StatusOr<int64_t> tokens = flags->Int("tokens", 0);
  absl::StatusOr<int64_t> experts = flags->Int("experts", 0);
  absl::StatusOr<int64_t> top_k = flags->Int("top-k", 0);
  absl::StatusOr<int64_t> bins = flags->Int("bins", options.bins);
  for (const absl::Status& s :
       {scores.status(), tokens.status(), experts.status(), top_k.status(), bins.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (flags->Has("bins") && flags->Has("exact")) {
    return Fail(absl::InvalidArgumentError("--bins and --exact exclude each other"));
  }
  options.scores_path = *scores;
  options.tokens = *tokens;
  options.experts = static_cast<int>(*experts);
  options.top_k = static_cast<int>(*top_k);
  options.bins = static_cast<int>(*bins);
  options.bias_path = flags->StringOr("bias", "");
  options.exact = flags->Has("exact");
  if (absl::Status s = RunQbTool(options, std::cout); !s.ok()) return Fail(s);
  return 0;
}

int PlanCommand(const std::vector<std::string>& args) {
  absl::StatusOr<CliFlags> flags =
      CliFlags::Parse(args, {"model", "attention", "routers", "experts"});
  if (!flags.ok()) return Fail(flags.status());
  absl::StatusOr<std::string> model = flags->String("model");
  absl::StatusOr<int64_t> attention = flags->Int("attention", 1);
  absl::StatusOr<int64_t> routers = flags->Int("routers", 1);
  absl::StatusOr<int64_t> experts = flags->Int("experts", 1);
  for (const absl::Status& s :
       {model.status(), attention.status(), routers.status(), experts.status()}) {
    if (!s.ok()) return Fail(s);
  }
  absl::StatusOr<MemoryPlan> plan = PlanMemory(
      *model,
      {static_cast<int>(*attention), static_cast<int>(*routers), static_cast<int>(*experts)});
  if (!plan.ok()) return Fail(plan.status());
  std::cout << FormatMemoryPlan(*plan);
  return 0;
}

}  // namespace k3
