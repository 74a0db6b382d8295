#include "cluster/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

// Parses exposition text into "name{labels}" -> value, undoing label escapes, and checks the
// format's structure on the way: every sample belongs to the family of the preceding # TYPE line.
std::map<std::string, double> ParseExposition(const std::string& text) {
  std::map<std::string, double> samples;
  std::string family;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.substr(0, 7) == "# TYPE ") {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), ' ');
      EXPECT_EQ(parts.size(), 2u) << line;
      family = parts[0];
      continue;
    }
    if (line[0] == '#') continue;
    // name[{labels}] value; label values may contain spaces, quotes and escapes.
    std::string key;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') key += line[i++];
    EXPECT_EQ(key.substr(0, family.size()), family) << line;
    if (i < line.size() && line[i] == '{') {
      key += line[i++];
      bool in_quotes = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (in_quotes && c == '\\') {
          const char e = line[i++];
          key += e == 'n' ? '\n' : e;
          continue;
        }
        if (c == '"') in_quotes = !in_quotes;
        key += c;
        if (!in_quotes && c == '}') break;
      }
    }
    EXPECT_EQ(line[i], ' ') << line;
    const std::string value(line.substr(i + 1));
    double v = 0;
    if (value == "+Inf") {
      v = INFINITY;
    } else {
      char* end = nullptr;
      v = std::strtod(value.c_str(), &end);
      EXPECT_EQ(*end, '\0') << "bad value in: " << line;
    }
    EXPECT_TRUE(samples.emplace(key, v).second) << "duplicate series " << key;
  }
  return samples;
}

TEST(MetricsTest, CountersAndGaugesAddUpAcrossThreads) {
  MetricsRegistry registry;
  auto& requests = registry.AddCounter("k3_requests_total", "Requests.", {"role", "code"});
  auto& inflight = registry.AddGauge("k3_inflight", "In flight.");
  constexpr int kThreads = 4;
  constexpr int kPerThread = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* ok = requests.WithLabels({"attention", "ok"});
      Counter* mine = requests.WithLabels({"expert", absl::StrCat("t", t)});
      for (int i = 0; i < kPerThread; ++i) {
        ok->Increment();
        mine->Increment(0.5);
        inflight.Get()->Add(1);
        inflight.Get()->Add(-1);
      }
    });
  }
  for (auto& th : threads) th.join();
  inflight.Get()->Add(3);

  const auto samples = ParseExposition(registry.ExpositionText());
  EXPECT_EQ(samples.at("k3_requests_total{role=\"attention\",code=\"ok\"}"),
            double{kThreads} * kPerThread);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(samples.at(absl::StrCat("k3_requests_total{role=\"expert\",code=\"t", t, "\"}")),
              0.5 * kPerThread);
  }
  EXPECT_EQ(samples.at("k3_inflight"), 3.0);
  EXPECT_EQ(samples.size(), 1u + kThreads + 1u);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeCountsOfValuesAtOrBelowEachBound) {
  MetricsRegistry registry;
  const std::vector<double> bounds = {0.001, 0.01, 0.1, 1.0};
  auto& latency = registry.AddHistogram("k3_step_seconds", "Step time.", bounds, {"layer"});
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(-0.5, 1.5);
  std::vector<double> values = {0.01, 1.0, 0.001};  // exactly on bounds: counted in that bucket
  for (int i = 0; i < 1000; ++i) values.push_back(dist(rng) * dist(rng));
  Histogram* h = latency.WithLabels({"3"});
  double sum = 0;
  for (double v : values) {
    h->Observe(v);
    sum += v;
  }

  const auto samples = ParseExposition(registry.ExpositionText());
  for (double bound : bounds) {
    uint64_t expected = 0;
    for (double v : values) expected += v <= bound ? 1 : 0;
    EXPECT_EQ(samples.at(absl::StrCat("k3_step_seconds_bucket{layer=\"3\",le=\"",
                                      FormatMetricValue(bound), "\"}")),
              expected)
        << bound;
  }
  EXPECT_EQ(samples.at("k3_step_seconds_bucket{layer=\"3\",le=\"+Inf\"}"), values.size());
  EXPECT_EQ(samples.at("k3_step_seconds_count{layer=\"3\"}"), values.size());
  EXPECT_DOUBLE_EQ(samples.at("k3_step_seconds_sum{layer=\"3\"}"), sum);
}

TEST(MetricsTest, LabelValuesAreEscapedAndRoundTrip) {
  MetricsRegistry registry;
  auto& g = registry.AddGauge("k3_odd", "Help with \\ and\nnewline.", {"v"});
  const std::string odd = "a \"quoted\" \\ back\nslash {x}";
  g.WithLabels({odd})->Set(-2.25);
  const std::string text = registry.ExpositionText();
  EXPECT_NE(text.find("# HELP k3_odd Help with \\\\ and\\nnewline.\n"), std::string::npos) << text;
  const auto samples = ParseExposition(text);
  EXPECT_EQ(samples.at(absl::StrCat("k3_odd{v=\"", odd, "\"}")), -2.25);
}

