#include "http_front/http_front.h"

#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cluster/metrics.h"
#include "cluster/node_runtime.h"
#include "cluster/security.h"
#include "cluster/trace_context.h"
#include "glog/logging.h"
#include "http_front/openai_protocol.h"
#include "http_front/stop_matcher.h"
#include "http_front/worker_pool.h"
#include "httplib.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

constexpr char kJson[] = "application/json";
// Connections served at once: each stream holds one thread while it waits for tokens.
constexpr size_t kServerThreads = 64;
constexpr absl::Duration kReadinessTimeout = absl::Seconds(1);
// Request bodies above this are refused (413): prompts are far smaller; memory is not.
constexpr size_t kMaxBodyBytes = 16 << 20;

absl::StatusOr<std::string> ReadApiKey(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot read --api-key-file ", path));
  std::stringstream contents;
  contents << file.rdbuf();
  std::string key(absl::StripAsciiWhitespace(contents.str()));
  if (key.empty())
    return absl::InvalidArgumentError(absl::StrCat("--api-key-file ", path, " is empty"));
  return key;
}

const char* FinishReasonOf(v1::Complete::FinishReason reason) {
  return reason == v1::Complete::LENGTH ? "length" : "stop";
}

}  // namespace

struct HttpFront::Impl {
  HttpFrontOptions options;
  std::string model_name;
  std::string api_key;  // empty: none required
  std::optional<Tokenizer> tokenizer;
  std::vector<int32_t> stop_ids;       // eos, for every request
  std::optional<int32_t> turn_end_id;  // chat: also the end of the assistant's turn
  std::unique_ptr<WorkerPool> pool;
  httplib::Server http;
  int port = -1;
  std::thread thread;
  absl::Notification done;
  std::atomic<bool> stopping{false};
  std::unique_ptr<NodeEndpoints> endpoints;
  MetricFamily<Counter>* responses = nullptr;
  Gauge* active = nullptr;  // generations in flight
  std::atomic<uint64_t> next_id{0};  // of responses, with the time: unique per process

  absl::Mutex mu;
  absl::flat_hash_set<GenerateCall*> calls ABSL_GUARDED_BY(mu);  // in flight, for Stop

  void Route();
  void Reply(httplib::Response& response, const absl::Status& error);
  void Complete(const httplib::Request& request, httplib::Response& response, Endpoint endpoint);
  absl::StatusOr<v1::GenerateRequest> ToGrpc(const CompletionRequest& request,
                                             Endpoint endpoint) const;
  absl::StatusOr<std::unique_ptr<GenerateCall>> StartCall(const v1::GenerateRequest& request,
                                                          const std::string& traceparent);
  void EndCall(GenerateCall* call);
};

// Turns a call's token stream into text pieces: decoding (never half a character), dropping the
// stop token's name, stop strings. One per request, on the thread that serves it.
class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<int32_t> stop_ids,
             std::vector<std::string> stops)
      : decoder_(tokenizer), stop_ids_(std::move(stop_ids)), matcher_(std::move(stops)) {}

  // Reads the next message; false once the generation ended (then finish_reason() is set).
  // Appends the text it releases to *text.
  bool Next(GenerateCall& call, std::string* text) {
    v1::GenerateResponse response;
    if (!call.Next(&response)) return false;
    if (response.has_complete()) {
      const v1::Complete& complete = response.complete();
      if (complete.finish_reason() == v1::Complete::CANCELLED ||
          complete.finish_reason() == v1::Complete::ERROR) {
        error_ = absl::UnavailableError(
            absl::StrCat("the generation ended early: ", complete.message()));
        return false;
      }
      text->append(matcher_.Push(decoder_.Finish()));
      text->append(matcher_.Finish());
      finish_reason_ = FinishReasonOf(complete.finish_reason());
      return false;
    }
    for (int32_t id : response.chunk().token_ids()) {
      ++generated_;
      if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) continue;
      absl::StatusOr<std::string> piece = decoder_.Push(id);
      text->append(matcher_.Push(piece.ok() ? *piece : std::string(kReplacementCharacter)));
    }
    if (matcher_.stopped()) {
      finish_reason_ = "stop";
      call.Cancel();  // the worker stops generating and frees the request's state
      return false;
    }
    return true;
  }

  // The error when the stream ended without a finish reason.
  absl::Status Error(GenerateCall& call) {
    if (!error_.ok()) return error_;
    absl::Status status = call.Finish();
    if (!status.ok()) return status;
    return absl::InternalError("the Generate stream ended without a Complete message");
  }

  const std::string& finish_reason() const { return finish_reason_; }
  int generated() const { return generated_; }

 private:
  StreamingDecoder decoder_;
  const std::vector<int32_t> stop_ids_;
  StopMatcher matcher_;
  std::string finish_reason_;  // empty until the generation ended normally
  absl::Status error_;
  int generated_ = 0;
};

