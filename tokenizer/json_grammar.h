// Constrained decoding's JSON side: a JSON Schema compiled into a matcher that reads generated
// text byte by byte and says which bytes may come next, so that only text that can still become
// a value of the schema is generated. The text is compact JSON (no whitespace between tokens),
// object members come in the schema's `properties` order (those not `required` may be left
// out, members the schema does not name come after those it does), numbers have at most 16
// digits per part and schema-less values nest at most 4 deep.
//
// Supported schema keywords: type (one or a list), enum, const, properties, required,
// additionalProperties (false, true or a schema), items, minItems, maxItems, minLength,
// maxLength, anyOf / oneOf (as anyOf). Others are ignored (the value is still checked for what
// is supported); $ref is InvalidArgument. {} and json_object accept any JSON value / object.
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
  // `schema` a JSON Schema (an object); InvalidArgument where it cannot be compiled.
  static absl::StatusOr<std::shared_ptr<const JsonGrammar>> FromSchema(
      const nlohmann::ordered_json& schema);
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonGrammar> AnyObject();

  ~JsonGrammar();
  const JsonNode* root() const { return root_; }

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

  struct Frame {
    const JsonNode* node;
    int phase = 0;
    int index = 0;  // object: next property; literal: bytes read; string: escape digits
    int count = 0;  // array items, string characters, number digits
  };
  using Thread = std::vector<Frame>;  // a stack; empty when a whole value was read

 private:
  std::shared_ptr<const JsonGrammar> grammar_;
  std::vector<Thread> threads_;
};

}  // namespace k3

#endif  // K3SERVE_TOKENIZER_JSON_GRAMMAR_H_
