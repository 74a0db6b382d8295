#include "http_front/http_front.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "cluster/metrics.h"
#include "cluster/node_runtime.h"
#include "cluster/security.h"
#include "base/trace_context.h"
#include "glog/logging.h"
#include "http_front/client_connection.h"
#include "http_front/grpc_proxy.h"
#include "http_front/connection_queue.h"
#include "http_front/openai_protocol.h"
#include "http_front/output_constraint.h"
#include "http_front/text_stream.h"
#include "http_front/worker_pool.h"
#include "httplib.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

constexpr char kJson[] = "application/json";
constexpr absl::Duration kReadinessTimeout = absl::Seconds(1);
// /readyz on the API port answers within 100 ms, a worker that takes longer counting as not ready.
constexpr absl::Duration kProbeTimeout = absl::Milliseconds(80);
// A connection's thread ends after this long without a connection to serve.
constexpr absl::Duration kIdleThreadTimeout = absl::Seconds(10);
// What a client shed past --max-connections is told to wait before it tries again.
constexpr char kRetryAfterSeconds[] = "1";

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

}  // namespace

struct HttpFront::Impl {
  HttpFrontOptions options;
  std::string model_name;
  std::string api_key;  // empty: none required
  std::optional<Tokenizer> tokenizer;
  std::vector<int32_t> stop_ids;       // eos, for every request
  std::optional<int32_t> turn_end_id;  // chat: also the end of the assistant's turn
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<K3ServeProxy> proxy;  // served on the gRPC port; outlives its server
  std::unique_ptr<httplib::Server> http;  // an httplib::SSLServer with --tls-cert
  int listen_fd = -1;                     // http's listening socket
  int port = -1;
  std::thread thread;
  absl::Notification done;
  std::atomic<bool> stopping{false};
  std::unique_ptr<NodeEndpoints> endpoints;
  MetricFamily<Counter>* responses = nullptr;
  Counter* shed = nullptr;  // connections answered 503 past --max-connections
  Gauge* active = nullptr;  // generations in flight
  MetricFamily<Histogram>* latency = nullptr;  // by endpoint: body read to last byte
  MetricFamily<Histogram>* first_token = nullptr;  // by endpoint: body read to the first text
  std::atomic<uint64_t> next_id{0};  // of responses, with the time: unique per process

  absl::Mutex mu;
  absl::flat_hash_set<GenerateCall*> calls ABSL_GUARDED_BY(mu);  // in flight, for Stop
  int max_tokens_limit ABSL_GUARDED_BY(mu) = 0;  // MaxTokensLimit's answer; 0: not known yet

  // Makes the server (HTTPS with --tls-cert), binds, listens and starts the accept loop.
  absl::Status Serve();
  void Route();
  void Reply(httplib::Response& response, const absl::Status& error);
  // The pre-routing check of a request without a body: shedding and the API key.
  bool Admit(const httplib::Request& request, httplib::Response& response);
  // Checks the API key; false after replying 401.
  bool Authorized(const httplib::Request& request, httplib::Response& response);
  // Answers 503 with Retry-After (true) on a connection past --max-connections.
  bool Shed(httplib::Response& response);
  // Reads a POST body through `reader` (so that no content type gets httplib's own limits);
  // false after replying 413 (over max_body_bytes), 400, or 503 (Shed).
  bool ReadBody(const httplib::ContentReader& reader, httplib::Response& response,
                std::string* body);
  struct Generation;
  // What the response needs of the request.
  struct RequestShape {
    int prompt_tokens = 0;
    bool logprobs = false;
    bool include_usage = false;
  };
  // The request's latency metrics: from its body read to the first token, and to the end.
  struct Timing {
    absl::Time start;
    Histogram* latency;
    Histogram* first_token;
    // Shared by the copies the stream's callback holds.
    std::shared_ptr<std::atomic<bool>> first_seen = std::make_shared<std::atomic<bool>>(false);

