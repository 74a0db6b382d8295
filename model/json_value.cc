#include "model/json_value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/status_macros.h"

namespace k3 {
namespace json {

using google::protobuf::Value;

// Doubles hold every integer up to 2^53 exactly; above that a JSON integer may have been rounded.
constexpr double kMaxExactInteger = 9007199254740992.0;

// Our files nest a few levels. protobuf's parser has no depth limit and slows down quadratically
// with depth, so a hostile header of nested brackets would stall it: refuse deep text up front.
constexpr int kMaxDepth = 64;

bool TooDeep(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

absl::StatusOr<google::protobuf::Struct> ParseObject(std::string_view text) {
  // The parser's own message for a top-level array or scalar is obscure; say it plainly.
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || text[first] != '{') {
    return absl::InvalidArgumentError("not a JSON object");
  }
  if (TooDeep(text)) {
    return absl::InvalidArgumentError(absl::StrCat("JSON nested deeper than ", kMaxDepth, " levels"));
  }
  google::protobuf::Struct root;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &root);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: ", std::string(status.message().data(), status.message().size())));
  }
  return root;
}

std::string Describe(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return absl::StrCat("number ", value.number_value());
    case Value::kStringValue: {
      std::string s = value.string_value();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      std::string quoted;
      AppendQuoted(s, &quoted);
      return absl::StrCat("string ", quoted);
    }
    case Value::kBoolValue:
      return value.bool_value() ? "true" : "false";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    default:
      return "nothing";
  }
}

absl::StatusOr<int64_t> ToInt(const Value& value, std::string_view what, int64_t min, int64_t max) {
  if (value.kind_case() != Value::kNumberValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(what), " must be an integer, got ", Describe(value)));
  }
  double v = value.number_value();
  if (!std::isfinite(v) || std::floor(v) != v) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " must be an integer, got ", v));
  }
  if (std::fabs(v) > kMaxExactInteger) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " is too large to be exact: ", v));
  }
  if (v < static_cast<double>(min) || v > static_cast<double>(max)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(what), " must be in [", min, ", ", max, "], got ", static_cast<int64_t>(v)));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<float> ToFloat(const Value& value, std::string_view what) {
  if (value.kind_case() != Value::kNumberValue) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " must be a number, got ", Describe(value)));
  }
  double v = value.number_value();
  if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " must be a finite float, got ", v));
  }
  return static_cast<float>(v);
}

void AppendQuoted(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      absl::StrAppend(out, absl::StrFormat("\\u%04x", u));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

std::string FormatFloat(float value) {
  char buf[32];
  for (int precision = 6; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, static_cast<double>(value));
    if (std::strtof(buf, nullptr) == value) break;
  }
  return buf;
}

}  // namespace json
}  // namespace k3
