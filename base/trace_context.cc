#include "base/trace_context.h"

#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace k3 {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is not allowed either
}

// Decodes exactly 2 * N lowercase hex digits; false on any other character.
template <size_t N>
bool DecodeHex(std::string_view hex, std::array<uint8_t, N>* out) {
  if (hex.size() != 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <size_t N>
bool AllZero(const std::array<uint8_t, N>& id) {
  for (uint8_t b : id) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

TraceContext TraceContext::WithSpan(const std::array<uint8_t, 8>& span) const {
  TraceContext child = *this;
  child.span_id = span;
  return child;
}

absl::StatusOr<TraceContext> ParseTraceparent(std::string_view value) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("traceparent \"", std::string(value), "\": ", std::string(why)));
  };
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters.
  constexpr size_t kLength = 55;
  if (value.size() < kLength) return bad("too short");
  std::array<uint8_t, 1> version{};
  std::array<uint8_t, 1> flags{};
  TraceContext context;
  if (!DecodeHex(value.substr(0, 2), &version) || value[2] != '-' ||
      !DecodeHex(value.substr(3, 32), &context.trace_id) || value[35] != '-' ||
      !DecodeHex(value.substr(36, 16), &context.span_id) || value[52] != '-' ||
      !DecodeHex(value.substr(53, 2), &flags)) {
    return bad("not version-traceid-parentid-flags in lowercase hex");
  }
  if (version[0] == 0xff) return bad("version ff is invalid");
  // Version 00 is exactly 55 characters; later versions may append "-..." fields.
  if (value.size() != kLength && (version[0] == 0 || value[kLength] != '-')) {
    return bad("trailing characters");
  }
  if (AllZero(context.trace_id)) return bad("all-zero trace id");
  if (AllZero(context.span_id)) return bad("all-zero parent id");
  context.flags = flags[0];
  return context;
}

std::string FormatTraceparent(const TraceContext& context) {
  return absl::StrCat("00-", HexId(context.trace_id), "-", HexId(context.span_id), "-",
                      HexId(&context.flags, 1));
}

std::array<uint8_t, 8> NewSpanId() {
  static absl::Mutex mu;
  static std::mt19937_64* rng ABSL_GUARDED_BY(mu) = new std::mt19937_64(std::random_device{}());
  absl::MutexLock lock(&mu);
  std::array<uint8_t, 8> id{};
  uint64_t bits = 0;
  while (bits == 0) bits = (*rng)();
  for (size_t i = 0; i < 8; ++i) id[i] = static_cast<uint8_t>(bits >> (8 * i));
  return id;
}

std::string HexId(const uint8_t* bytes, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * size, '0');
  for (size_t i = 0; i < size; ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return hex;
}

}  // namespace k3
