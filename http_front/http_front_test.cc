// The HTTP front without a cluster: its own answers (models, authentication, routes, bad input)
// and 503 when no attention worker is reachable. The front with a real cluster behind it is
// tests/http_front_test.cc.
#include "http_front/http_front.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
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
  void SetUp() override {
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

}  // namespace
}  // namespace k3