    void TokenArrived(int generated) const {
      if (generated > 0 && !first_seen->exchange(true)) {
        first_token->Observe(absl::ToDoubleSeconds(absl::Now() - start));
      }
    }
    void Done() const { latency->Observe(absl::ToDoubleSeconds(absl::Now() - start)); }
  };
  void Complete(const httplib::Request& request, const std::string& body,
                httplib::Response& response, Endpoint endpoint);
  // Starts the request's n calls.
  absl::StatusOr<std::vector<Generation>> StartChoices(const CompletionRequest& request,
                                                       v1::GenerateRequest grpc_request,
                                                       Endpoint endpoint,
                                                       const std::string& traceparent);
  // A non-streamed answer; cancelled when the client goes away (ClientConnection).
  void CompleteWhole(const httplib::Request& http_request, const ResponseHead& head,
                     std::vector<Generation>& choices, const RequestShape& shape,
                     const Timing& timing, httplib::Response& response);
  // Server-sent events; cancelled when a write fails.
  void Stream(const ResponseHead& head, std::vector<Generation> choices,
              const RequestShape& shape, const Timing& timing, httplib::Response& response);
  // `max_tokens_limit`: the workers' limit (0: not known yet).
  absl::StatusOr<v1::GenerateRequest> ToGrpc(const CompletionRequest& request, Endpoint endpoint,
                                             int max_tokens_limit) const;
  // The workers' max_new_tokens_limit (ModelInfo), asked once a worker answers; 0 until then.
  // One limit for every path: the front checks max_tokens against it, naming the client's own
  // parameter, before any worker would refuse the request in its own words.
  int MaxTokensLimit();
  absl::StatusOr<std::unique_ptr<GenerateCall>> StartCall(const v1::GenerateRequest& request,
                                                          const std::string& traceparent);
  void EndCall(GenerateCall* call);
};

void HttpFront::Impl::Reply(httplib::Response& response, const absl::Status& error) {
  response.status = HttpStatusOf(error);
  response.set_content(ErrorBody(error), kJson);
}

int HttpFront::Impl::MaxTokensLimit() {
  {
    absl::MutexLock lock(&mu);
    if (max_tokens_limit > 0) return max_tokens_limit;
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kReadinessTimeout));
  pool->AddAuth(&context);
  v1::ModelInfo info;
  if (!pool->stub(0)->GetModelInfo(&context, {}, &info).ok()) return 0;
  absl::MutexLock lock(&mu);
  max_tokens_limit = info.max_new_tokens_limit();
  return max_tokens_limit;
}

absl::StatusOr<v1::GenerateRequest> HttpFront::Impl::ToGrpc(const CompletionRequest& request,
                                                            Endpoint endpoint,
                                                            int max_tokens_limit) const {
  if (!request.model.empty() && request.model != model_name) {
    return absl::NotFoundError(absl::StrCat(
        "model '", request.model, "' does not exist; this server serves '", model_name, "'"));
  }
  v1::GenerateRequest grpc_request;
  std::vector<int32_t> ids = request.prompt_ids;
  if (endpoint == Endpoint::kChatCompletions) {
    K3_ASSIGN_OR_RETURN(std::vector<int32_t> rendered,
                        RenderChat(*tokenizer, request.messages, request.chat));
    ids = std::move(rendered);
  } else if (request.prompt_text.has_value()) {
    K3_ASSIGN_OR_RETURN(std::vector<int32_t> encoded, tokenizer->Encode(*request.prompt_text));
    ids = std::move(encoded);
  }
  grpc_request.mutable_prompt_token_ids()->Add(ids.begin(), ids.end());
  v1::SamplingParams* sampling = grpc_request.mutable_sampling();
  // Unset fields take the server's defaults (OpenAI's unless flags say otherwise): max_new_tokens
  // 0 asks the worker for as many as it allows.
  const int max_tokens = request.max_tokens.value_or(options.default_max_tokens);
  sampling->set_max_new_tokens(max_tokens);
  if (max_tokens_limit > 0 && max_tokens > max_tokens_limit) {
    return ParamError(request.max_tokens.has_value() ? request.max_tokens_param : "max_tokens",
                      absl::StrCat("'", request.max_tokens_param, "' is ", max_tokens,
                                   "; this server generates at most ", max_tokens_limit,
                                   " tokens per request"));
  }
  sampling->set_temperature(request.temperature.value_or(options.default_temperature));
  if (request.top_logprobs.has_value()) sampling->set_top_logprobs(*request.top_logprobs);
  if (request.top_p.has_value()) sampling->set_top_p(*request.top_p);
  if (request.seed.has_value()) sampling->set_seed(*request.seed);
  for (int32_t id : stop_ids) sampling->add_stop_token_ids(id);
  if (endpoint == Endpoint::kChatCompletions && turn_end_id.has_value()) {
    sampling->add_stop_token_ids(*turn_end_id);
    K3_ASSIGN_OR_RETURN(std::optional<v1::OutputConstraint> constraint,
                        OutputConstraintOf(request, *tokenizer,
                                           max_tokens > 0 ? max_tokens : max_tokens_limit));
    if (constraint.has_value()) *sampling->mutable_constraint() = *std::move(constraint);
  }
  return grpc_request;
}

