#include "tokenizer/json_grammar.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {

using nlohmann::ordered_json;

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
  int min_length = 0, max_length = -1;   // string, in characters
  bool integer = false;                  // number
  std::string literal;                   // literal: its JSON text
};

namespace {

using Kind = JsonNode::Kind;
using Frame = JsonMatcher::Frame;
using Thread = JsonMatcher::Thread;

constexpr int kMaxAnyDepth = 4;
constexpr int kMaxDigits = 16;

// Object phases: '{' read; in a key; ':' next; in a value; ',' or '}' next; a key next.
enum ObjectPhase { kObjOpen, kObjFirst, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNextKey };
// Array phases.
enum ArrayPhase { kArrOpen, kArrFirst, kArrItem, kArrAfter, kArrNext };
// Number phases (JSON's number grammar); accepting: kInt, kZero, kFrac, kExp.
enum NumberPhase { kNumStart, kMinus, kInt, kZero, kDot, kFrac, kE, kESign, kExp };

}  // namespace

class JsonGrammarBuilder {
 public:
  explicit JsonGrammarBuilder(JsonGrammar* grammar) : g_(grammar) {}

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

  absl::StatusOr<const JsonNode*> Compile(const ordered_json& schema, int depth) {
    if (schema.is_boolean() && schema.get<bool>()) return Any(depth);
    if (!schema.is_object()) return absl::InvalidArgumentError("a schema must be an object");
    if (schema.contains("$ref")) return absl::InvalidArgumentError("$ref is not supported");
    if (schema.contains("const")) return Literal(schema["const"]);
    if (auto it = schema.find("enum"); it != schema.end() && it->is_array()) {
      JsonNode* n = New(Kind::kUnion);
      for (const ordered_json& value : *it) n->options.push_back(Literal(value));
      return n;
    }
    for (const char* name : {"anyOf", "oneOf"}) {
      if (auto it = schema.find(name); it != schema.end() && it->is_array()) {
        JsonNode* n = New(Kind::kUnion);
        for (const ordered_json& option : *it) {
          K3_ASSIGN_OR_RETURN(const JsonNode* compiled, Compile(option, depth));
          n->options.push_back(compiled);
        }
        return n;
      }
    }
    auto type = schema.find("type");
    if (type == schema.end()) {
      if (schema.contains("properties")) return Typed(schema, "object", depth);
      if (schema.contains("items")) return Typed(schema, "array", depth);
      return Any(depth);
    }
    if (type->is_string()) return Typed(schema, type->get<std::string>(), depth);
    if (!type->is_array()) return absl::InvalidArgumentError("'type' must be a string or list");
    JsonNode* n = New(Kind::kUnion);
    for (const ordered_json& t : *type) {
      if (!t.is_string()) return absl::InvalidArgumentError("'type' must list strings");
      K3_ASSIGN_OR_RETURN(const JsonNode* compiled, Typed(schema, t.get<std::string>(), depth));
      n->options.push_back(compiled);
    }
    return n;
  }

 private:
  static int IntOr(const ordered_json& schema, const char* name, int fallback) {
    auto it = schema.find(name);
    return it != schema.end() && it->is_number_integer() ? it->get<int>() : fallback;
  }

  absl::StatusOr<const JsonNode*> Typed(const ordered_json& schema, const std::string& type,
                                        int depth) {
    if (type == "string") {
      JsonNode* n = New(Kind::kString);
      n->min_length = IntOr(schema, "minLength", 0);
      n->max_length = IntOr(schema, "maxLength", -1);
      return n;
    }
    if (type == "number" || type == "integer") {
      JsonNode* n = New(Kind::kNumber);
      n->integer = type == "integer";
      return n;
    }
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
        K3_ASSIGN_OR_RETURN(const JsonNode* compiled, Compile(*items, depth + 1));
        n->items = compiled;
      }
      return n;
    }
    if (type == "object") return Object(schema, depth);
    return absl::InvalidArgumentError(absl::StrCat("unknown schema type '", type, "'"));
  }

  absl::StatusOr<const JsonNode*> Object(const ordered_json& schema, int depth) {
    JsonNode* n = New(Kind::kObject);
    std::vector<std::string> required;
    if (auto it = schema.find("required"); it != schema.end() && it->is_array()) {
      for (const ordered_json& name : *it) {
        if (name.is_string()) required.push_back(name.get<std::string>());
      }
    }
    if (auto it = schema.find("properties"); it != schema.end() && it->is_object()) {
      for (auto p = it->begin(); p != it->end(); ++p) {
        K3_ASSIGN_OR_RETURN(const JsonNode* value, Compile(p.value(), depth + 1));
        const bool is_required =
            std::find(required.begin(), required.end(), p.key()) != required.end();
        n->properties.push_back({Literal(p.key()), value, is_required});
      }
    }
    auto additional = schema.find("additionalProperties");
    if (additional == schema.end() || (additional->is_boolean() && additional->get<bool>())) {
      n->additional = Any(depth + 1);
    } else if (additional->is_object()) {
      K3_ASSIGN_OR_RETURN(const JsonNode* value, Compile(*additional, depth + 1));
      n->additional = value;
    }
    n->additional_key = New(Kind::kString);
    return n;
  }

  JsonGrammar* g_;
};

