#include "tokenizer/json_grammar.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using nlohmann::ordered_json;

std::shared_ptr<const JsonGrammar> Grammar(const char* schema) {
  auto grammar = JsonGrammar::FromSchema(ordered_json::parse(schema));
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  return *grammar;
}

bool Accepts(const std::shared_ptr<const JsonGrammar>& grammar, std::string_view text) {
  JsonMatcher matcher(grammar);
  return matcher.Feed(text) && matcher.CanEnd();
}

TEST(JsonGrammarTest, AcceptsValuesOfTheSchemaOnly) {
  auto person = Grammar(R"({"type":"object","additionalProperties":false,
      "required":["name","age"],"properties":{"name":{"type":"string","maxLength":3},
      "age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}}})");
  EXPECT_TRUE(Accepts(person, R"({"name":"ann","age":-12})"));
  EXPECT_TRUE(Accepts(person, R"({"name":"\u00e9","age":0,"tags":["b","a"]})"));
  EXPECT_FALSE(Accepts(person, R"({"name":"anna","age":1})"));      // maxLength
  EXPECT_FALSE(Accepts(person, R"({"age":1,"name":"a"})"));         // order
  EXPECT_FALSE(Accepts(person, R"({"name":"a"})"));                 // required
  EXPECT_FALSE(Accepts(person, R"({"name":"a","age":1.5})"));       // integer
  EXPECT_FALSE(Accepts(person, R"({"name":"a","age":1,"x":1})"));   // additionalProperties
  EXPECT_FALSE(Accepts(person, R"({"name":"a","age":01})"));        // JSON's numbers
  EXPECT_FALSE(Accepts(person, R"({"name":"a","age":1,"tags":["c"]})"));
  EXPECT_FALSE(Accepts(person, R"({"name":"a","age":1,"tags":["a","a","a"]})"));
  JsonMatcher prefix(person);
  EXPECT_TRUE(prefix.Feed(R"({"name":"a","ag)"));
  EXPECT_FALSE(prefix.CanEnd());
  EXPECT_FALSE(prefix.Feed("x"));
  // A full string takes no escape it could not finish (the matcher never leads into a dead end).
  JsonMatcher full(person);
  EXPECT_TRUE(full.Feed(R"({"name":"abc)"));
  EXPECT_FALSE(JsonMatcher(full).Feed("\\"));

  auto any = JsonGrammar::AnyObject();
  EXPECT_TRUE(Accepts(any, R"({"a":[1,2.5e3,{"b":null}],"c":"d","e":true})"));
  EXPECT_FALSE(Accepts(any, "[1]"));
  EXPECT_FALSE(Accepts(any, R"({"a":1,})"));
  EXPECT_TRUE(Accepts(Grammar(R"({"type":["number","null"]})"), "3.25"));
  EXPECT_TRUE(Accepts(Grammar(R"({"anyOf":[{"type":"boolean"},{"const":{"k":1}}]})"), R"({"k":1})"));
  EXPECT_FALSE(JsonGrammar::FromSchema(ordered_json::parse(R"({"$ref":"#/x"})")).ok());
}

// A random schema of the supported keywords, `depth` levels deep at most.
ordered_json RandomSchema(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  switch (pick(depth > 0 ? 9 : 6)) {
    case 0:
      return {{"type", "string"}, {"maxLength", pick(6)}};
    case 1:
      return {{"type", pick(2) ? "integer" : "number"}};
    case 2:
      return {{"type", "boolean"}};
    case 3:
      return {{"enum", {"x", 1, nullptr, "q\"uote"}}};
    case 4:
      return {{"type", {"string", "null"}}, {"maxLength", 2}};
    case 5:
      return {{"const", "k"}};
    case 6: {
      ordered_json properties = ordered_json::object();
      ordered_json required = ordered_json::array();
      for (int i = 0, n = pick(4); i < n; ++i) {
        const std::string key = absl::StrCat("p", i, pick(2) ? "é" : "");
        properties[key] = RandomSchema(rng, depth - 1);
        if (pick(2)) required.push_back(key);
      }
      return {{"type", "object"},
              {"properties", properties},
              {"required", required},
              {"additionalProperties", false}};
    }
    case 7:
      return {{"type", "array"},
              {"items", RandomSchema(rng, depth - 1)},
              {"minItems", 1},
              {"maxItems", 3}};
    default:
      return {{"anyOf", {RandomSchema(rng, depth - 1), RandomSchema(rng, depth - 1)}}};
  }
}

// A random text the matcher takes whole, or "" if the walk did not end.
std::string RandomInstance(const std::shared_ptr<const JsonGrammar>& grammar, std::mt19937& rng) {
  static const std::string kBytes = "{}[]\",:-0123456789.eE+truefalsnxqkpé\\u\"}]";
  JsonMatcher matcher(grammar);
  std::string text;
  for (int step = 0; step < 400; ++step) {
    if (matcher.CanEnd() && rng() % 4 == 0) return text;
    std::vector<char> next;
    for (char c : kBytes) {
      JsonMatcher tried = matcher;
      if (tried.Feed(std::string_view(&c, 1))) next.push_back(c);
    }
    if (next.empty()) return matcher.CanEnd() ? text : "";
    // Later on, closing bytes first, so that walks end.
    char c = next[rng() % next.size()];
    for (char closing : {'"', '}', ']'}) {
      if (step > 40 && std::find(next.begin(), next.end(), closing) != next.end()) c = closing;
    }
    matcher.Feed(std::string_view(&c, 1));
    text.push_back(c);
  }
  return "";
}

TEST(JsonGrammarTest, WhatItGeneratesValidatesInPythonJsonschema) {
  if (std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) {
    std::cout << "SKIPPED: python3-jsonschema is missing (apt-get install python3-jsonschema)\n";
    GTEST_SKIP();
  }
  const std::string pairs = absl::StrCat(std::getenv("TEST_TMPDIR"), "/pairs.jsonl");
  std::ofstream out(pairs);
  std::mt19937 rng(23);
  int written = 0;
  for (int i = 0; i < 300; ++i) {
    const ordered_json schema = RandomSchema(rng, 3);
    auto grammar = JsonGrammar::FromSchema(schema);
    ASSERT_TRUE(grammar.ok()) << schema.dump();
    for (int j = 0; j < 3; ++j) {
      const std::string instance = RandomInstance(*grammar, rng);
      if (instance.empty()) continue;
      out << ordered_json{{"schema", schema}, {"instance", instance}}.dump() << "\n";
      ++written;
    }
  }
  out.close();
  EXPECT_GE(written, 600);
  const int rc = std::system(
      absl::StrCat("python3 tokenizer/testdata/validate_json_instances.py ", pairs).c_str());
  EXPECT_EQ(rc, 0) << "see the INVALID lines above";
}

}  // namespace
}  // namespace k3