absl::StatusOr<std::unique_ptr<GenerateCall>> HttpFront::Impl::StartCall(
    const v1::GenerateRequest& request, const std::string& traceparent) {
  K3_ASSIGN_OR_RETURN(std::unique_ptr<GenerateCall> call, pool->Start(request, traceparent));
  absl::MutexLock lock(&mu);
  if (stopping) {
    call->Cancel();
    return absl::UnavailableError("the server is shutting down");
  }
  calls.insert(call.get());
  active->Set(static_cast<double>(calls.size()));
  return call;
}

void HttpFront::Impl::EndCall(GenerateCall* call) {
  absl::MutexLock lock(&mu);
  calls.erase(call);
  active->Set(static_cast<double>(calls.size()));
}

// One choice's call and text (n > 1 gives several).
struct HttpFront::Impl::Generation {
  std::shared_ptr<GenerateCall> call;
  std::shared_ptr<TextStream> text;
};

absl::StatusOr<std::vector<HttpFront::Impl::Generation>> HttpFront::Impl::StartChoices(
    const CompletionRequest& request, v1::GenerateRequest grpc_request, Endpoint endpoint,
    const std::string& traceparent) {
  TextStreamOptions text_options{.stop_ids = stop_ids,
                                 .stops = request.stop,
                                 .skip_special_tokens = request.skip_special_tokens};
  if (endpoint == Endpoint::kChatCompletions && turn_end_id.has_value()) {
    text_options.stop_ids.push_back(*turn_end_id);
    if (absl::StatusOr<ChatFormat> format = ChatFormatOf(*tokenizer); format.ok()) {
      text_options.chat_format = *format;
    }
    text_options.thinking = request.chat.thinking;
  }
  std::vector<Generation> choices;
  for (int i = 0; i < request.n; ++i) {
    // Choices differ by their seeds: the request's plus the index, or the worker's random ones.
    if (request.seed.has_value()) grpc_request.mutable_sampling()->set_seed(*request.seed + i);
    absl::StatusOr<std::unique_ptr<GenerateCall>> started = StartCall(grpc_request, traceparent);
    if (!started.ok()) return started.status();  // the started ones are cancelled as they go
    text_options.call_id_prefix = 
        absl::StrCat("call_", absl::ToUnixMicros(absl::Now()), "_", next_id.fetch_add(1), "_");
    choices.push_back({std::shared_ptr<GenerateCall>(started->release(),
                                                     [this](GenerateCall* call) {
                                                       EndCall(call);
                                                       delete call;
                                                     }),
                       std::make_shared<TextStream>(*tokenizer, text_options)});
  }
  return choices;
}

