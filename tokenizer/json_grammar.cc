#include "tokenizer/json_grammar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {

using nlohmann::ordered_json;

// Bounded numbers are compared exactly in units of 10^-kScaleDigits (int128: 16 integer digits
// and 6 fraction digits need 10^22).
using Scaled = __int128;

struct JsonNode {
  enum class Kind { kUnion, kObject, kArray, kString, kNumber, kLiteral };
  struct Property {
    const JsonNode* key;  // a literal: the key as JSON text, quotes included
    const JsonNode* value;
    bool required;
  };
  Kind kind;
  std::vector<const JsonNode*> options;  // union
  std::vector<Property> properties;      // object
  const JsonNode* additional = nullptr;  // object: other members' values; null: none allowed
  const JsonNode* additional_key = nullptr;  // object: a string node for other members' keys
  const JsonNode* items = nullptr;       // array
  int min_items = 0, max_items = -1;     // array; -1: unbounded
  int min_length = 0, max_length = -1;   // string, in code points
  bool integer = false;                  // number
  // Number: with bounds or multipleOf, written without exponent, with at most 6 fraction
  // digits (none for integers), and every prefix checked to still reach a value in range.
  bool bounded = false;
  Scaled low = 0, high = 0;  // bounded: the range, inclusive, in units of 10^-6
  Scaled multiple = 0;       // bounded integer: multipleOf in units of 10^-6 (0: none)
  std::string literal;       // literal: its JSON text
  int min_bytes = -1;        // the shortest value's bytes; -1: no value (set by Finish)
};

namespace {

using Kind = JsonNode::Kind;
using Frame = JsonMatcher::Frame;
using Thread = JsonMatcher::Thread;

constexpr int kMaxAnyDepth = 4;
constexpr int kMaxDigits = 16;
constexpr int kScaleDigits = 6;

// Object phases: '{' read; in a key; ':' next; in a value; ',' or '}' next; a key next.
enum ObjectPhase { kObjOpen, kObjFirst, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNextKey };
// Array phases.
enum ArrayPhase { kArrOpen, kArrFirst, kArrItem, kArrAfter, kArrNext };
// Number phases (JSON's number grammar); accepting: kInt, kZero, kFrac, kExp.
enum NumberPhase { kNumStart, kMinus, kInt, kZero, kDot, kFrac, kE, kESign, kExp };
// String phases: before '"'; in the text; after '\'; in \u's hex digits.
enum StringPhase { kStrOpen, kStrText, kStrEscape, kStrHex };

constexpr int kAnyContinuation = 0x80BF;

Scaled Pow10(int n) {
  Scaled p = 1;
  while (n-- > 0) p *= 10;
  return p;
}
Scaled FloorDiv(Scaled a, Scaled b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
Scaled CeilDiv(Scaled a, Scaled b) { return -FloorDiv(-a, b); }

// Keywords that constrain nothing the grammar writes.
bool Annotation(const std::string& key) {
  static const absl::flat_hash_set<std::string> kAnnotations = {
      "title",   "description", "default",    "examples", "$schema",  "$id",
      "$comment", "$defs",      "definitions", "deprecated", "readOnly", "writeOnly"};
  return kAnnotations.contains(key);
}

bool Enforced(const std::string& key) {
  static const absl::flat_hash_set<std::string> kEnforced = {
      "type",     "enum",     "const",     "properties", "required",         "additionalProperties",
      "items",    "minItems", "maxItems",  "minLength",  "maxLength",        "anyOf",
      "minimum",  "maximum",  "exclusiveMinimum",        "exclusiveMaximum", "multipleOf"};
  return kEnforced.contains(key);
}

// Whether `value` is of JSON Schema type `type`.
bool OfType(const ordered_json& value, const std::string& type) {
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() ||
           (value.is_number_float() && std::trunc(value.get<double>()) == value.get<double>());
  }
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  return false;
}

}  // namespace

class JsonGrammarBuilder {
 public:
  JsonGrammarBuilder(JsonGrammar* grammar, bool strict) : g_(grammar), strict_(strict) {}

  JsonNode* New(Kind kind) {
    g_->nodes_.push_back(std::make_unique<JsonNode>());
    g_->nodes_.back()->kind = kind;
    return g_->nodes_.back().get();
  }

