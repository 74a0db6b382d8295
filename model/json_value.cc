#include "model/json_value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {
namespace json {
namespace {

using Json = nlohmann::json;

// Doubles hold every integer up to 2^53 exactly; a float beyond that may have been rounded.
constexpr double kMaxExactInteger = 9007199254740992.0;

// Our files nest a few levels. Refusing deep text stops a hostile header of nested brackets early,
// before the parser has built (and must free) millions of containers.
constexpr int kMaxDepth = 64;

// Thrown by the parse callback to stop at the first container past kMaxDepth; caught in
// ParseObject.
struct TooDeep {};

absl::Status RangeError(std::string_view what, int64_t min, int64_t max, std::string_view got) {
  return absl::InvalidArgumentError(
      absl::StrCat(Sv(what), " must be in [", min, ", ", max, "], got ", Sv(got)));
}

}  // namespace

absl::StatusOr<Json> ParseObject(std::string_view text) {
  // `depth` counts the containers around the one being opened: 0 for the top-level object.
  const Json::parser_callback_t limit_depth = [](int depth, Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start ||
         event == Json::parse_event_t::array_start) &&
        depth >= kMaxDepth) {
      throw TooDeep();
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text.begin(), text.end(), limit_depth);
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nested deeper than ", kMaxDepth, " levels"));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("not a JSON object");
  return root;
}

std::string Describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::number_integer:
      return absl::StrCat("number ", value.get<int64_t>());
    case Json::value_t::number_unsigned:
      return absl::StrCat("number ", value.get<uint64_t>());
    case Json::value_t::number_float:
      return absl::StrCat("number ", value.get<double>());
    case Json::value_t::string: {
      std::string s = value.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      std::string quoted;
      AppendQuoted(s, &quoted);
      return absl::StrCat("string ", quoted);
    }
    case Json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "a list";
    default:
      return "nothing";
  }
}

absl::StatusOr<int64_t> ToInt(const Json& value, std::string_view what, int64_t min, int64_t max) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (max < 0 || v > static_cast<uint64_t>(max) || static_cast<int64_t>(v) < min) {
      return RangeError(what, min, max, absl::StrCat(v));
    }
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < min || v > max) return RangeError(what, min, max, absl::StrCat(v));
    return v;
  }
  if (!value.is_number_float()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(what), " must be an integer, got ", Describe(value)));
  }
  const double v = value.get<double>();
  if (!std::isfinite(v) || std::floor(v) != v) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " must be an integer, got ", v));
  }
  if (std::fabs(v) > kMaxExactInteger) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " is too large to be exact: ", v));
  }
  if (v < static_cast<double>(min) || v > static_cast<double>(max)) {
    return RangeError(what, min, max, absl::StrCat(static_cast<int64_t>(v)));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<float> ToFloat(const Json& value, std::string_view what) {
  if (!value.is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " must be a number, got ", Describe(value)));
  }
  const double v = value.get<double>();
  if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " must be a finite float, got ", v));
  }
  return static_cast<float>(v);
}

void AppendQuoted(std::string_view s, std::string* out) {
  out->append(Json(std::string(s)).dump(-1, ' ', /*ensure_ascii=*/false,
                                        Json::error_handler_t::replace));
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