void HttpFront::Impl::Complete(const httplib::Request& http_request, const std::string& body,
                               httplib::Response& response, Endpoint endpoint) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(body, endpoint);
  if (!request.ok()) return Reply(response, request.status());
  absl::StatusOr<v1::GenerateRequest> grpc_request =
      ToGrpc(*request, endpoint, MaxTokensLimit());
  if (!grpc_request.ok()) return Reply(response, grpc_request.status());
  // A client's W3C trace context goes on to the attention worker (base/trace_context.h);
  // a malformed one starts no trace.
  const std::string traceparent = http_request.get_header_value(kTraceparentHeader);
  absl::StatusOr<std::vector<Generation>> choices =
      StartChoices(*request, *grpc_request, endpoint,
                   ParseTraceparent(traceparent).ok() ? traceparent : std::string());
  if (!choices.ok()) return Reply(response, choices.status());

  const bool chat = endpoint == Endpoint::kChatCompletions;
  ResponseHead head;
  head.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", absl::ToUnixMicros(absl::Now()), "-",
                         next_id.fetch_add(1));
  head.created = absl::ToUnixSeconds(absl::Now());
  head.model = model_name;
  head.endpoint = endpoint;
  const std::string label = chat ? "chat" : "completions";
  Timing timing{start, latency->WithLabels({label}), first_token->WithLabels({label})};
  const RequestShape shape{grpc_request->prompt_token_ids_size(),
                           request->top_logprobs.has_value(), request->include_usage};
  if (request->stream) {
    Stream(head, *std::move(choices), shape, timing, response);
  } else {
    CompleteWhole(http_request, head, *choices, shape, timing, response);
  }
}

void HttpFront::Impl::CompleteWhole(const httplib::Request& http_request,
                                    const ResponseHead& head, std::vector<Generation>& choices,
                                    const RequestShape& shape, const Timing& timing,
                                    httplib::Response& response) {
  const ClientConnection client(http_request);
  std::vector<Choice> out(choices.size());
  Usage usage{shape.prompt_tokens, 0};
  for (size_t i = 0; i < choices.size(); ++i) {
    Generation& choice = choices[i];
    out[i].index = static_cast<int>(i);
    if (shape.logprobs) out[i].logprobs.emplace();
    while (choice.text->Next(*choice.call, &out[i])) {
      timing.TokenArrived(choice.text->generated());
      if (client.Gone()) {
        // Nobody will read the answer: the workers stop generating and free the requests.
        for (Generation& c : choices) c.call->Cancel();
        return Reply(response, absl::CancelledError("the client closed the connection"));
      }
    }
    if (choice.text->finish_reason().empty()) {
      return Reply(response, choice.text->Error(*choice.call));
    }
    out[i].finish_reason = choice.text->finish_reason();
    usage.completion_tokens += choice.text->generated();
  }
  response.set_content(CompletionBody(head, out, usage), kJson);
  timing.Done();
}

void HttpFront::Impl::Stream(const ResponseHead& head, std::vector<Generation> choices,
                             const RequestShape& shape, const Timing& timing,
                             httplib::Response& response) {
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream", [head, choices, shape, timing](size_t /*offset*/,
                                                          httplib::DataSink& sink) {
        auto cancel_all = [&] {
          for (const Generation& c : choices) c.call->Cancel();
        };
        // The choices take turns, a message each: the workers generate them all at once.
        std::vector<bool> started(choices.size(), false), ended(choices.size(), false);
        Usage usage{shape.prompt_tokens, 0};
        for (size_t left = choices.size(); left > 0;) {
          for (size_t i = 0; i < choices.size(); ++i) {
            if (ended[i]) continue;
            const Generation& choice = choices[i];
            Choice piece{.index = static_cast<int>(i)};
            if (shape.logprobs) piece.logprobs.emplace();
            const bool more = choice.text->Next(*choice.call, &piece);
            timing.TokenArrived(choice.text->generated());
            std::string events;
            if (!more && choice.text->finish_reason().empty()) {
              // The headers are sent: the error goes in the stream, as OpenAI's servers do.
              cancel_all();
              events = absl::StrCat("data: ", ErrorBody(choice.text->Error(*choice.call)),
                                    "\n\n", kDoneEvent);
              sink.write(events.data(), events.size());
              sink.done();
              return true;
            }
            if (!started[i] || HasDelta(piece)) {
              events = CompletionChunkEvent(head, piece, !started[i]);
              started[i] = true;
            }
            if (!more) {
              ended[i] = true;
              --left;
              usage.completion_tokens += choice.text->generated();
              events += CompletionChunkEvent(
                  head, {.index = piece.index, .finish_reason = choice.text->finish_reason()},
                  false);
            }
            if (!events.empty() && !sink.write(events.data(), events.size())) {
              cancel_all();  // the client is gone: the workers free the requests' state
              return false;
            }
          }
        }
        std::string tail = shape.include_usage ? UsageChunkEvent(head, usage) : "";
        tail += kDoneEvent;
        if (!sink.write(tail.data(), tail.size())) return false;
        sink.done();
        timing.Done();
        return true;
      });
}