  const JsonNode* Literal(const ordered_json& value) {
    JsonNode* n = New(Kind::kLiteral);
    n->literal = value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    return n;
  }

  const JsonNode* Any(int depth) {
    JsonNode* n = New(Kind::kUnion);
    n->options = {New(Kind::kString), New(Kind::kNumber), Literal(true), Literal(false),
                  Literal(nullptr)};
    if (depth < kMaxAnyDepth) {
      n->options.push_back(AnyObject(depth));
      JsonNode* array = New(Kind::kArray);
      array->items = Any(depth + 1);
      n->options.push_back(array);
    }
    return n;
  }

  const JsonNode* AnyObject(int depth) {
    JsonNode* n = New(Kind::kObject);
    n->additional = Any(depth + 1);
    n->additional_key = New(Kind::kString);
    return n;
  }

  absl::StatusOr<const JsonNode*> Compile(const ordered_json& schema, int depth,
                                          const std::string& path) {
    if (schema.is_boolean() && schema.get<bool>()) return Any(depth);
    if (!schema.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("the schema at ", path, " must be an object"));
    }
    if (schema.contains("$ref")) return absl::InvalidArgumentError("$ref is not supported");
    K3_RETURN_IF_ERROR(CheckKeywords(schema, path));
    auto type = schema.find("type");
    std::vector<std::string> types;
    if (type != schema.end()) {
      if (type->is_string()) {
        types.push_back(type->get<std::string>());
      } else if (type->is_array()) {
        for (const ordered_json& t : *type) {
          if (!t.is_string()) return Bad(path, "'type' must list strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Bad(path, "'type' must be a string or list");
      }
    }
    auto typed = [&](const ordered_json& value) {
      return types.empty() || std::any_of(types.begin(), types.end(), [&](const std::string& t) {
               return OfType(value, t);
             });
    };
    if (auto it = schema.find("const"); it != schema.end()) {
      JsonNode* n = New(Kind::kUnion);
      if (typed(*it)) n->options.push_back(Literal(*it));
      return n;
    }
    if (auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array()) return Bad(path, "'enum' must be a list");
      JsonNode* n = New(Kind::kUnion);
      for (const ordered_json& value : *it) {
        if (typed(value)) n->options.push_back(Literal(value));
      }
      return n;
    }
    for (const char* name : {"anyOf", "oneOf"}) {
      if (auto it = schema.find(name); it != schema.end()) {
        if (!it->is_array()) return Bad(path, absl::StrCat("'", name, "' must be a list"));
        JsonNode* n = New(Kind::kUnion);
        for (size_t i = 0; i < it->size(); ++i) {
          K3_ASSIGN_OR_RETURN(const JsonNode* compiled,
                              Compile((*it)[i], depth, absl::StrCat(path, "/", name, "/", i)));
          n->options.push_back(compiled);
        }
        return n;
      }
    }
    if (types.empty()) {
      if (schema.contains("properties")) return Typed(schema, "object", depth, path);
      if (schema.contains("items")) return Typed(schema, "array", depth, path);
      return Any(depth);
    }
    if (types.size() == 1) return Typed(schema, types[0], depth, path);
    JsonNode* n = New(Kind::kUnion);
    for (const std::string& t : types) {
      K3_ASSIGN_OR_RETURN(const JsonNode* compiled, Typed(schema, t, depth, path));
      n->options.push_back(compiled);
    }
    return n;
  }