TEST(MetricsTest, ValuesFormatExactly) {
  for (double v : {0.1, 1e-300, 123456789.125, -7.0, 1e20}) {
    const std::string s = FormatMetricValue(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
  }
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
  EXPECT_EQ(FormatMetricValue(42), "42");
}

TEST(MetricsTest, RegisteringTheSameFamilyAgainReturnsIt) {
  MetricsRegistry registry;
  auto& a = registry.AddCounter("k3_x_total", "X.", {"a"});
  auto& b = registry.AddCounter("k3_x_total", "X.", {"a"});
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(a.WithLabels({"1"}), b.WithLabels({"1"}));
}

TEST(MetricsDeathTest, ShapeMismatchesAreProgrammingErrors) {
  MetricsRegistry registry;
  registry.AddCounter("k3_y_total", "Y.", {"a"});
  EXPECT_DEATH(registry.AddGauge("k3_y_total", "Y.", {"a"}), "registered twice");
  EXPECT_DEATH(registry.AddCounter("k3_y_total", "Y.", {"a"}).WithLabels({"1", "2"}),
               "2 label values");
  EXPECT_DEATH(registry.AddCounter("bad-name", "Z."), "invalid metric name");
  EXPECT_DEATH(registry.AddHistogram("k3_h", "H.", {2.0, 1.0}), "increase strictly");
}

// --- HTTP ---------------------------------------------------------------------------------------

struct HttpReply {
  int code = 0;
  std::map<std::string, std::string> headers;
  std::string body;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Sends `request` raw and reads the reply until the server closes.
HttpReply Fetch(int port, const std::string& request) {
  HttpReply reply;
  const int fd = Connect(port);
  if (fd < 0) return reply;
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, n);
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return reply;
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || !absl::SimpleAtoi(status[1], &reply.code)) return reply;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(lines[i], absl::MaxSplits(": ", 1));
    reply.headers[kv.first] = kv.second;
  }
  reply.body = raw.substr(end + 4);
  return reply;
}

HttpReply Get(int port, const std::string& path) {
  return Fetch(port, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n\r\n"));
}

TEST(MetricsHttpTest, ServesMetricsHealthAndErrorsOverARealSocket) {
  MetricsRegistry registry;
  registry.AddCounter("k3_scraped_total", "Scrapes.", {"who"}).WithLabels({"test"})->Increment(5);
  std::atomic<bool> healthy{true};
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  auto server = MetricsHttpServer::Start(options, &registry, [&healthy] {
    return healthy ? absl::OkStatus() : absl::UnavailableError("model not loaded");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  HttpReply metrics = Get(port, "/metrics?x=1");
  EXPECT_EQ(metrics.code, 200);
  EXPECT_EQ(metrics.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(metrics.headers["Content-Length"], std::to_string(metrics.body.size()));
  EXPECT_EQ(metrics.body, registry.ExpositionText());
  EXPECT_EQ(ParseExposition(metrics.body).at("k3_scraped_total{who=\"test\"}"), 5.0);

  EXPECT_EQ(Get(port, "/healthz").code, 200);
  healthy = false;
  HttpReply sick = Get(port, "/healthz");
  EXPECT_EQ(sick.code, 503);
  EXPECT_EQ(sick.body, "model not loaded\n");

  EXPECT_EQ(Get(port, "/nope").code, 404);
  EXPECT_EQ(Fetch(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").code, 405);
  EXPECT_EQ(Fetch(port, "garbage\r\n\r\n").code, 400);
  HttpReply head = Fetch(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.code, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_EQ(Fetch(port, absl::StrCat("GET /", std::string(20000, 'a'), " HTTP/1.1\r\n\r\n")).code,
            414);  // URI Too Long
}

TEST(MetricsHttpTest, ASilentClientIsDroppedAfterTheTimeout) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  options.io_timeout = absl::Milliseconds(200);
  auto server = MetricsHttpServer::Start(options, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const int silent = Connect(port);  // connects, never sends
  ASSERT_GE(silent, 0);
  const absl::Time start = absl::Now();
  EXPECT_EQ(Get(port, "/healthz").code, 200);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  char c;
  EXPECT_EQ(recv(silent, &c, 1, 0), 0);  // the server closed it
  close(silent);
}

TEST(MetricsHttpTest, StopIsPromptAndBadOptionsAreRejected) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.host = "127.0.0.1";
  auto server = MetricsHttpServer::Start(options, &registry);
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  options.port = port;
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry).status().code(),
            absl::StatusCode::kUnavailable);  // the port is taken
  const absl::Time start = absl::Now();
  (*server)->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(Get(port, "/metrics").code, 0);  // nobody answers

  options.port = 70000;
  EXPECT_EQ(MetricsHttpServer::Start(options, &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