bool HttpFront::Impl::Shed(httplib::Response& response) {
  if (!ConnectionQueue::Shedding()) return false;
  Reply(response, absl::UnavailableError(
                      "the server has as many connections as it serves at once; retry later"));
  response.set_header("Retry-After", kRetryAfterSeconds);
  response.set_header("Connection", "close");
  return true;
}

bool HttpFront::Impl::Admit(const httplib::Request& request, httplib::Response& response) {
  // Probes need no key (as on the metrics port).
  if (request.method == "GET" && (request.path == "/healthz" || request.path == "/readyz")) {
    return true;
  }
  const bool chunked = request.has_header("Transfer-Encoding");
  const uint64_t length = request.get_header_value<uint64_t>("Content-Length");
  // A POST, PUT or PATCH says how long its body is, or httplib would read until the connection's
  // read timeout (5 s) to find out: without a length it is answered at once, and the connection
  // closed. (A length over the limit is read away before its 413, so that a client sending that
  // much gets the answer rather than a reset; a false one waits for the read timeout.)
  const bool wants_body =
      request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  if (wants_body && !chunked && !request.has_header("Content-Length")) {
    Reply(response, absl::InvalidArgumentError(absl::StrCat(
                        request.method, " needs a body with a Content-Length (or chunked "
                        "Transfer-Encoding): the request body is missing")));
    response.status = 411;
    response.set_header("Connection", "close");
    return false;
  }
  // A request with a body is shed and authenticated once its body is read (the POST handlers):
  // an answer that leaves the body unread breaks the connection (its bytes would be read as the
  // next request; closing instead would reset it before the client reads the answer).
  if (chunked || length > 0) return true;
  return !Shed(response) && Authorized(request, response);
}

bool HttpFront::Impl::Authorized(const httplib::Request& request, httplib::Response& response) {
  if (api_key.empty()) return true;
  // RFC 6750: the scheme is case-insensitive; the token is not.
  const std::string authorization = request.get_header_value("Authorization");
  absl::string_view key = absl::StripLeadingAsciiWhitespace(authorization);
  if (absl::StartsWithIgnoreCase(key, "Bearer ")) {
    key.remove_prefix(7);
    if (ConstantTimeEquals(absl::StripAsciiWhitespace(key), api_key)) return true;
  }
  const bool missing = !request.has_header("Authorization");
  Reply(response, absl::UnauthenticatedError(
                      missing ? "missing API key: send 'Authorization: Bearer <key>'"
                              : "incorrect API key"));
  response.set_header("WWW-Authenticate",
                      missing ? "Bearer realm=\"k3serve\""
                              : "Bearer realm=\"k3serve\", error=\"invalid_token\"");
  return false;
}

