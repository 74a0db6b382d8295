#include "tools/chat_command.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "cluster/command_line.h"
#include "cluster/grpc_status.h"
#include "cluster/security.h"
#include "engine/process_engine.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "proto/generate.grpc.pb.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

// Generates the answer to `messages`, passing its text to `show` as it arrives; the whole answer.
using Answerer = std::function<absl::StatusOr<std::string>(
    const std::vector<ChatMessage>& messages, const std::function<void(const std::string&)>& show)>;

absl::StatusOr<Answerer> InProcess(const ChatCommandOptions& o) {
  K3_ASSIGN_OR_RETURN(Tokenizer loaded, Tokenizer::Load(o.model));
  auto tokenizer = std::make_shared<const Tokenizer>(std::move(loaded));
  K3_ASSIGN_OR_RETURN(int32_t turn_end, TurnEndId(*tokenizer));
  // The scheduler's prefix cache (on by default) holds the conversation so far: each turn
  // prefills only what is new.
  SchedulerOptions scheduler;
  scheduler.max_new_tokens_limit = o.max_new_tokens;
  scheduler.max_prompt_tokens = INT32_MAX;
  K3_ASSIGN_OR_RETURN(std::unique_ptr<ProcessEngine> opened,
                      ProcessEngine::Open(o.model, ComputeDevice(), scheduler));
  std::shared_ptr<ProcessEngine> engine = std::move(opened);
  GenerationRequest base;
  base.max_new_tokens = o.max_new_tokens;
  base.sampling.temperature = static_cast<float>(o.temperature);
  base.sampling.seed = o.seed;
  base.stop_token_ids.push_back(turn_end);
  if (tokenizer->named_ids().eos.has_value()) {
    base.stop_token_ids.push_back(*tokenizer->named_ids().eos);
  }
  const bool thinking = o.thinking;
  return Answerer(
      [tokenizer, engine, base, thinking](
          const std::vector<ChatMessage>& messages,
          const std::function<void(const std::string&)>& show) -> absl::StatusOr<std::string> {
        GenerationRequest request = base;
        K3_ASSIGN_OR_RETURN(request.prompt,
                            RenderChat(*tokenizer, messages, {.thinking = thinking}));
        StreamingDecoder decoder(*tokenizer);
        std::string answer;
        const std::vector<int32_t> stops = base.stop_token_ids;
        // On the scheduler thread, while this one waits in Generate.
        auto on_token = [&](int32_t id) {
          if (std::find(stops.begin(), stops.end(), id) != stops.end()) return;
          absl::StatusOr<std::string> piece = decoder.Push(id);
          const std::string text = piece.ok() ? *piece : kReplacementCharacter;
          answer += text;
          show(text);
        };
        K3_RETURN_IF_ERROR(engine->Generate(std::move(request), on_token).status());
        const std::string tail = decoder.Finish();
        show(tail);
        return answer + tail;
      });
}

absl::StatusOr<Answerer> ThroughServer(const ChatCommandOptions& o) {
  K3_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(o.tls));
  std::string token;
  if (!o.auth_token_file.empty()) {
    K3_ASSIGN_OR_RETURN(std::string read, ReadTokenFile("--auth-token-file", o.auth_token_file));
    token = std::move(read);
  }
  std::shared_ptr<v1::K3Serve::Stub> stub = v1::K3Serve::NewStub(tls.Connect(o.server));
  v1::GenerateRequest base;
  base.set_thinking(o.thinking);
  base.mutable_sampling()->set_max_new_tokens(o.max_new_tokens);
  base.mutable_sampling()->set_temperature(static_cast<float>(o.temperature));
  base.mutable_sampling()->set_seed(o.seed);
  return [stub, base, token](
             const std::vector<ChatMessage>& messages,
             const std::function<void(const std::string&)>& show) -> absl::StatusOr<std::string> {
    v1::GenerateRequest request = base;
    for (const ChatMessage& m : messages) {
      v1::ChatMessage* message = request.add_messages();
      message->set_role(m.role);
      message->set_content(m.content);
    }
    grpc::ClientContext context;
    AddBearer(token, &context);
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub->Generate(&context, request);
    std::string answer;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      const std::string& text =
          response.has_chunk() ? response.chunk().text() : response.complete().text();
      answer += text;
      show(text);
      if (response.has_complete() &&
          (response.complete().finish_reason() == v1::Complete::ERROR ||
           response.complete().finish_reason() == v1::Complete::CANCELLED)) {
        reader->Finish();
        return absl::UnavailableError(response.complete().message());
      }
    }
    K3_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    return answer;
  };
}

}  // namespace

void AddChatFlags(CLI::App* app, ChatCommandOptions* options) {
  CLI::Option* model = app->add_option("--model", options->model,
                                       "checkpoint folder with its tokenizer (in process)");
  CLI::Option* server =
      app->add_option("--server", options->server, "HOST:PORT of an attention worker");
  model->excludes(server);
  AddBoundedInt(app, "--max-new-tokens", &options->max_new_tokens, 1, 1 << 24,
                "the longest answer, in tokens");
  app->add_option("--temperature", options->temperature, "0 is greedy")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  app->add_option("--seed", options->seed, "sampling seed")->capture_default_str();
  app->add_flag("--thinking", options->thinking, "K3: answers open with a think block");
  app->add_option("--system", options->system, "a system message opening the chat");
  AddClientSecurityFlags(app, server, &options->tls, &options->auth_token_file);
  app->final_callback([options] {
    if (options->model.empty() && options->server.empty()) {
      throw CLI::ValidationError("give --model DIR or --server HOST:PORT");
    }
  });
}

int ChatCommand(const ChatCommandOptions& options) {
  absl::StatusOr<Answerer> answerer =
      options.server.empty() ? InProcess(options) : ThroughServer(options);
  if (!answerer.ok()) return ReportError("chat", answerer.status());
  std::vector<ChatMessage> messages;
  if (!options.system.empty()) messages.push_back({.role = "system", .content = options.system});
  std::cerr << "k3serve chat: one message per line; /exit or end of input quits\n";
  std::string line;
  while (std::cerr << "> " << std::flush, std::getline(std::cin, line)) {
    if (line == "/exit") break;
    if (line.empty()) continue;
    messages.push_back({.role = "user", .content = line});
    absl::StatusOr<std::string> answer =
        (*answerer)(messages, [](const std::string& text) { std::cout << text << std::flush; });
    std::cout << std::endl;
    if (!answer.ok()) {
      std::cerr << "k3serve chat: " << answer.status() << "\n";
      messages.pop_back();  // the question stays unanswered; the user may ask again
      continue;
    }
    messages.push_back({.role = "assistant", .content = *answer});
  }
  return 0;
}

Subcommand AddChatCommand(CLI::App* top) {
  return AddSubcommand(top, "chat", "an interactive chat in process or through a server",
                       AddChatFlags, ChatCommand);
}

}  // namespace k3
