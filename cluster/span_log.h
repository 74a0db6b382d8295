// SpanLog: where a process records the spans of traced requests (base/trace_context.h): one
// JSON object per line in a file (`--trace-file`), with OpenTelemetry's field names, so that a
// collector's file receiver or `jq` can read them and spans of all tiers join by trace_id and
// parent_span_id:
//
//   {"name":"k3.step","trace_id":"<32 hex>","span_id":"<16 hex>","parent_span_id":"<16 hex>",
//    "start_time_unix_nano":...,"end_time_unix_nano":...,"service":"attention-0",
//    "attributes":{"k3.rows":9,...}}
//
// Thread-safe: Record may be called from any thread; lines are written whole, in call order, and
// flushed at once (a killed process loses no recorded span).
#ifndef K3SERVE_CLUSTER_SPAN_LOG_H_
#define K3SERVE_CLUSTER_SPAN_LOG_H_

#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/trace_context.h"

namespace k3 {

struct Span {
  std::string name;
  TraceContext context;             // the trace, and this span's own id in span_id
  std::array<uint8_t, 8> parent{};  // the span it belongs under
  absl::Time start;
  absl::Time end;
  std::vector<std::pair<std::string, double>> attributes;
};

class SpanLog {
 public:
  // Appends to `path` (created if missing); `service` names the process in every span.
  // INVALID_ARGUMENT when the file cannot be opened for appending.
  static absl::StatusOr<std::unique_ptr<SpanLog>> Open(const std::string& path,
                                                       std::string service);
  ~SpanLog();
  SpanLog(const SpanLog&) = delete;
  SpanLog& operator=(const SpanLog&) = delete;

  // Writes one line. A failed write is logged (once) and the span dropped: tracing never fails
  // the request it describes.
  void Record(const Span& span);

 private:
  SpanLog(std::FILE* file, std::string service) : file_(file), service_(std::move(service)) {}

  absl::Mutex mu_;
  std::FILE* const file_ ABSL_PT_GUARDED_BY(mu_);
  const std::string service_;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_SPAN_LOG_H_