void HttpFront::Impl::Reply(httplib::Response& response, const absl::Status& error) {
  response.status = HttpStatusOf(error);
  response.set_content(ErrorBody(error), kJson);
}

absl::StatusOr<v1::GenerateRequest> HttpFront::Impl::ToGrpc(const CompletionRequest& request,
                                                            Endpoint endpoint) const {
  if (!request.model.empty() && request.model != model_name) {
    return absl::NotFoundError(absl::StrCat(
        "model '", request.model, "' does not exist; this server serves '", model_name, "'"));
  }
  v1::GenerateRequest grpc_request;
  std::vector<int32_t> ids = request.prompt_ids;
  if (endpoint == Endpoint::kChatCompletions) {
    absl::StatusOr<std::vector<int32_t>> rendered =
        RenderChat(*tokenizer, request.messages, {.thinking = request.thinking});
    if (!rendered.ok()) return rendered.status();
    ids = *std::move(rendered);
  } else if (request.prompt_text.has_value()) {
    absl::StatusOr<std::vector<int32_t>> encoded = tokenizer->Encode(*request.prompt_text);
    if (!encoded.ok()) return encoded.status();
    ids = *std::move(encoded);
  }
  grpc_request.mutable_prompt_token_ids()->Add(ids.begin(), ids.end());
  v1::SamplingParams* sampling = grpc_request.mutable_sampling();
  if (request.max_tokens.has_value()) sampling->set_max_new_tokens(*request.max_tokens);
  if (request.temperature.has_value()) sampling->set_temperature(*request.temperature);
  if (request.top_p.has_value()) sampling->set_top_p(*request.top_p);
  if (request.seed.has_value()) sampling->set_seed(*request.seed);
  for (int32_t id : stop_ids) sampling->add_stop_token_ids(id);
  if (endpoint == Endpoint::kChatCompletions && turn_end_id.has_value()) {
    sampling->add_stop_token_ids(*turn_end_id);
  }
  return grpc_request;
}

absl::StatusOr<std::unique_ptr<GenerateCall>> HttpFront::Impl::StartCall(
    const v1::GenerateRequest& request, const std::string& traceparent) {
  absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool->Start(request, traceparent);
  if (!call.ok()) return call.status();
  absl::MutexLock lock(&mu);
  if (stopping) {
    (*call)->Cancel();
    return absl::UnavailableError("the server is shutting down");
  }
  calls.insert(call->get());
  active->Set(static_cast<double>(calls.size()));
  return call;
}

void HttpFront::Impl::EndCall(GenerateCall* call) {
  absl::MutexLock lock(&mu);
  calls.erase(call);
  active->Set(static_cast<double>(calls.size()));
}

void HttpFront::Impl::Complete(const httplib::Request& http_request, httplib::Response& response,
                               Endpoint endpoint) {
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(http_request.body, endpoint);
  if (!request.ok()) return Reply(response, request.status());
  absl::StatusOr<v1::GenerateRequest> grpc_request = ToGrpc(*request, endpoint);
  if (!grpc_request.ok()) return Reply(response, grpc_request.status());
  // A client's W3C trace context goes on to the attention worker (cluster/trace_context.h);
  // a malformed one starts no trace.
  const std::string traceparent = http_request.get_header_value(kTraceparentHeader);
  absl::StatusOr<std::unique_ptr<GenerateCall>> started = StartCall(
      *grpc_request, ParseTraceparent(traceparent).ok() ? traceparent : std::string());
  if (!started.ok()) return Reply(response, started.status());

  const bool chat = endpoint == Endpoint::kChatCompletions;
  ResponseHead head;
  head.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", absl::ToUnixMicros(absl::Now()), "-",
                         next_id.fetch_add(1));
  head.created = absl::ToUnixSeconds(absl::Now());
  head.model = model_name;
  head.endpoint = endpoint;
  std::vector<int32_t> stops = stop_ids;
  if (chat && turn_end_id.has_value()) stops.push_back(*turn_end_id);
  auto text_stream = std::make_shared<TextStream>(*tokenizer, std::move(stops), request->stop);
  std::shared_ptr<GenerateCall> call(started->release(), [this](GenerateCall* c) {
    EndCall(c);
    delete c;
  });
  const int prompt_tokens = grpc_request->prompt_token_ids_size();

  if (!request->stream) {
    std::string text;
    while (text_stream->Next(*call, &text)) {
    }
    if (text_stream->finish_reason().empty()) return Reply(response, text_stream->Error(*call));
    response.set_content(CompletionBody(head, text, text_stream->finish_reason(),
                                        {prompt_tokens, text_stream->generated()}),
                         kJson);
    return;
  }

  const bool include_usage = request->include_usage;
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream", [head, call, text_stream, prompt_tokens, include_usage](
                               size_t /*offset*/, httplib::DataSink& sink) {
        bool first = true;
        std::string text;
        bool more = true;
        while (more) {
          text.clear();
          more = text_stream->Next(*call, &text);
          if (!more && text_stream->finish_reason().empty()) break;  // an error: see below
          if (first || !text.empty()) {
            const std::string event = CompletionChunkEvent(head, text, first, "");
            if (!sink.write(event.data(), event.size())) {
              call->Cancel();  // the client is gone: the worker frees the request's state
              return false;
            }
            first = false;
          }
        }
        std::string tail;
        if (text_stream->finish_reason().empty()) {
          // The headers are sent: the error goes in the stream, as OpenAI's servers do.
          tail = absl::StrCat("data: ", ErrorBody(text_stream->Error(*call)), "\n\n");
        } else {
          tail = CompletionChunkEvent(head, "", false, text_stream->finish_reason());
          if (include_usage) {
            tail += UsageChunkEvent(head, {prompt_tokens, text_stream->generated()});
          }
        }
        tail += kDoneEvent;
        if (!sink.write(tail.data(), tail.size())) return false;
        sink.done();
        return true;
      });
}