  // Sets min_bytes of `node` and what it reaches; drops the choices no value can take (union
  // options, optional properties, array items), so that the matcher never enters a dead end.
  int Finish(const JsonNode* const_node) {
    JsonNode* n = const_cast<JsonNode*>(const_node);  // owned by g_, being built
    if (auto it = finished_.find(n); it != finished_.end()) return it->second;
    finished_[n] = -1;  // no cycles (no $ref), but a guard costs nothing
    int bytes = -1;
    switch (n->kind) {
      case Kind::kLiteral:
        bytes = static_cast<int>(n->literal.size());
        break;
      case Kind::kString:
        bytes = n->max_length >= 0 && n->max_length < n->min_length ? -1 : 2 + n->min_length;
        break;
      case Kind::kNumber:
        bytes = NumberMinBytes(*n);
        break;
      case Kind::kUnion: {
        std::vector<const JsonNode*> live;
        for (const JsonNode* option : n->options) {
          const int b = Finish(option);
          if (b < 0) continue;
          live.push_back(option);
          bytes = bytes < 0 ? b : std::min(bytes, b);
        }
        n->options = std::move(live);
        break;
      }
      case Kind::kArray: {
        const int item = Finish(n->items);
        if (item < 0) n->max_items = 0;
        if (n->max_items >= 0 && n->max_items < n->min_items) break;
        bytes = 2 + (n->min_items > 0 ? n->min_items * (item + 1) - 1 : 0);
        break;
      }
      case Kind::kObject: {
        bytes = 2;
        int members = 0;
        std::vector<JsonNode::Property> live;
        for (const JsonNode::Property& p : n->properties) {
          const int value = Finish(p.value);
          if (value < 0 && p.required) {
            bytes = -1;
            break;
          }
          if (value < 0) continue;
          live.push_back(p);
          if (p.required) bytes += static_cast<int>(p.key->literal.size()) + 1 + value + (members++ > 0);
        }
        if (bytes < 0) break;
        n->properties = std::move(live);
        if (n->additional != nullptr && Finish(n->additional) < 0) n->additional = nullptr;
        Finish(n->additional_key);
        break;
      }
    }
    n->min_bytes = bytes;
    finished_[n] = bytes;
    return bytes;
  }

