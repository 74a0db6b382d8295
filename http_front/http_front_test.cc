// The HTTP front without a cluster: its own answers (models, authentication, routes, bad input)
// and 503 when no attention worker is reachable. The front with a real cluster behind it is
// tests/http_front_test.cc.
#include "http_front/http_front.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "cluster/metrics.h"
#include "cluster/test_certs.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

using nlohmann::json;

constexpr char kKey[] = "secret";

// A loopback port that nothing listens on: bound, then closed (the kernel does not hand it out
// again at once).
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

class HttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  // (Re)starts the front with the fixture's options changed by `change`.
  void Start(const std::function<void(HttpFrontOptions&)>& change) {
    client_.reset();
    front_.reset();
    const std::filesystem::path dir = std::filesystem::path(std::getenv("TEST_TMPDIR")) / "m";
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(WriteRandomTokenizer(dir.string(), 1024, TokenizerFamily::kK3).ok());
    std::ofstream(dir / "key") << kKey << "\n";
    HttpFrontOptions options;
    options.servers = {absl::StrCat("127.0.0.1:", ClosedPort())};
    options.model = dir.string();
    options.host = "127.0.0.1";
    options.port = 0;
    options.api_key_file = (dir / "key").string();
    // The worker is never there: a request waits this long for it (--resume-timeout-ms), then
    // gets its 503.
    options.resume_timeout = absl::Milliseconds(200);
    if (change) change(options);
    absl::StatusOr<std::unique_ptr<HttpFront>> front = HttpFront::Start(options);
    ASSERT_TRUE(front.ok()) << front.status();
    front_ = *std::move(front);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", front_->port());
  }

  // The status and the parsed body (discarded when not JSON).
  std::pair<int, json> Post(const std::string& path, const std::string& body,
                            const std::string& key = kKey) {
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", absl::StrCat("Bearer ", key));
    httplib::Result result = client_->Post(path.c_str(), headers, body, "application/json");
    if (!result) return {0, json()};
    return {result->status, json::parse(result->body, nullptr, false)};
  }

  std::unique_ptr<HttpFront> front_;
  std::unique_ptr<httplib::Client> client_;
};

void ExpectError(const std::pair<int, json>& response, int status, const std::string& type) {
  EXPECT_EQ(response.first, status) << response.second;
  const json& error = response.second["error"];
  EXPECT_EQ(error["type"], type) << response.second;
  EXPECT_TRUE(error["message"].is_string() && error.contains("param") && error.contains("code"))
      << response.second;
}

TEST_F(HttpFrontTest, ListsTheModelByItsFolderName) {
  httplib::Result result =
      client_->Get("/v1/models", httplib::Headers{{"Authorization", "Bearer secret"}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  const json body = json::parse(result->body);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["data"][0]["id"], "m");
}

TEST_F(HttpFrontTest, MissingOrWrongKeyIs401) {
  const std::string body = R"({"prompt":"hi"})";
  ExpectError(Post("/v1/completions", body, ""), 401, "authentication_error");
  ExpectError(Post("/v1/completions", body, "guess"), 401, "authentication_error");
}

// A refused request's body is read all the same: the connection goes on to serve the next
// request instead of parsing the body as one.
TEST_F(HttpFrontTest, A401LeavesTheConnectionUsable) {
  const std::string body = R"({"prompt":"hi"})";
  const std::string refused = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guess\r\n"
      "Content-Type: application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(front_->port()));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(send(fd, refused.data(), refused.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(refused.size()));
  std::string answers;
  char buffer[4096];
  // The 401's whole body ends with the error object's closing braces.
  while (!absl::EndsWith(answers, "}}")) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0) << answers;
    answers.append(buffer, n);
  }
  EXPECT_TRUE(absl::StartsWith(answers, "HTTP/1.1 401")) << answers;
  answers.clear();
  const std::string next =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(send(fd, next.data(), next.size(), MSG_NOSIGNAL), static_cast<ssize_t>(next.size()));
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) answers.append(buffer, n);
  close(fd);
  EXPECT_TRUE(absl::StartsWith(answers, "HTTP/1.1 200")) << answers;
  EXPECT_TRUE(absl::StrContains(answers, R"("object":"list")")) << answers;
}