void HttpFront::Impl::Route() {
  http.set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string authorization = request.get_header_value("Authorization");
        absl::string_view key = authorization;
        if (absl::ConsumePrefix(&key, "Bearer ") && ConstantTimeEquals(key, api_key)) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        Reply(response,
              absl::UnauthenticatedError(authorization.empty()
                                             ? "missing API key: send 'Authorization: Bearer <key>'"
                                             : "incorrect API key"));
        return httplib::Server::HandlerResponse::Handled;
      });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(ModelsBody(model_name), kJson);
  });
  http.Post("/v1/completions",
            [this](const httplib::Request& request, httplib::Response& response) {
              Complete(request, response, Endpoint::kCompletions);
            });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& request, httplib::Response& response) {
              Complete(request, response, Endpoint::kChatCompletions);
            });
  // Unknown routes (httplib leaves them 404 without a body) and errors get OpenAI's shape.
  http.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;  // already an OpenAI error
    const absl::Status error =
        response.status == 404
            ? absl::NotFoundError(absl::StrCat("no route ", request.method, " ", request.path))
            : absl::Status(response.status < 500 ? absl::StatusCode::kInvalidArgument
                                                 : absl::StatusCode::kInternal,
                           absl::StrCat("HTTP ", response.status));
    const int status = response.status;
    Reply(response, error);
    response.status = status;
  });
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
        Reply(response, absl::InternalError("internal error"));
      });
}

