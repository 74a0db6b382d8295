#include "cluster/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace k3 {

namespace metrics_internal {

void DieOnLabelCountMismatch(const std::string& name, size_t want, size_t got) {
  LOG(FATAL) << "metric " << name << " has " << want << " label names but was given " << got
             << " label values";
  std::abort();  // LOG(FATAL) does not return; this tells the compiler
}

}  // namespace metrics_internal

namespace {

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  return IsValidMetricName(name) && name.find(':') == std::string_view::npos &&
         name.substr(0, 2) != "__";
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// {a="x",b="y"} with `extra` (already formatted, e.g. le="1") appended; empty without labels.
std::string FormatLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values, const std::string& extra = "") {
  std::vector<std::string> parts;
  for (size_t i = 0; i < names.size(); ++i) {
    parts.push_back(absl::StrCat(names[i], "=\"", EscapeLabelValue(values[i]), "\""));
  }
  if (!extra.empty()) parts.push_back(extra);
  if (parts.empty()) return "";
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

void Counter::Increment(double delta) {
  DCHECK_GE(delta, 0.0) << "counters only grow";
  if (delta > 0.0) value_.fetch_add(delta, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    CHECK(std::isfinite(bounds_[i])) << "histogram bounds must be finite";
    CHECK(i == 0 || bounds_[i - 1] < bounds_[i]) << "histogram bounds must increase strictly";
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = buckets_[i].load(std::memory_order_relaxed);
  return counts;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  CHECK_GT(start, 0.0);
  CHECK_GT(factor, 1.0);
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  CHECK_GT(width, 0.0);
  std::vector<double> bounds;
  for (int i = 0; i < count; ++i) bounds.push_back(start + width * i);
  return bounds;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  CHECK(ec == std::errc());
  return std::string(buf, end);
}

MetricsRegistry::Entry& MetricsRegistry::FindOrAdd(MetricType type, const std::string& name,
                                                   const std::string& help,
                                                   std::vector<std::string> label_names,
                                                   std::vector<double> bounds) {
  CHECK(IsValidMetricName(name)) << "invalid metric name '" << name << "'";
  for (const std::string& label : label_names) {
    CHECK(IsValidLabelName(label)) << "invalid label name '" << label << "' in " << name;
    CHECK(type != MetricType::kHistogram || label != "le") << name << ": 'le' is reserved";
  }
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    const Entry& e = it->second;
    CHECK(e.type == type && e.label_names == label_names && e.bounds == bounds)
        << "metric " << name << " registered twice with different type, labels or buckets";
    return it->second;
  }
  Entry& e = families_[name];
  e.type = type;
  e.help = help;
  e.label_names = label_names;
  e.bounds = bounds;
  switch (type) {
    case MetricType::kCounter:
      e.counter.reset(new MetricFamily<Counter>(name, std::move(label_names), {}));
      break;
    case MetricType::kGauge:
      e.gauge.reset(new MetricFamily<Gauge>(name, std::move(label_names), {}));
      break;
    case MetricType::kHistogram:
      e.histogram.reset(
          new MetricFamily<Histogram>(name, std::move(label_names), std::move(bounds)));
      break;
  }
  return e;
}

MetricFamily<Counter>& MetricsRegistry::AddCounter(const std::string& name,
                                                   const std::string& help,
                                                   std::vector<std::string> label_names) {
  return *FindOrAdd(MetricType::kCounter, name, help, std::move(label_names), {}).counter;
}

MetricFamily<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                               std::vector<std::string> label_names) {
  return *FindOrAdd(MetricType::kGauge, name, help, std::move(label_names), {}).gauge;
}

MetricFamily<Histogram>& MetricsRegistry::AddHistogram(const std::string& name,
                                                       const std::string& help,
                                                       std::vector<double> bounds,
                                                       std::vector<std::string> label_names) {
  // Histogram's constructor checks the bounds; check them here too so a bad family fails at
  // registration rather than at its first series.
  Histogram check(bounds);
  return *FindOrAdd(MetricType::kHistogram, name, help, std::move(label_names), std::move(bounds))
              .histogram;
}