bool HttpFront::Impl::ReadBody(const httplib::ContentReader& reader, httplib::Response& response,
                               std::string* body) {
  // A body over the limit with a Content-Length never reaches the receiver: httplib reads it
  // away and sets 413. A chunked one is read to its end and dropped here, so that the client
  // gets the 413 rather than a reset.
  bool too_large = false;
  const bool read = reader([&](const char* data, size_t size) {
    too_large |= body->size() + size > static_cast<size_t>(options.max_body_bytes);
    if (!too_large) body->append(data, size);
    return true;
  });
  if (too_large || response.status == 413) {
    Reply(response, absl::InvalidArgumentError(absl::StrCat(
                        "the request body is larger than ", options.max_body_bytes, " bytes")));
    response.status = 413;
    return false;
  }
  if (!read) {
    Reply(response, absl::InvalidArgumentError("the request body could not be read"));
    response.set_header("Connection", "close");
    return false;
  }
  return !Shed(response);
}

void HttpFront::Impl::Route() {
  http->set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        return Admit(request, response) ? httplib::Server::HandlerResponse::Unhandled
                                        : httplib::Server::HandlerResponse::Handled;
      });
  // The metrics port's probe on the API port too, as /healthz and /readyz (a load balancer may
  // see only this port): 200 while some attention worker is ready, else 503 with why.
  for (const char* probe : {"/healthz", "/readyz"}) {
    http->Get(probe, [this](const httplib::Request&, httplib::Response& response) {
      const absl::Status ready =
          stopping ? absl::UnavailableError("shutting down") : pool->Ping(kProbeTimeout);
      response.status = ready.ok() ? 200 : 503;
      response.set_content(ready.ok() ? "ok\n" : absl::StrCat(ready.message(), "\n"),
                           "text/plain");
    });
  }
  http->Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(ModelsBody(model_name), kJson);
  });
  http->Get("/v1/models/(.+)", [this](const httplib::Request& request,
                                      httplib::Response& response) {
    if (request.matches[1] != model_name) {
      return Reply(response, absl::NotFoundError(absl::StrCat(
                                 "model '", request.matches[1].str(),
                                 "' does not exist; this server serves '", model_name, "'")));
    }
    response.set_content(ModelBody(model_name), kJson);
  });
  for (const Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const char* path =
        endpoint == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
    // With a body (the content reader bypasses httplib's 8 KB limit on form-encoded bodies:
    // curl -d sends JSON as application/x-www-form-urlencoded), and without one (a 400).
    http->Post(path, [this, endpoint](const httplib::Request& request,
                                      httplib::Response& response,
                                      const httplib::ContentReader& reader) {
      std::string body;
      if (ReadBody(reader, response, &body) && Authorized(request, response)) {
        Complete(request, body, response, endpoint);
      }
    });
    http->Post(path, [this, endpoint](const httplib::Request& request,
                                      httplib::Response& response) {
      Complete(request, request.body, response, endpoint);
    });
  }
  // Unknown routes (httplib leaves them 404 without a body) and errors get OpenAI's shape.
  http->set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
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
  http->set_exception_handler(
      [this](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
        Reply(response, absl::InternalError("internal error"));
      });
}

// Every connection holds a descriptor: the soft limit (often 1024) must leave room for
// --max-connections of them besides the gRPC channels and files.
void RaiseOpenFileLimit(int max_connections) {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = std::min<rlim_t>(limit.rlim_max, max_connections + 1024);
  if (limit.rlim_cur >= wanted) return;
  limit.rlim_cur = wanted;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) PLOG(WARNING) << "cannot raise RLIMIT_NOFILE";
}

