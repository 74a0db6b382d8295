#include "cluster/metrics.h"

#include <sys/socket.h>

#include <algorithm>
#include <iterator>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "httplib.h"

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

// The text format's escapes: backslash and newline, and in label values double quotes too.
std::string EscapeText(const std::string& text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (quotes && c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) { return EscapeText(help, /*quotes=*/false); }

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
  constexpr const char* kNames[] = {"counter", "gauge", "histogram"};  // in enum order
  const auto index = static_cast<size_t>(type);
  return index < std::size(kNames) ? kNames[index] : "untyped";
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

std::string EscapeLabelValue(const std::string& value) {
  return EscapeText(value, /*quotes=*/true);
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

template <typename T>
void MetricsRegistry::AppendValueSeries(const MetricFamily<T>& family, std::string* out) {
  absl::MutexLock series_lock(&family.mu_);
  for (const auto& [values, series] : family.series_) {
    absl::StrAppend(out, family.name_, FormatLabels(family.label_names_, values), " ",
                    FormatMetricValue(series->Value()), "\n");
  }
}

std::string MetricsRegistry::ExpositionText() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, e] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(e.help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", TypeName(e.type), "\n");
    switch (e.type) {
      case MetricType::kCounter:
        AppendValueSeries(*e.counter, &out);
        break;
      case MetricType::kGauge:
        AppendValueSeries(*e.gauge, &out);
        break;
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

// Scrapes are rare; a second thread keeps one slow client from holding up the next scrape.
constexpr size_t kServerThreads = 2;

constexpr char kPlainText[] = "text/plain";

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
  auto http = std::make_unique<httplib::Server>();
  http->new_task_queue = [] { return new httplib::ThreadPool(kServerThreads); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server bind
  // a port that is already serving instead of reporting it taken.
  http->set_socket_options([](int fd) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  http->set_keep_alive_max_count(1);
  // The wait for a request's first byte is httplib's keep-alive timeout, in whole seconds.
  http->set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(absl::Ceil(options.io_timeout, absl::Seconds(1)))));
  http->set_read_timeout(absl::ToChronoMicroseconds(options.io_timeout));
  http->set_write_timeout(absl::ToChronoMicroseconds(options.io_timeout));
  http->set_pre_routing_handler([](const httplib::Request& request, httplib::Response& response) {
    if (request.method == "GET" || request.method == "HEAD") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    response.status = 405;
    response.set_content("only GET\n", kPlainText);
    return httplib::Server::HandlerResponse::Handled;
  });
  http->Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry->ExpositionText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto health_mu = std::make_shared<absl::Mutex>();
  http->Get("/healthz", [health = std::move(health), health_mu](const httplib::Request&,
                                                                httplib::Response& response) {
    absl::Status status;
    if (health) {
      absl::MutexLock lock(health_mu.get());
      status = health();
    }
    if (status.ok()) {
      response.set_content("ok\n", kPlainText);
    } else {
      response.status = 503;
      response.set_content(absl::StrCat(status.message(), "\n"), kPlainText);
    }
  });
  http->Get(".*", [](const httplib::Request&, httplib::Response& response) {
    response.status = 404;
    response.set_content("not found\n", kPlainText);
  });

  const std::string host = options.host.empty() ? "0.0.0.0" : options.host;
  const int port = options.port == 0 ? http->bind_to_any_port(host)
                                     : (http->bind_to_port(host, options.port) ? options.port : -1);
  if (port < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", host, ":", options.port));
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(std::move(http), port));
  server->thread_ = std::thread([s = server.get()] {
    if (!s->http_->listen_after_bind()) {
      LOG(ERROR) << "metrics server on port " << s->port_ << " stopped serving";
    }
    s->done_.Notify();
  });
  // httplib's stop() only acts once the accept loop runs, so Stop could otherwise miss it.
  while (!server->http_->is_running()) {
    if (server->done_.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
      return absl::InternalError(absl::StrCat("metrics server on port ", port, " did not start"));
    }
  }
  return server;
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<httplib::Server> http, int port)
    : http_(std::move(http)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace k3