// RFC 6750: a 401 names the scheme in WWW-Authenticate, and the scheme is case-insensitive.
TEST_F(HttpFrontTest, BearerIsCaseInsensitiveAnd401SaysWhatItWants) {
  httplib::Result missing = client_->Get("/v1/models");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(missing->get_header_value("WWW-Authenticate"), "Bearer realm=\"k3serve\"");
  httplib::Result wrong = client_->Get("/v1/models", {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_TRUE(absl::StrContains(wrong->get_header_value("WWW-Authenticate"), "invalid_token"));
  for (const char* scheme : {"bearer ", "BEARER ", "Bearer  "}) {
    httplib::Result result =
        client_->Get("/v1/models", {{"Authorization", absl::StrCat(scheme, kKey)}});
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200) << scheme;
  }
}

TEST_F(HttpFrontTest, GetsTheModelByItsId) {
  const httplib::Headers key = {{"Authorization", "Bearer secret"}};
  httplib::Result model = client_->Get("/v1/models/m", key);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->status, 200);
  const json body = json::parse(model->body);
  EXPECT_EQ(body["id"], "m");
  EXPECT_EQ(body["object"], "model");
  httplib::Result other = client_->Get("/v1/models/gpt-4", key);
  ASSERT_TRUE(other);
  ExpectError({other->status, json::parse(other->body, nullptr, false)}, 404, "not_found_error");
}