absl::Status HttpFront::Impl::Serve() {
  const TlsFlags& tls = options.tls;
  if (!tls.cert.empty() || !tls.key.empty()) {
    if (tls.cert.empty() || tls.key.empty()) {
      return absl::InvalidArgumentError("HTTPS needs both --tls-cert and --tls-key");
    }
    // No client certificates: the API's clients authenticate with their bearer key.
    auto server = std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str());
    if (!server->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot serve HTTPS with --tls-cert ", tls.cert, " and --tls-key ", tls.key));
    }
    http = std::move(server);
  } else {
    http = std::make_unique<httplib::Server>();
  }
  RaiseOpenFileLimit(options.max_connections);
  http->new_task_queue = [this] {
    return new ConnectionQueue(options.max_connections, kIdleThreadTimeout,
                               [this] { shed->Increment(); });
  };
  // SO_REUSEADDR only (see cluster/metrics.cc): a taken port must be reported, not shared.
  http->set_socket_options([this](int fd) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    listen_fd = fd;
  });
  http->set_logger([this](const httplib::Request&, const httplib::Response& response) {
    responses->WithLabels({absl::StrCat(response.status)})->Increment();
  });
  http->set_payload_max_length(options.max_body_bytes);
  Route();
  port = options.port == 0
             ? http->bind_to_any_port(options.host)
             : (http->bind_to_port(options.host, options.port) ? options.port : -1);
  if (port < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options.host, ":", options.port));
  }
  // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian built the
  // library): a burst of connections overflows it, and the kernel drops or resets them. listen()
  // on the listening socket sets a new backlog.
  if (listen(listen_fd, options.listen_backlog) != 0) {
    return absl::InternalError(absl::StrCat("listen(): ", strerror(errno)));
  }
  thread = std::thread([this] {
    if (!http->listen_after_bind()) LOG(ERROR) << "the HTTP front stopped serving";
    done.Notify();
  });
  // httplib's stop() only acts once the accept loop runs, so Stop could otherwise miss it.
  while (!http->is_running()) {
    if (done.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
      thread.join();
      return absl::InternalError("the HTTP server did not start");
    }
  }
  return absl::OkStatus();
}

HttpFront::HttpFront(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpFront::~HttpFront() { Shutdown(); }

int HttpFront::port() const { return impl_->port; }

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontOptions& options) {
  if (options.servers.empty() && options.backend == nullptr) {
    return absl::InvalidArgumentError("--server is required");
  }
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
    K3_ASSIGN_OR_RETURN(std::string key, ReadApiKey(options.api_key_file));
    f.api_key = std::move(key);
  }
  std::string worker_token;
  if (!options.auth_token_file.empty()) {
    K3_ASSIGN_OR_RETURN(std::string token,
                        ReadTokenFile("--auth-token-file", options.auth_token_file));
    worker_token = std::move(token);
    if (f.api_key.empty()) f.api_key = worker_token;  // the clients send the same token
  }
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
  if (options.backend != nullptr) {
    f.pool = std::make_unique<WorkerPool>("in-process", options.backend, std::move(worker_token));
  } else {
    K3_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(options.tls));
    f.pool = std::make_unique<WorkerPool>(options.servers, tls, std::move(worker_token));
  }
  f.pool->set_resume_timeout(options.resume_timeout);

  MetricFamily<Counter>& responses = DefaultMetrics().AddCounter(
      "k3_http_responses_total", "HTTP responses of the OpenAI front, by status.", {"status"});
  f.responses = &responses;
  f.active = DefaultMetrics()
                 .AddGauge("k3_http_active_requests", "Generations the HTTP front has in flight.")
                 .Get();
  f.shed = DefaultMetrics()
               .AddCounter("k3_http_shed_connections_total",
                           "Connections answered 503 (Retry-After) past --max-connections.")
               .Get();
  const std::vector<double> buckets = ExponentialBuckets(0.005, 2, 16);
  f.latency = &DefaultMetrics().AddHistogram(
      "k3_http_request_seconds",
      "Completions from the request's body to its last byte, by endpoint.", buckets, {"endpoint"});
  f.first_token = &DefaultMetrics().AddHistogram(
      "k3_http_time_to_first_token_seconds",
      "Completions from the request's body to the first generated token, by endpoint.", buckets,
      {"endpoint"});
  K3_RETURN_IF_ERROR(f.Serve());
  if (options.backend != nullptr) return std::unique_ptr<HttpFront>(new HttpFront(std::move(impl)));

  f.proxy = std::make_unique<K3ServeProxy>(f.pool.get(), &*f.tokenizer, f.api_key);
  NodeEndpointsOptions endpoint_options;
  endpoint_options.services = {f.proxy.get()};
  endpoint_options.flags.host = options.host;
  endpoint_options.flags.port = options.grpc_port;
  endpoint_options.flags.metrics_port = options.metrics_port;
  endpoint_options.flags.tls = options.tls;
  WorkerPool* pool = f.pool.get();
  endpoint_options.readiness = [pool] { return pool->Ping(kReadinessTimeout); };
  K3_ASSIGN_OR_RETURN(std::unique_ptr<NodeEndpoints> endpoints,
                      NodeEndpoints::Start(std::move(endpoint_options)));
  f.endpoints = std::move(endpoints);
  f.endpoints->SetReady(true);
  return std::unique_ptr<HttpFront>(new HttpFront(std::move(impl)));
}

