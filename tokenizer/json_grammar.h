// Constrained decoding's JSON side: a JSON Schema compiled into a matcher that reads generated
// text byte by byte and says which bytes may come next, so that only text that can still become
// a value of the schema is generated. The text is compact JSON (no whitespace between tokens),
// object members come in the schema's `properties` order (those not `required` may be left
// out, members the schema does not name come after those it does), numbers have at most 16
// digits per part and 2 in the exponent (so that every number is a finite double) and
// schema-less values nest at most 4 deep. Every string admitted is valid
// UTF-8 (no overlong form, no surrogate, nothing above U+10FFFF, no \u escape of a surrogate),
// so its length in code points is what minLength / maxLength bound.
//
// Enforced schema keywords: type (one or a list), enum and const (values of any type; with
// `type`, only the values of that type), properties, required, additionalProperties (false,
// true or a schema), items, minItems, maxItems, minLength, maxLength, anyOf, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (numbers: a bounded number is written without exponent
// and with at most 6 fraction digits), multipleOf (integers). Annotations (title, description,
// default, examples, $schema, $id, $comment, $defs, definitions, deprecated, readOnly,
// writeOnly) mean nothing to the grammar. Any other keyword (pattern, format, oneOf, allOf,
// not, uniqueItems, multipleOf of a number, ...) cannot be enforced: `strict` compilation
// refuses it (InvalidArgument naming it); otherwise it is ignored and oneOf is read as anyOf
// (best effort: the value still follows what is enforced). $ref is always InvalidArgument, as
// is a schema no value can satisfy. {} and json_object accept any JSON value / object.
//
// A JsonGrammar is immutable and thread-safe; a JsonMatcher (its reading position) is a small
// value that is copied to try a continuation, and is not thread-safe.
#ifndef K3SERVE_TOKENIZER_JSON_GRAMMAR_H_
#define K3SERVE_TOKENIZER_JSON_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace k3 {

struct JsonNode;

class JsonGrammar {
 public:
  // `schema` a JSON Schema (an object); InvalidArgument where it cannot be compiled, or (with
  // `strict`) where it holds a keyword that cannot be enforced.
  static absl::StatusOr<std::shared_ptr<const JsonGrammar>> FromSchema(
      const nlohmann::ordered_json& schema, bool strict = false);
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> AnyObject();

  ~JsonGrammar();
  const JsonNode* root() const { return root_; }
  // The bytes of the shortest value of the schema (>= 1).
  int MinBytes() const;

 private:
  JsonGrammar() = default;
  std::vector<std::unique_ptr<JsonNode>> nodes_;
  const JsonNode* root_ = nullptr;
  friend class JsonGrammarBuilder;
};

// Where reading stands: every way the text so far can still continue (the schema's choices are
// followed in parallel).
class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> grammar);

  // Reads `text`; false (and the matcher is then dead) when no value of the schema starts so.
  bool Feed(std::string_view text);
  // Whether the text read is a whole value of the schema.
  bool CanEnd() const;
  bool dead() const { return threads_.empty(); }
  // The fewest bytes that still make the text read a whole value (0 when CanEnd()); -1 when
  // dead. Following the shortest continuation byte by byte lowers it by one per byte, which is
  // what lets constrained decoding finish a value within a token budget.
  int MinBytesToEnd() const;

  struct Frame {
    const JsonNode* node;
    int phase = 0;
    // object: next property; literal: bytes read; string: escape digits or continuation bytes
    // due; number: 1 when negative
    int index = 0;
    int count = 0;  // array items, string characters, number digits of the current part
    // string: the range of the next continuation byte (lo << 8 | hi); bounded number: the
    // fraction digits' value
    int aux = 0;
    int64_t value = 0;  // bounded number: the integer part's value
  };
  using Thread = std::vector<Frame>;  // a stack; empty when a whole value was read

 private:
  std::shared_ptr<const JsonGrammar> grammar_;
  std::vector<Thread> threads_;
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_JSON_GRAMMAR_H_