JsonGrammar::~JsonGrammar() = default;

absl::StatusOr<std::shared_ptr<const JsonGrammar>> JsonGrammar::FromSchema(
    const ordered_json& schema) {
  std::shared_ptr<JsonGrammar> grammar(new JsonGrammar());
  JsonGrammarBuilder builder(grammar.get());
  K3_ASSIGN_OR_RETURN(const JsonNode* root, builder.Compile(schema, 0));
  grammar->root_ = root;
  return grammar;
}

std::shared_ptr<const JsonGrammar> JsonGrammar::AnyObject() {
  std::shared_ptr<JsonGrammar> grammar(new JsonGrammar());
  JsonGrammarBuilder builder(grammar.get());
  grammar->root_ = builder.AnyObject(0);
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

bool NumberAccepts(int phase) {
  return phase == kInt || phase == kZero || phase == kFrac || phase == kExp;
}

// The number phase after `b`, or -1.
int NumberNext(Frame& f, const JsonNode& n, uint8_t b) {
  const bool digit = b >= '0' && b <= '9';
  switch (f.phase) {
    case kNumStart:
      if (b == '-') return kMinus;
      [[fallthrough]];
    case kMinus:
      if (b == '0') return kZero;
      return digit ? (f.count = 1, kInt) : -1;
    case kInt:
      if (digit) return ++f.count <= kMaxDigits ? kInt : -1;
      [[fallthrough]];
    case kZero:
      if (n.integer) return -1;
      if (b == '.') return kDot;
      return b == 'e' || b == 'E' ? kE : -1;
    case kDot:
      return digit ? (f.count = 1, kFrac) : -1;
    case kFrac:
      if (digit) return ++f.count <= kMaxDigits ? kFrac : -1;
      return b == 'e' || b == 'E' ? kE : -1;
    case kE:
      if (b == '+' || b == '-') return kESign;
      [[fallthrough]];
    case kESign:
      return digit ? (f.count = 1, kExp) : -1;
    case kExp:
      return digit && ++f.count <= 3 ? kExp : -1;
  }
  return -1;
}

void Step(Thread t, uint8_t b, std::vector<Thread>* out);

void StepString(Thread& t, uint8_t b, std::vector<Thread>* out) {
  Frame& f = t.back();
  const JsonNode& n = *f.node;
  auto one_more = [&] { return n.max_length < 0 || ++f.count <= n.max_length; };
  switch (f.phase) {
    case 0:
      if (b != '"') return;
      f.phase = 1;
      break;
    case 1:  // index: continuation bytes the character still needs (valid UTF-8 only)
      if ((b & 0xC0) == 0x80) {
        if (f.index == 0) return;
        --f.index;
      } else if (f.index > 0 || b < 0x20 || b > 0xF4 || b == 0xC0 || b == 0xC1) {
        return;
      } else if (b == '"') {
        if (f.count < n.min_length) return;
        Return(t);
      } else if (b == '\\') {
        if (n.max_length >= 0 && f.count >= n.max_length) return;  // no room for what it escapes
        f.phase = 2;
      } else if (!one_more()) {
        return;
      } else {
        f.index = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
      }
      break;
    case 2:
      if (b == 'u') {
        f.phase = 3;
        f.index = 0;
      } else if (std::string_view("\"\\/bfnrt").find(b) != std::string_view::npos) {
        if (!one_more()) return;
        f.phase = 1;
      } else {
        return;
      }
      break;
    default:
      if (!absl::ascii_isxdigit(b)) return;
      if (++f.index == 4) {
        if (!one_more()) return;
        f.phase = 1;
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
          t.push_back({.node = n.additional_key, .phase = 1});
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
      const int phase = f.phase;
      const int next = NumberNext(f, n, b);
      if (next >= 0) {
        f.phase = next;
        out->push_back(std::move(t));
      } else if (NumberAccepts(phase)) {  // the number ended before `b`
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
        NumberAccepts(t.back().phase)) {
      return true;
    }
  }
  return false;
}

}  // namespace k3