void HttpFront::Shutdown() {
  Impl& f = *impl_;
  if (f.stopping.exchange(true)) return;
  {
    absl::MutexLock lock(&f.mu);
    for (GenerateCall* call : f.calls) call->Cancel();
  }
  if (f.pool) f.pool->Stop();  // requests waiting for a worker end now
  if (f.http) f.http->stop();
  if (f.thread.joinable()) f.thread.join();
  if (f.endpoints) f.endpoints->Stop();
}

void AddHttpFrontFlags(CLI::App* app, HttpFrontOptions* options) {
  app->add_option("--server", options->servers,
                  "attention workers' gRPC addresses, HOST:PORT[,HOST:PORT...]; dns:///NAME:PORT "
                  "is every address NAME resolves to (a headless Service), resolved every 5 s")
      ->required()
      ->delimiter(',');
  app->add_option("--model", options->model, "model folder with tiktoken.model")->required();
  app->add_option("--host", options->host, "listen address")->capture_default_str();
  AddBoundedInt(app, "--port", &options->port, 0, 65535, "HTTP port (0 picks a free one)");
  AddBoundedInt(app, "--metrics-port", &options->metrics_port, -1, 65535,
                "HTTP /metrics and /healthz port (-1: none, 0 picks a free one)");
  AddBoundedInt(app, "--grpc-port", &options->grpc_port, 0, 65535,
                "gRPC port: k3serve.v1.K3Serve forwarded to the workers, and health (0 picks a "
                "free one)");
  app->add_option("--auth-token-file", options->auth_token_file,
                  "file holding the attention workers' bearer token: sent to them, and required "
                  "from this front's clients unless --api-key-file is given");
  AddTlsFlags(app, &options->tls);
  AddOpenAiApiFlags(app, options);
}

void AddOpenAiApiFlags(CLI::App* app, HttpFrontOptions* options) {
  app->add_option("--api-key-file", options->api_key_file,
                  "file holding the API key clients must send as a bearer token");
  app->add_option("--served-model-name", options->served_model_name,
                  "the model's name in the API (default: the model folder's name)");
  AddBoundedInt(app, "--default-max-tokens", &options->default_max_tokens, 0, 1 << 24,
                "max_tokens of requests that give none (0: as many as the workers allow, "
                "OpenAI's default)");
  app->add_option("--default-temperature", options->default_temperature,
                  "temperature of requests that give none (OpenAI's default: 1)")
      ->check(CLI::Range(0.0, 2.0))
      ->capture_default_str();
  AddBoundedInt(app, "--listen-backlog", &options->listen_backlog, 1, 1 << 20,
                "connections the kernel queues before they are accepted (capped by "
                "net.core.somaxconn)");
  AddBoundedInt(app, "--max-connections", &options->max_connections, 1, 1 << 20,
                "connections served at once, a thread each; those past it get 503 with "
                "Retry-After");
  AddBoundedInt(app, "--max-body-bytes", &options->max_body_bytes, 1024, int64_t{1} << 32,
                "the largest request body (413 beyond)");
  AddMilliseconds(app, "--resume-timeout-ms", &options->resume_timeout, 0, 24 * 3600 * 1000,
                  "how long a request waits for an attention worker to take it: at its start "
                  "while none is reachable, and after its worker was lost mid-stream (it is "
                  "resumed as prompt + tokens sent)");
}

}  // namespace k3
