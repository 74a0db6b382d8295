// Metrics: counters, gauges and histograms with labels, rendered in the Prometheus text exposition
// format (version 0.0.4), and a tiny HTTP server that serves them at GET /metrics.
//
// A MetricsRegistry holds families (one metric name, one help text, fixed label names); a family
// hands out one series per combination of label values. Series pointers stay valid for the
// registry's lifetime, so hot paths look a series up once and then only touch atomics.
//
// Metric and label names are program constants: an invalid name, a family registered twice with a
// different shape, or a label-value count that does not match the family is a programming error
// and CHECK-fails. Label values may be anything (they are escaped).
//
// Thread-safety: everything here may be used from any thread concurrently.
#ifndef K3SERVE_CLUSTER_METRICS_H_
#define K3SERVE_CLUSTER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace k3 {

// Monotonic; only non-negative increments.
class Counter {
 public:
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with the given upper bounds (strictly increasing, finite);
// an implicit +Inf bucket takes the rest. An observation equal to a bound counts in that bucket.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds().size() + 1 of them; the last is the +Inf bucket.
  std::vector<uint64_t> BucketCounts() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
};

// Bucket bounds start, start*factor, ... (count of them). REQUIRES: start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// metrics.cc names the types in this order.
enum class MetricType { kCounter, kGauge, kHistogram };

namespace metrics_internal {
[[noreturn]] void DieOnLabelCountMismatch(const std::string& name, size_t want, size_t got);
}  // namespace metrics_internal

// One metric name with its series. Obtained from MetricsRegistry, which owns it.
template <typename T>
class MetricFamily {
 public:
  // The series with these label values (in the order of the family's label names), created on
  // first use. CHECK-fails when the count differs from the label names'.
  T* WithLabels(const std::vector<std::string>& values);
  // The series of a family without labels.
  T* Get() { return WithLabels({}); }

 private:
  friend class MetricsRegistry;
  MetricFamily(std::string name, std::vector<std::string> label_names, std::vector<double> bounds)
      : name_(std::move(name)), label_names_(std::move(label_names)), bounds_(std::move(bounds)) {}

  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a family, or returns the existing one when name, type, label names (and bounds)
  // match. Names follow Prometheus rules: [a-zA-Z_:][a-zA-Z0-9_:]*, labels without ':' and not
  // starting with "__"; "le" is reserved for histograms.
  MetricFamily<Counter>& AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names = {});
  MetricFamily<Gauge>& AddGauge(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names = {});
  MetricFamily<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<double> bounds,
                                        std::vector<std::string> label_names = {});

  // Every family and series, families sorted by name and series by label values, in the text
  // exposition format.
  std::string ExpositionText() const;

 private:
  struct Entry {
    MetricType type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;
    std::unique_ptr<MetricFamily<Counter>> counter;
    std::unique_ptr<MetricFamily<Gauge>> gauge;
    std::unique_ptr<MetricFamily<Histogram>> histogram;
  };
  Entry& FindOrAdd(MetricType type, const std::string& name, const std::string& help,
                   std::vector<std::string> label_names, std::vector<double> bounds);
  // Appends a counter's or gauge's series to the exposition, a `name{labels} value` line each.
  template <typename T>
  static void AppendValueSeries(const MetricFamily<T>& family, std::string* out);

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> families_ ABSL_GUARDED_BY(mu_);
};

// The process-wide registry that /metrics serves.
MetricsRegistry& DefaultMetrics();

// Escapes a label value for the text format (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& value);
// Formats a sample value as the text format wants it ("+Inf", "-Inf", "NaN", shortest exact
// decimal otherwise).
std::string FormatMetricValue(double value);

struct MetricsHttpOptions {
  std::string host = "0.0.0.0";  // empty: every IPv4 address, as "0.0.0.0"
  int port = 0;  // 0: the kernel picks one; see MetricsHttpServer::port()
  // A connection that has not sent its whole request, or not taken the response, within this
  // long is dropped: a slow client holds one of the server's threads at most this long. (The wait
  // for the first byte of a request is rounded up to whole seconds.)
  absl::Duration io_timeout = absl::Seconds(2);
};

// Serves GET /metrics (the registry's exposition) and GET /healthz (200 "ok", or 503 with the
// message when `health` returns an error) over HTTP/1.x with cpp-httplib, on a small pool of
// threads, closing each connection after one response. HEAD is answered like GET without the
// body; other paths get 404, other methods 405, malformed requests 400, over-long ones 414.
class MetricsHttpServer {
 public:
  // Binds and starts serving. `registry` must outlive the server. `health` may be empty (then
  // /healthz is always 200); it runs on a server thread, never two calls at once.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpOptions& options, const MetricsRegistry* registry,
      std::function<absl::Status()> health = nullptr);

  // Stop().
  ~MetricsHttpServer();

  // Stops accepting, closes the port, and joins the threads (a connection in progress finishes
  // or times out first). Idempotent.
  void Stop();

  int port() const { return port_; }

 private:
  MetricsHttpServer(std::unique_ptr<httplib::Server> http, int port);

  const std::unique_ptr<httplib::Server> http_;
  const int port_;
  absl::Notification done_;  // the serving thread has returned
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// --- Implementation of the template ---------------------------------------------------------------

template <typename T>
T* MetricFamily<T>::WithLabels(const std::vector<std::string>& values) {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(values);
  if (it != series_.end()) return it->second.get();
  if (values.size() != label_names_.size()) {
    metrics_internal::DieOnLabelCountMismatch(name_, label_names_.size(), values.size());
  }
  std::unique_ptr<T> series;
  if constexpr (std::is_same_v<T, Histogram>) {
    series = std::make_unique<Histogram>(bounds_);
  } else {
    series = std::make_unique<T>();
  }
  T* ptr = series.get();
  series_.emplace(values, std::move(series));
  return ptr;
}

}  // namespace k3

#endif  // K3SERVE_CLUSTER_METRICS_H_