 private:
  static absl::Status Bad(const std::string& path, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("the schema at ", path, ": ", what));
  }

  // With strict, a keyword the grammar cannot enforce is an error naming it.
  absl::Status CheckKeywords(const ordered_json& schema, const std::string& path) const {
    if (!strict_) return absl::OkStatus();
    for (auto it = schema.begin(); it != schema.end(); ++it) {
      const std::string& key = it.key();
      if (Annotation(key)) continue;
      bool enforced = Enforced(key);
      if (key == "exclusiveMinimum" || key == "exclusiveMaximum") enforced = it->is_number();
      if (key == "multipleOf") {
        const auto type = schema.find("type");
        enforced = type != schema.end() && *type == "integer" && it->is_number_integer() &&
                   it->get<int64_t>() > 0;
      }
      if (!enforced) {
        return absl::InvalidArgumentError(absl::StrCat(
            "strict: the schema keyword '", key, "' at ", path,
            " cannot be enforced by constrained decoding (drop it or set strict to false)"));
      }
    }
    return absl::OkStatus();
  }

  static int IntOr(const ordered_json& schema, const char* name, int fallback) {
    auto it = schema.find(name);
    if (it == schema.end() || !it->is_number_integer()) return fallback;
    return static_cast<int>(std::clamp<int64_t>(it->get<int64_t>(), 0, 1 << 20));
  }

  absl::StatusOr<const JsonNode*> Typed(const ordered_json& schema, const std::string& type,
                                        int depth, const std::string& path) {
    if (type == "string") {
      JsonNode* n = New(Kind::kString);
      n->min_length = IntOr(schema, "minLength", 0);
      n->max_length = IntOr(schema, "maxLength", -1);
      return n;
    }
    if (type == "number" || type == "integer") return Number(schema, type == "integer");
    if (type == "boolean") {
      JsonNode* n = New(Kind::kUnion);
      n->options = {Literal(true), Literal(false)};
      return n;
    }
    if (type == "null") return Literal(nullptr);
    if (type == "array") {
      JsonNode* n = New(Kind::kArray);
      n->min_items = IntOr(schema, "minItems", 0);
      n->max_items = IntOr(schema, "maxItems", -1);
      auto items = schema.find("items");
      if (items == schema.end()) {
        n->items = Any(depth + 1);
      } else {
        K3_ASSIGN_OR_RETURN(const JsonNode* compiled,
                            Compile(*items, depth + 1, absl::StrCat(path, "/items")));
        n->items = compiled;
      }
      return n;
    }
    if (type == "object") return Object(schema, depth, path);
    return Bad(path, absl::StrCat("unknown type '", type, "'"));
  }

  // A schema no number satisfies is left to Finish (min_bytes -1).
  const JsonNode* Number(const ordered_json& schema, bool integer) {
    JsonNode* n = New(Kind::kNumber);
    n->integer = integer;
    const Scaled unit = Pow10(kScaleDigits);
    // Beyond 16 digits nothing can be written anyway.
    const long double limit = 1e17L * static_cast<long double>(unit);
    n->low = -static_cast<Scaled>(limit);
    n->high = static_cast<Scaled>(limit);
    auto bound = [&](const char* name, bool lower, bool exclusive) {
      auto it = schema.find(name);
      if (it == schema.end() || !it->is_number()) return;
      n->bounded = true;
      const long double v =
          std::clamp(it->get<long double>() * static_cast<long double>(unit), -limit, limit);
      if (lower) {
        n->low = std::max(n->low, static_cast<Scaled>(exclusive ? std::floor(v) + 1 : std::ceil(v)));
      } else {
        n->high = std::min(n->high, static_cast<Scaled>(exclusive ? std::ceil(v) - 1 : std::floor(v)));
      }
    };
    bound("minimum", true, false);
    bound("maximum", false, false);
    bound("exclusiveMinimum", true, true);
    bound("exclusiveMaximum", false, true);
    if (auto it = schema.find("multipleOf"); integer && it != schema.end() &&
                                             it->is_number_integer() && it->get<int64_t>() > 0) {
      n->bounded = true;
      n->multiple = static_cast<Scaled>(it->get<int64_t>()) * unit;
    }
    return n;
  }

  absl::StatusOr<const JsonNode*> Object(const ordered_json& schema, int depth,
                                         const std::string& path) {
    JsonNode* n = New(Kind::kObject);
    std::vector<std::string> required;
    if (auto it = schema.find("required"); it != schema.end() && it->is_array()) {
      for (const ordered_json& name : *it) {
        if (name.is_string()) required.push_back(name.get<std::string>());
      }
    }
    ordered_json properties = ordered_json::object();
    if (auto it = schema.find("properties"); it != schema.end() && it->is_object()) {
      properties = *it;
    }
    // A required member the properties do not describe is still written (any value).
    for (const std::string& name : required) {
      if (!properties.contains(name)) properties[name] = true;
    }
    for (auto p = properties.begin(); p != properties.end(); ++p) {
      K3_ASSIGN_OR_RETURN(const JsonNode* value,
                          Compile(p.value(), depth + 1, absl::StrCat(path, "/properties/", p.key())));
      const bool is_required =
          std::find(required.begin(), required.end(), p.key()) != required.end();
      n->properties.push_back({Literal(p.key()), value, is_required});
    }
    auto additional = schema.find("additionalProperties");
    if (additional == schema.end() || (additional->is_boolean() && additional->get<bool>())) {
      n->additional = Any(depth + 1);
    } else if (additional->is_object()) {
      K3_ASSIGN_OR_RETURN(const JsonNode* value,
                          Compile(*additional, depth + 1, absl::StrCat(path, "/additionalProperties")));
      n->additional = value;
    }
    n->additional_key = New(Kind::kString);
    return n;
  }

  static int NumberMinBytes(const JsonNode& n);

  JsonGrammar* g_;
  const bool strict_;
  std::unordered_map<const JsonNode*, int> finished_;
};