HttpFront::HttpFront(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpFront::~HttpFront() { Stop(); }

int HttpFront::port() const { return impl_->port; }

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("--server is required");
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port ", options.port, " out of range"));
  }
  auto impl = std::make_unique<Impl>();
  Impl& f = *impl;
  f.options = options;
  f.model_name = options.served_model_name;
  if (f.model_name.empty()) {
    f.model_name = std::filesystem::path(options.model).lexically_normal().filename().string();
    if (f.model_name.empty()) {  // "dir/" normalises to a trailing empty name
      f.model_name =
          std::filesystem::path(options.model).lexically_normal().parent_path().filename();
    }
  }
  if (!options.api_key_file.empty()) {
    absl::StatusOr<std::string> key = ReadApiKey(options.api_key_file);
    if (!key.ok()) return key.status();
    f.api_key = *std::move(key);
  }
  std::string worker_token;
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile("--auth-token-file", options.auth_token_file);
    if (!token.ok()) return token.status();
    worker_token = *std::move(token);
    if (f.api_key.empty()) f.api_key = worker_token;  // the clients send the same token
  }
  absl::StatusOr<ClientTls> tls = LoadClientTls(options.tls);
  if (!tls.ok()) return tls.status();
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(options.model);
  if (!tokenizer.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the HTTP front needs the model's tokenizer in ", options.model, ": ",
                     tokenizer.status().message()));
  }
  f.tokenizer = *std::move(tokenizer);
  if (f.tokenizer->named_ids().eos.has_value()) f.stop_ids.push_back(*f.tokenizer->named_ids().eos);
  if (absl::StatusOr<int32_t> turn_end = TurnEndId(*f.tokenizer); turn_end.ok()) {
    f.turn_end_id = *turn_end;
  }
  f.pool = std::make_unique<WorkerPool>(options.servers, *tls, std::move(worker_token));

  MetricFamily<Counter>& responses = DefaultMetrics().AddCounter(
      "k3_http_responses_total", "HTTP responses of the OpenAI front, by status.", {"status"});
  f.responses = &responses;
  f.active = DefaultMetrics()
                 .AddGauge("k3_http_active_requests", "Generations the HTTP front has in flight.")
                 .Get();
  f.http.new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  // SO_REUSEADDR only (see cluster/metrics.cc): a taken port must be reported, not shared.
  f.http.set_socket_options([](int fd) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  f.http.set_logger([&responses](const httplib::Request&, const httplib::Response& response) {
    responses.WithLabels({absl::StrCat(response.status)})->Increment();
  });
  f.http.set_payload_max_length(kMaxBodyBytes);
  f.Route();
  f.port = options.port == 0
               ? f.http.bind_to_any_port(options.host)
               : (f.http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (f.port < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options.host, ":", options.port));
  }
  f.thread = std::thread([&f] {
    if (!f.http.listen_after_bind()) LOG(ERROR) << "the HTTP front stopped serving";
    f.done.Notify();
  });
  // httplib's stop() only acts once the accept loop runs, so Stop could otherwise miss it.
  while (!f.http.is_running()) {
    if (f.done.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
      return absl::InternalError("the HTTP server did not start");
    }
  }

  NodeEndpointsOptions endpoint_options;
  endpoint_options.flags.host = options.host;
  endpoint_options.flags.port = options.grpc_port;
  endpoint_options.flags.metrics_port = options.metrics_port;
  endpoint_options.flags.tls = options.tls;
  WorkerPool* pool = f.pool.get();
  endpoint_options.readiness = [pool] { return pool->Ping(kReadinessTimeout); };
  absl::StatusOr<std::unique_ptr<NodeEndpoints>> endpoints =
      NodeEndpoints::Start(std::move(endpoint_options));
  if (!endpoints.ok()) return endpoints.status();
  f.endpoints = *std::move(endpoints);
  f.endpoints->SetReady(true);
  return std::unique_ptr<HttpFront>(new HttpFront(std::move(impl)));
}

void HttpFront::Stop() {
  Impl& f = *impl_;
  if (f.stopping.exchange(true)) return;
  {
    absl::MutexLock lock(&f.mu);
    for (GenerateCall* call : f.calls) call->Cancel();
  }
  f.http.stop();
  if (f.thread.joinable()) f.thread.join();
  if (f.endpoints) f.endpoints->Stop();
}

void AddHttpFrontFlags(CLI::App* app, HttpFrontOptions* options) {
  app->add_option("--server", options->servers,
                  "attention workers' gRPC addresses, HOST:PORT[,HOST:PORT...]")
      ->required()
      ->delimiter(',');
  app->add_option("--model", options->model, "model folder with tiktoken.model")->required();
  app->add_option("--host", options->host, "listen address")->capture_default_str();
  AddBoundedInt(app, "--port", &options->port, 0, 65535, "HTTP port (0 picks a free one)");
  AddBoundedInt(app, "--metrics-port", &options->metrics_port, -1, 65535,
                "HTTP /metrics and /healthz port (-1: none, 0 picks a free one)");
  AddBoundedInt(app, "--grpc-port", &options->grpc_port, 0, 65535,
                "gRPC health port (liveness; 0 picks a free one)");
  app->add_option("--api-key-file", options->api_key_file,
                  "file holding the API key clients must send as a bearer token");
  app->add_option("--served-model-name", options->served_model_name,
                  "the model's name in the API (default: the model folder's name)");
  app->add_option("--auth-token-file", options->auth_token_file,
                  "file holding the attention workers' bearer token: sent to them, and required "
                  "from this front's clients unless --api-key-file is given");
  AddTlsFlags(app, &options->tls);
}

namespace {

class HttpFrontRole final : public RoleHooks {
 public:
  explicit HttpFrontRole(HttpFrontOptions options) : options_(std::move(options)) {}
  absl::Status Start() override {
    absl::StatusOr<std::unique_ptr<HttpFront>> front = HttpFront::Start(options_);
    if (!front.ok()) return front.status();
    front_ = *std::move(front);
    // Launchers and people read the address from this line.
    std::cout << "http address: " << options_.host << ":" << front_->port() << std::endl;
    return absl::OkStatus();
  }
  void Shutdown() override {
    if (front_) front_->Stop();
  }

 private:
  const HttpFrontOptions options_;
  std::unique_ptr<HttpFront> front_;
};

}  // namespace

int RunHttpFront(const HttpFrontOptions& options) {
  return RunNode("http front", std::make_unique<HttpFrontRole>(options));
}

}  // namespace k3
