#include "cluster/span_log.h"

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace k3 {

absl::StatusOr<std::unique_ptr<SpanLog>> SpanLog::Open(const std::string& path,
                                                       std::string service) {
  std::FILE* file = std::fopen(path.c_str(), "ae");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open the trace file ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<SpanLog>(new SpanLog(file, std::move(service)));
}

SpanLog::~SpanLog() { std::fclose(file_); }

void SpanLog::Record(const Span& span) {
  nlohmann::json line = {
      {"name", span.name},
      {"trace_id", HexId(span.context.trace_id)},
      {"span_id", HexId(span.context.span_id)},
      {"parent_span_id", HexId(span.parent)},
      {"start_time_unix_nano", absl::ToUnixNanos(span.start)},
      {"end_time_unix_nano", absl::ToUnixNanos(span.end)},
      {"service", service_},
  };
  nlohmann::json attributes = nlohmann::json::object();
  for (const auto& [key, value] : span.attributes) attributes[key] = value;
  line["attributes"] = std::move(attributes);
  const std::string text = line.dump() + "\n";
  absl::MutexLock lock(&mu_);
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    if (!write_failed_) LOG(ERROR) << "cannot write the trace file: " << std::strerror(errno);
    write_failed_ = true;
  }
}

}  // namespace k3