namespace {

// A bounded number's prefix: sign, integer part (`digits` of it, `value`), and, once the '.' is
// read, the fraction's digits so far.
struct NumberPrefix {
  bool negative = false;
  int digits = 0;
  int64_t value = 0;
  bool fraction = false;
  int fraction_digits = 0;
  int64_t fraction_value = 0;
};

// Whether a number of `n` has, in units of 10^-scale, a value v*sign with v in [a, b].
bool Reaches(const JsonNode& n, bool negative, Scaled a, Scaled b, int scale) {
  if (negative) {
    const Scaled positive_a = a;
    a = -b;
    b = -positive_a;
  }
  const Scaled step = Pow10(kScaleDigits - scale);
  Scaled lo = std::max(a, CeilDiv(n.low, step));
  const Scaled hi = std::min(b, FloorDiv(n.high, step));
  if (lo > hi) return false;
  if (n.multiple == 0) return true;
  // scale is 0 for integers: v * step must be a multiple.
  const Scaled q = n.multiple / step;
  lo = CeilDiv(lo, q) * q;
  return lo <= hi;
}

// The fewest bytes that finish `p` into a number of `n`, or -1.
int NumberCompletion(const JsonNode& n, const NumberPrefix& p) {
  const int max_fraction = n.integer ? 0 : kScaleDigits;
  if (p.fraction) {
    const Scaled head = static_cast<Scaled>(p.value) * Pow10(p.fraction_digits) + p.fraction_value;
    for (int j = p.fraction_digits == 0 ? 1 : 0; p.fraction_digits + j <= max_fraction; ++j) {
      const Scaled a = head * Pow10(j);
      if (Reaches(n, p.negative, a, a + Pow10(j) - 1, p.fraction_digits + j)) return j;
    }
    return -1;
  }
  int best = -1;
  for (int k = 0; p.digits + k <= kMaxDigits; ++k) {
    Scaled a, b;
    if (p.digits == 0) {
      if (k == 0) continue;
      a = k == 1 ? 0 : Pow10(k - 1);
      b = Pow10(k) - 1;
    } else if (p.value == 0) {  // "0" takes no more integer digits
      if (k > 0) break;
      a = b = 0;
    } else {
      a = static_cast<Scaled>(p.value) * Pow10(k);
      b = a + Pow10(k) - 1;
    }
    if (best >= 0 && k >= best) break;
    if (Reaches(n, p.negative, a, b, 0)) return k;  // the cheapest with this many digits
    for (int j = 1; j <= max_fraction && (best < 0 || k + 1 + j < best); ++j) {
      if (Reaches(n, p.negative, a * Pow10(j), b * Pow10(j) + Pow10(j) - 1, j)) {
        best = k + 1 + j;
        break;
      }
    }
  }
  return best;
}

}  // namespace

int JsonGrammarBuilder::NumberMinBytes(const JsonNode& n) {
  if (!n.bounded) return 1;
  const int positive = NumberCompletion(n, {});
  const int negative = NumberCompletion(n, {.negative = true});
  if (negative < 0) return positive;
  return positive < 0 ? 1 + negative : std::min(positive, 1 + negative);
}

JsonGrammar::~JsonGrammar() = default;

int JsonGrammar::MinBytes() const { return root_->min_bytes; }