std::string MetricsRegistry::ExpositionText() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, e] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(e.help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", TypeName(e.type), "\n");
    switch (e.type) {
      case MetricType::kCounter: {
        absl::MutexLock series_lock(&e.counter->mu_);
        for (const auto& [values, c] : e.counter->series_) {
          absl::StrAppend(&out, name, FormatLabels(e.label_names, values), " ",
                          FormatMetricValue(c->Value()), "\n");
        }
        break;
      }
      case MetricType::kGauge: {
        absl::MutexLock series_lock(&e.gauge->mu_);
        for (const auto& [values, g] : e.gauge->series_) {
          absl::StrAppend(&out, name, FormatLabels(e.label_names, values), " ",
                          FormatMetricValue(g->Value()), "\n");
        }
        break;
      }
      case MetricType::kHistogram: {
        absl::MutexLock series_lock(&e.histogram->mu_);
        for (const auto& [values, h] : e.histogram->series_) {
          // _count is the +Inf bucket's cumulative count, so a scrape is self-consistent even
          // while observations race with it.
          const std::vector<uint64_t> counts = h->BucketCounts();
          uint64_t cumulative = 0;
          for (size_t i = 0; i < counts.size(); ++i) {
            cumulative += counts[i];
            const std::string le =
                i < e.bounds.size() ? FormatMetricValue(e.bounds[i]) : std::string("+Inf");
            absl::StrAppend(&out, name, "_bucket",
                            FormatLabels(e.label_names, values, absl::StrCat("le=\"", le, "\"")),
                            " ", cumulative, "\n");
          }
          absl::StrAppend(&out, name, "_sum", FormatLabels(e.label_names, values), " ",
                          FormatMetricValue(h->Sum()), "\n");
          absl::StrAppend(&out, name, "_count", FormatLabels(e.label_names, values), " ",
                          cumulative, "\n");
        }
        break;
      }
    }
  }
  return out;
}

MetricsRegistry& DefaultMetrics() {
  static MetricsRegistry* registry = new MetricsRegistry();
  return *registry;
}

// --- HTTP server ---------------------------------------------------------------------------------

namespace {

constexpr size_t kMaxRequestBytes = 8192;

std::string HttpResponse(int code, absl::string_view reason, absl::string_view content_type,
                         absl::string_view body, bool include_body) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n",
                      include_body ? body : absl::string_view());
}

// Milliseconds left until `deadline`, at least 0, for poll.
int RemainingMs(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options, const MetricsRegistry* registry,
    std::function<absl::Status()> health) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", options.port, " out of range"));
  }
  if (options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("metrics io_timeout must be positive");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(options.port);
  const int gai = getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(),
                              port_str.c_str(), &hints, &res);
  if (gai != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics host '", options.host, "': ", gai_strerror(gai)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 16) == 0) break;
    last_error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", options.host, ":",
                                               options.port, ": ", last_error));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(options, registry, std::move(health), fd, wake_fd, port));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(const MetricsHttpOptions& options,
                                     const MetricsRegistry* registry,
                                     std::function<absl::Status()> health, int listen_fd,
                                     int wake_fd, int port)
    : options_(options),
      registry_(registry),
      health_(std::move(health)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port) {}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  close(wake_fd_);
}

void MetricsHttpServer::Stop() {
  if (stopping_.exchange(true)) {
    return;
  }
  const uint64_t one = 1;
  // An eventfd write of 1 cannot fail short of counter overflow.
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsHttpServer::Serve() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "metrics server poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) continue;  // the client went away, or EAGAIN
    HandleConnection(conn);
    close(conn);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  const absl::Time deadline = absl::Now() + options_.io_timeout;
  // Waits until fd is ready for `events`; false on timeout, Stop or error.
  auto wait_for = [&](int16_t events) {
    for (;;) {
      pollfd fds[2] = {{fd, events, 0}, {wake_fd_, POLLIN, 0}};
      const int n = poll(fds, 2, RemainingMs(deadline));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || fds[1].revents != 0) return false;
      return (fds[0].revents & (events | POLLHUP | POLLERR)) != 0;
    }
  };
  auto send_all = [&](const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += n;
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait_for(POLLOUT)) return;
      } else {
        return;
      }
    }
  };

  std::string request;
  size_t header_end = std::string::npos;
  while (header_end == std::string::npos) {
    if (request.size() > kMaxRequestBytes) {
      send_all(HttpResponse(431, "Request Header Fields Too Large", "text/plain",
                            "request too large\n", true));
      return;
    }
    char buf[2048];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      request.append(buf, n);
      header_end = request.find("\r\n\r\n");
      if (header_end == std::string::npos) header_end = request.find("\n\n");
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(POLLIN)) return;  // too slow, or stopping: drop it
    } else {
      return;  // closed before a full request
    }
  }

  // Request line: METHOD SP TARGET SP VERSION.
  const std::string_view line =
      std::string_view(request).substr(0, request.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) {
    send_all(HttpResponse(400, "Bad Request", "text/plain", "malformed request line\n", true));
    return;
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    send_all(HttpResponse(405, "Method Not Allowed", "text/plain", "only GET\n", true));
    return;
  }
  if (path == "/metrics") {
    send_all(HttpResponse(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                          registry_->ExpositionText(), !head));
  } else if (path == "/healthz") {
    const absl::Status status = health_ ? health_() : absl::OkStatus();
    if (status.ok()) {
      send_all(HttpResponse(200, "OK", "text/plain", "ok\n", !head));
    } else {
      send_all(HttpResponse(503, "Service Unavailable", "text/plain",
                            absl::StrCat(status.message(), "\n"), !head));
    }
  } else {
    send_all(HttpResponse(404, "Not Found", "text/plain", "not found\n", !head));
  }
}

}  // namespace k3