// A body over --max-body-bytes is 413 whatever its content type (not 429, which SDKs retry), and
// a JSON body sent as a form (curl -d's default content type) is read as JSON at any size up to
// the limit (httplib alone caps form bodies at 8 KB with 413).
TEST_F(HttpFrontTest, BodiesOverTheLimitAre413WhateverTheirType) {
  Start([](HttpFrontOptions& options) { options.max_body_bytes = 1 << 20; });
  const httplib::Headers key = {{"Authorization", "Bearer secret"}};
  const std::string big_prompt(64 << 10, 'a');
  const std::string form_json = json{{"prompt", big_prompt}, {"max_tokens", 1}}.dump();
  httplib::Result form =
      client_->Post("/v1/completions", key, form_json, "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 503) << form->body;  // read, parsed, and no worker to answer it
  const std::string huge = json{{"prompt", std::string(2 << 20, 'a')}}.dump();
  for (const char* type : {"application/json", "application/x-www-form-urlencoded", "text/plain"}) {
    httplib::Result result = client_->Post("/v1/completions", key, huge, type);
    ASSERT_TRUE(result) << type;
    ExpectError({result->status, json::parse(result->body, nullptr, false)}, 413,
                "invalid_request_error");
  }
}

// --tls-cert and --tls-key serve the API over HTTPS.
TEST_F(HttpFrontTest, ServesHttpsWithTheTlsFlags) {
  absl::StatusOr<TestCerts> certs = MakeTestCerts(absl::StrCat(std::getenv("TEST_TMPDIR"), "/tls"));
  if (absl::IsUnavailable(certs.status())) GTEST_SKIP() << certs.status();
  ASSERT_TRUE(certs.ok()) << certs.status();
  Start([&](HttpFrontOptions& options) { options.tls = certs->Mutual(); });
  httplib::SSLClient client("127.0.0.1", front_->port());
  client.set_ca_cert_path(certs->ca.c_str());
  client.enable_server_certificate_verification(true);
  httplib::Result result = client.Get("/v1/models", {{"Authorization", "Bearer secret"}});
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  // Plain HTTP gets no answer from an HTTPS port.
  httplib::Result plain = client_->Get("/v1/models", {{"Authorization", "Bearer secret"}});
  EXPECT_FALSE(plain && plain->status == 200);
}

TEST_F(HttpFrontTest, BadInputIs400AndUnknownRoutesAre404) {
  ExpectError(Post("/v1/chat/completions", "{"), 400, "invalid_request_error");
  ExpectError(Post("/v1/chat/completions", R"({"messages":[{"role":"tool","content":"x"}]})"), 400,
              "invalid_request_error");
  ExpectError(Post("/v1/embeddings", "{}"), 404, "not_found_error");
}

TEST_F(HttpFrontTest, UnreachableClusterIs503) {
  ExpectError(Post("/v1/completions", R"({"prompt":"hi","max_tokens":2})"), 503, "server_error");
  ExpectError(Post("/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"hi"}],"stream":true})"),
              503, "server_error");
}

// What `connections` simultaneous clients got, each opening its own connection at once (a burst
// of SYNs) and sending `request` (with Connection: close) as soon as it is connected.
// k3_http_shed_connections_total, from the metrics' exposition text.
double ShedConnections() {
  const std::string text = DefaultMetrics().ExpositionText();
  const std::string name = "\nk3_http_shed_connections_total ";
  const size_t at = text.find(name);
  return at == std::string::npos ? 0 : std::stod(text.substr(at + name.size()));
}

struct Burst {
  int ok = 0;           // a 200 answer
  int shed = 0;         // a 503 with Retry-After
  int other = 0;        // another complete answer
  int resets = 0;       // refused, reset, or closed without a whole answer
  std::string example;  // of the last `other` or reset, for the failure message
};

Burst SendBurst(int port, int connections, const std::string& request) {
  struct Client {
    int fd = -1;
    size_t sent = 0;
    std::string received;
    bool done = false;
  };
  std::vector<Client> clients(connections);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  Burst burst;
  auto fail = [&](Client& client, const std::string& why) {
    ++burst.resets;
    burst.example = why;
    client.done = true;
  };
  for (Client& client : clients) {
    client.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (connect(client.fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 &&
        errno != EINPROGRESS) {
      fail(client, absl::StrCat("connect: ", strerror(errno)));
    }
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  for (int left = connections; absl::Now() < deadline;) {
    std::vector<pollfd> fds;
    std::vector<Client*> polled;
    left = 0;
    for (Client& client : clients) {
      if (client.done) continue;
      ++left;
      fds.push_back({client.fd, static_cast<short>(client.sent < request.size() ? POLLOUT : POLLIN), 0});
      polled.push_back(&client);
    }
    if (left == 0) break;
    poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      Client& client = *polled[i];
      if (fds[i].revents == 0) continue;
      if (client.sent < request.size()) {
        const ssize_t n = send(client.fd, request.data() + client.sent,
                               request.size() - client.sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) fail(client, absl::StrCat("send: ", strerror(errno)));
        if (n > 0) client.sent += n;
        continue;
      }
      char buffer[4096];
      const ssize_t n = recv(client.fd, buffer, sizeof(buffer), 0);
      if (n > 0) {
        client.received.append(buffer, n);
        continue;
      }
      if (n < 0 && errno == EAGAIN) continue;
      client.done = true;
      const std::string& r = client.received;
      if (n < 0 || !absl::StrContains(r, "\r\n\r\n")) {
        fail(client, n < 0 ? absl::StrCat("recv: ", strerror(errno)) : "closed: '" + r + "'");
      } else if (absl::StartsWith(r, "HTTP/1.1 200")) {
        ++burst.ok;
      } else if (absl::StartsWith(r, "HTTP/1.1 503") && absl::StrContains(r, "Retry-After: ")) {
        ++burst.shed;
      } else {
        ++burst.other;
        burst.example = r;
      }
    }
  }
  for (Client& client : clients) {
    if (!client.done) fail(client, "no answer in time");
    close(client.fd);
  }
  return burst;
}

constexpr char kModelsRequest[] =
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
    "Connection: close\r\n\r\n";

// Past --max-connections, connections are answered 503 with Retry-After (and counted), not
// queued for ever or reset.
TEST_F(HttpFrontTest, ConnectionsPastTheLimitGet503WithRetryAfter) {
  Start([](HttpFrontOptions& options) { options.max_connections = 4; });
  // Four clients that connect and say nothing hold the four connections (until httplib's read
  // timeout, 5 s).
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(front_->port()));
    ASSERT_EQ(connect(idle.back(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  }
  absl::SleepFor(absl::Milliseconds(200));  // accepted
  const double shed_before = ShedConnections();
  const Burst burst = SendBurst(front_->port(), 50, kModelsRequest);
  for (int fd : idle) close(fd);
  EXPECT_EQ(burst.resets, 0) << burst.example;
  EXPECT_EQ(burst.other, 0) << burst.example;
  EXPECT_EQ(burst.shed, 50);
  EXPECT_EQ(ShedConnections() - shed_before, 50);
}

// 1,000 clients connecting at once all get an answer: nothing is refused or reset, however
// short the listen backlog's default and however few threads a fixed pool would have.
TEST_F(HttpFrontTest, AThousandSimultaneousConnectionsAreAllAnswered) {
  const Burst burst = SendBurst(front_->port(), 1000, kModelsRequest);
  EXPECT_EQ(burst.resets, 0) << burst.example;
  EXPECT_EQ(burst.other, 0) << burst.example;
  EXPECT_EQ(burst.ok + burst.shed, 1000);
}

}  // namespace
}  // namespace k3