absl::StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::FromSchema(
    const ordered_json& schema, bool strict) {
  std::shared_ptr<JsonGrammar> grammar(new JsonGrammar());
  JsonGrammarBuilder builder(grammar.get(), strict);
  K3_ASSIGN_OR_RETURN(const JsonNode* root, builder.Compile(schema, 0, "#"));
  if (builder.Finish(root) < 0) {
    return absl::InvalidArgumentError("the schema admits no value (empty enum or bounds?)");
  }
  grammar->root_ = root;
  return grammar;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::AnyObject() {
  std::shared_ptr<JsonGrammar> grammar(new JsonGrammar());
  JsonGrammarBuilder builder(grammar.get(), false);
  grammar->root_ = builder.AnyObject(0);
  builder.Finish(grammar->root_);
  return grammar;
}

namespace {

// Pushes a value of `node` on `t`, one thread per choice of a union.
void Start(Thread t, const JsonNode* node, std::vector<Thread>* out) {
  if (node->kind == Kind::kUnion) {
    for (const JsonNode* option : node->options) Start(t, option, out);
    return;
  }
  t.push_back({node});
  out->push_back(std::move(t));
}

// The value on top of `t` is whole: pops it and moves its parent on.
void Return(Thread& t) {
  t.pop_back();
  if (t.empty()) return;
  Frame& parent = t.back();
  if (parent.node->kind == Kind::kArray) {
    parent.phase = kArrAfter;
    ++parent.count;
  } else if (parent.phase == kObjKey) {
    parent.phase = kObjColon;
  } else {
    parent.phase = kObjAfter;
    if (parent.index < static_cast<int>(parent.node->properties.size())) ++parent.index;
  }
}

bool RestOptional(const JsonNode& n, int from) {
  for (size_t i = from; i < n.properties.size(); ++i) {
    if (n.properties[i].required) return false;
  }
  return true;
}

NumberPrefix PrefixOf(const Frame& f) {
  NumberPrefix p{.negative = f.index == 1};
  if (f.phase == kDot || f.phase == kFrac) {
    p.fraction = true;
    p.fraction_digits = f.phase == kFrac ? f.count : 0;
    p.fraction_value = f.aux;
    p.digits = 1;  // any: only the value counts once in the fraction
    p.value = f.value;
  } else if (f.phase == kInt || f.phase == kZero) {
    p.digits = f.count;
    p.value = f.value;
  }
  return p;
}

bool NumberAccepts(const Frame& f) {
  const bool whole = f.phase == kInt || f.phase == kZero || f.phase == kFrac || f.phase == kExp;
  return whole && (!f.node->bounded || NumberCompletion(*f.node, PrefixOf(f)) == 0);
}

// The number phase after `b` (updating f's digits), or -1.
int NumberNext(Frame& f, const JsonNode& n, uint8_t b) {
  const bool digit = b >= '0' && b <= '9';
  const int d = b - '0';
  switch (f.phase) {
    case kNumStart:
      if (b == '-') {
        f.index = 1;
        return kMinus;
      }
      [[fallthrough]];
    case kMinus:
      if (!digit) return -1;
      f.count = 1;
      f.value = d;
      return d == 0 ? kZero : kInt;
    case kInt:
      if (digit) {
        if (++f.count > kMaxDigits) return -1;
        f.value = f.value * 10 + d;
        return kInt;
      }
      [[fallthrough]];
    case kZero:
      if (n.integer) return -1;
      if (b == '.') {
        f.count = 0;
        f.aux = 0;
        return kDot;
      }
      return (b == 'e' || b == 'E') && !n.bounded ? kE : -1;
    case kDot:
    case kFrac:
      if (digit) {
        if (++f.count > (n.bounded ? kScaleDigits : kMaxDigits)) return -1;
        if (n.bounded) f.aux = f.aux * 10 + d;
        return kFrac;
      }
      return f.phase == kFrac && (b == 'e' || b == 'E') && !n.bounded ? kE : -1;
    case kE:
      if (b == '+' || b == '-') return kESign;
      [[fallthrough]];
    case kESign:
      return digit ? (f.count = 1, kExp) : -1;
    case kExp:  // two digits: 1e308 and beyond overflow a double, and many parsers refuse them
      return digit && ++f.count <= 2 ? kExp : -1;
  }
  return -1;
}

void Step(Thread t, uint8_t b, std::vector<Thread>* out);

void StepString(Thread& t, uint8_t b, std::vector<Thread>* out) {
  Frame& f = t.back();
  const JsonNode& n = *f.node;
  auto one_more = [&] { return ++f.count <= n.max_length || n.max_length < 0; };
  switch (f.phase) {
    case kStrOpen:
      if (b != '"') return;
      f.phase = kStrText;
      break;
    case kStrText:  // index: continuation bytes the character still needs
      if (f.index > 0) {
        // Each continuation in its range (aux), the first one's narrowed by the lead byte
        // (Unicode's table 3-7), so that the character is a scalar value in its shortest form.
        if (b < (f.aux >> 8) || b > (f.aux & 0xFF)) return;
        --f.index;
        f.aux = kAnyContinuation;
      } else if (b < 0x20 || (b >= 0x80 && b < 0xC2) || b > 0xF4) {
        return;
      } else if (b == '"') {
        if (f.count < n.min_length) return;
        Return(t);
      } else if (b == '\\') {
        if (n.max_length >= 0 && f.count >= n.max_length) return;  // no room for what it escapes
        f.phase = kStrEscape;
      } else if (!one_more()) {
        return;
      } else {
        f.index = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
        f.aux = b == 0xE0   ? 0xA0BF
                : b == 0xED ? 0x809F
                : b == 0xF0 ? 0x90BF
                : b == 0xF4 ? 0x808F
                            : kAnyContinuation;
      }
      break;
    case kStrEscape:
      if (b == 'u') {
        f.phase = kStrHex;
        f.index = 0;
      } else if (std::string_view("\"\\/bfnrt").find(b) != std::string_view::npos) {
        if (!one_more()) return;
        f.phase = kStrText;
      } else {
        return;
      }
      break;
    default:  // kStrHex
      if (!absl::ascii_isxdigit(b)) return;
      // No surrogate (d800-dfff): alone it is no character, and pairs are not needed.
      {
        const char c = absl::ascii_tolower(b);
        if (f.index == 0) f.aux = c == 'd';
        if (f.index == 1 && f.aux == 1 && (c == '8' || c == '9' || c >= 'a')) return;
      }
      if (++f.index == 4) {
        if (!one_more()) return;
        f.phase = kStrText;
        f.index = 0;
      }
  }
  out->push_back(std::move(t));
}

void StepArray(Thread& t, uint8_t b, std::vector<Thread>* out) {
  Frame& f = t.back();
  const JsonNode& n = *f.node;
  const bool close = b == ']' && f.count >= n.min_items;
  if (f.phase == kArrOpen) {
    if (b != '[') return;
    f.phase = kArrFirst;
  } else if ((f.phase == kArrFirst || f.phase == kArrAfter) && close) {
    Return(t);
  } else if (f.phase == kArrAfter && b == ',' && (n.max_items < 0 || f.count < n.max_items)) {
    f.phase = kArrNext;
  } else if ((f.phase == kArrFirst && n.max_items != 0) || f.phase == kArrNext) {
    f.phase = kArrItem;
    std::vector<Thread> started;
    Start(std::move(t), n.items, &started);
    for (Thread& s : started) Step(std::move(s), b, out);
    return;
  } else {
    return;
  }
  out->push_back(std::move(t));
}

void StepObject(Thread& t, uint8_t b, std::vector<Thread>* out) {
  Frame& f = t.back();
  const JsonNode& n = *f.node;
  const int size = static_cast<int>(n.properties.size());
  switch (f.phase) {
    case kObjOpen:
      if (b != '{') return;
      f.phase = kObjFirst;
      break;
    case kObjFirst:
    case kObjAfter:
    case kObjNextKey:
      if (b == '}' && f.phase != kObjNextKey && RestOptional(n, f.index)) {
        Return(t);
      } else if (b == ',' && f.phase == kObjAfter && (f.index < size || n.additional)) {
        f.phase = kObjNextKey;
      } else if (b == '"' && f.phase != kObjAfter) {
        // A key: one of the properties still to come (skipping optional ones), or another.
        for (int j = f.index; j < size; ++j) {
          Thread key = t;
          key.back().index = j;
          key.back().phase = kObjKey;
          key.push_back({.node = n.properties[j].key, .index = 1});  // its '"' is read
          out->push_back(std::move(key));
          if (n.properties[j].required) break;
        }
        if (n.additional != nullptr && RestOptional(n, f.index)) {
          f.index = size;
          f.phase = kObjKey;
          t.push_back({.node = n.additional_key, .phase = kStrText});
          out->push_back(std::move(t));
        }
        return;
      } else {
        return;
      }
      break;
    case kObjColon:
      if (b != ':') return;
      {
        f.phase = kObjValue;
        const JsonNode* value = f.index < size ? n.properties[f.index].value : n.additional;
        Start(std::move(t), value, out);
        return;
      }
    default:
      return;
  }
  out->push_back(std::move(t));
}

void Step(Thread t, uint8_t b, std::vector<Thread>* out) {
  if (t.empty()) return;  // a whole value was read: nothing may follow
  Frame& f = t.back();
  const JsonNode& n = *f.node;
  switch (n.kind) {
    case Kind::kLiteral:
      if (b != static_cast<uint8_t>(n.literal[f.index])) return;
      if (++f.index == static_cast<int>(n.literal.size())) Return(t);
      out->push_back(std::move(t));
      return;
    case Kind::kNumber: {
      const bool whole = NumberAccepts(f);
      Frame before = f;
      const int next = NumberNext(f, n, b);
      if (next >= 0) {
        f.phase = next;
        if (!n.bounded || NumberCompletion(n, PrefixOf(f)) >= 0) out->push_back(std::move(t));
      } else if (whole) {  // the number ended before `b`
        f = before;
        Return(t);
        Step(std::move(t), b, out);
      }
      return;
    }
    case Kind::kString:
      return StepString(t, b, out);
    case Kind::kArray:
      return StepArray(t, b, out);
    case Kind::kObject:
      return StepObject(t, b, out);
    case Kind::kUnion:  // Start splits unions
      return;
  }
}

// Bytes that finish an object after a member, with properties from `index` still to come.
int ObjectAfterMember(const JsonNode& n, int index) {
  int bytes = 1;  // '}'
  for (size_t j = index; j < n.properties.size(); ++j) {
    const JsonNode::Property& p = n.properties[j];
    if (p.required) bytes += 1 + static_cast<int>(p.key->literal.size()) + 1 + p.value->min_bytes;
  }
  return bytes;
}

// Bytes that finish `f`, the top of a thread, itself.
int FrameRest(const Frame& f) {
  const JsonNode& n = *f.node;
  switch (n.kind) {
    case Kind::kLiteral:
      return static_cast<int>(n.literal.size()) - f.index;
    case Kind::kNumber:
      if (n.bounded) {
        if (f.phase == kNumStart) return n.min_bytes;
        return NumberCompletion(n, PrefixOf(f));
      }
      return f.phase == kInt || f.phase == kZero || f.phase == kFrac || f.phase == kExp ? 0 : 1;
    case Kind::kString: {
      const int chars_due = std::max(0, n.min_length - f.count);
      switch (f.phase) {
        case kStrOpen:
          return n.min_bytes;
        case kStrText:
          return f.index + chars_due + 1;
        case kStrEscape:
          return 1 + std::max(0, chars_due - 1) + 1;
        default:
          return 4 - f.index + std::max(0, chars_due - 1) + 1;
      }
    }
    case Kind::kArray: {
      const int item = n.items->min_bytes;
      switch (f.phase) {
        case kArrOpen:
          return n.min_bytes;
        case kArrFirst:
          return n.min_bytes - 1;
        case kArrAfter:
          return std::max(0, n.min_items - f.count) * (1 + item) + 1;
        case kArrNext:
          return item + std::max(0, n.min_items - f.count - 1) * (1 + item) + 1;
        default:  // kArrItem: the item is above
          return std::max(0, n.min_items - f.count - 1) * (1 + item) + 1;
      }
    }
    case Kind::kObject: {
      const int size = static_cast<int>(n.properties.size());
      auto value_then_rest = [&] {
        const JsonNode* value = f.index < size ? n.properties[f.index].value : n.additional;
        return value->min_bytes + ObjectAfterMember(n, f.index < size ? f.index + 1 : size);
      };
      switch (f.phase) {
        case kObjOpen:
          return n.min_bytes;
        case kObjFirst:
          return n.min_bytes - 1;
        case kObjAfter:
          return ObjectAfterMember(n, f.index);
        case kObjNextKey: {
          if (!RestOptional(n, f.index)) return ObjectAfterMember(n, f.index) - 1;
          int best = std::numeric_limits<int>::max();
          for (int j = f.index; j < size; ++j) {
            const JsonNode::Property& p = n.properties[j];
            best = std::min(best, static_cast<int>(p.key->literal.size()) + 1 + p.value->min_bytes);
          }
          if (n.additional != nullptr) best = std::min(best, 2 + 1 + n.additional->min_bytes);
          return best + 1;
        }
        case kObjKey:  // the key is above
          return 1 + value_then_rest();
        case kObjColon:
          return 1 + value_then_rest();
        default:  // kObjValue: the value is above
          return ObjectAfterMember(n, f.index < size ? f.index + 1 : size);
      }
    }
    case Kind::kUnion:
      break;
  }
  return 0;
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar)
    : grammar_(std::move(grammar)) {
  Start({}, grammar_->root(), &threads_);
}

bool JsonMatcher::Feed(std::string_view text) {
  for (char c : text) {
    std::vector<Thread> next;
    for (Thread& t : threads_) Step(std::move(t), static_cast<uint8_t>(c), &next);
    threads_ = std::move(next);
    if (threads_.empty()) return false;
  }
  return true;
}

bool JsonMatcher::CanEnd() const {
  for (const Thread& t : threads_) {
    if (t.empty()) return true;
    if (t.size() == 1 && t.back().node->kind == JsonNode::Kind::kNumber &&
        NumberAccepts(t.back())) {
      return true;
    }
  }
  return false;
}

int JsonMatcher::MinBytesToEnd() const {
  int best = -1;
  for (const Thread& t : threads_) {
    int bytes = 0;
    for (const Frame& f : t) {
      const int rest = FrameRest(f);
      if (rest < 0) {
        bytes = -1;
        break;
      }
      bytes += rest;
    }
    if (bytes >= 0 && (best < 0 || bytes < best)) best = bytes;
  }
  return best;
}

}  // namespace k3
