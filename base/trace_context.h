// TraceContext: a W3C Trace Context (https://www.w3.org/TR/trace-context/) carried with a request
// across the tiers. A client may send a `traceparent` header (gRPC metadata or HTTP) with a
// Generate call; when it is well-formed and sampled, each tier records its spans of that request
// (cluster/span_log.h) under the client's trace id, and passes the context on in the data-plane
// messages (moe/moe_wire.h) so that the router and expert spans of a token hang under the
// attention worker's step span.
//
// Plain data; the parse and format functions are thread-safe.
#ifndef K3SERVE_BASE_TRACE_CONTEXT_H_
#define K3SERVE_BASE_TRACE_CONTEXT_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace k3 {

// The metadata key (and HTTP header) that carries a context.
inline constexpr char kTraceparentHeader[] = "traceparent";

struct TraceContext {
  std::array<uint8_t, 16> trace_id{};
  // The span the work belongs under: the caller's span (its parent-id).
  std::array<uint8_t, 8> span_id{};
  uint8_t flags = 0;  // trace-flags; bit 0: sampled

  bool sampled() const { return (flags & 1) != 0; }
  // The same trace under another span (the one the holder starts).
  TraceContext WithSpan(const std::array<uint8_t, 8>& span) const;
  bool operator==(const TraceContext&) const = default;
};

// Parses a traceparent value: version 00 "00-<32 hex>-<16 hex>-<2 hex>" (lowercase), or a higher
// version whose first four fields have that form (the spec's forward compatibility).
// INVALID_ARGUMENT for anything else, version ff, or an all-zero trace or parent id; per the spec,
// a receiver then starts no trace (it does not fail the request).
absl::StatusOr<TraceContext> ParseTraceparent(std::string_view value);
// "00-<trace id>-<span id>-<flags>".
std::string FormatTraceparent(const TraceContext& context);

// A random non-zero span id.
std::array<uint8_t, 8> NewSpanId();
// Lowercase hex of ids.
std::string HexId(const uint8_t* bytes, size_t size);
template <size_t N>
std::string HexId(const std::array<uint8_t, N>& id) {
  return HexId(id.data(), N);
}

}  // namespace k3

#endif  // K3SERVE_BASE_TRACE_CONTEXT_H_
