#include "tokenizer/json_grammar.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
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
      if (pick(3) == 0) return {{"type", "string"}, {"minLength", 1 + pick(3)}};
      return {{"type", "string"}, {"minLength", pick(2)}, {"maxLength", 1 + pick(6)}};
    case 1: {
      ordered_json number = {{"type", pick(2) ? "integer" : "number"}};
      // Bounds (and for integers a multiple) half of the time, checked by the validator.
      if (pick(2)) {
        const int low = pick(41) - 20;
        number[pick(2) ? "minimum" : "exclusiveMinimum"] = low + (pick(2) ? 0.25 : 0);
        number[pick(2) ? "maximum" : "exclusiveMaximum"] = low + 1 + pick(30);
        if (number["type"] == "integer" && pick(2)) number["multipleOf"] = 1 + pick(4);
      }
      return number;
    }
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

std::string Hex(std::string_view bytes) {
  std::string hex;
  for (unsigned char c : bytes) absl::StrAppend(&hex, absl::Hex(c, absl::kZeroPad2));
  return hex;
}

// A random text the matcher takes whole, or "" if the walk did not end.
std::string RandomInstance(const std::shared_ptr<const JsonGrammar>& grammar, std::mt19937& rng) {
  // Raw bytes of every UTF-8 class too (the grammar must take only valid sequences of them).
  static const std::string kBytes =
      "{}[]\",:-0123456789.eE+truefalsnxqkpé\\u\"}]dD8aF\x80\x9f\xa0\xbf\xc0\xc2\xe0\xed\xef\xf0"
      "\xf4\xf5\xff";
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
      out << ordered_json{{"schema", schema}, {"instance_hex", Hex(instance)}}.dump() << "\n";
      ++written;
    }
  }
  out.close();
  EXPECT_GE(written, 600);
  const int rc = std::system(
      absl::StrCat("python3 tokenizer/testdata/validate_json_instances.py ", pairs).c_str());
  EXPECT_EQ(rc, 0) << "see the INVALID lines above";
}

// Every code point's UTF-8 bytes, written the plain way (the independent side of the checks).
std::string Utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

// Issue 38: a string took the overlong e0 9c a8. The matcher must take exactly the prefixes of
// the UTF-8 forms of the scalar values (no surrogates, nothing above U+10FFFF).
TEST(JsonGrammarTest, StringsTakeExactlyValidUtf8) {
  absl::flat_hash_set<std::string> prefixes;  // of characters of 2 or more bytes
  absl::flat_hash_set<std::string> whole;     // characters of 2 or more bytes
  for (char32_t c = 0x80; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const std::string bytes = Utf8(c);
    whole.insert(bytes);
    for (size_t n = 1; n < bytes.size(); ++n) prefixes.insert(bytes.substr(0, n));
  }
  auto any = Grammar(R"({"type":"string"})");
  int checked = 0;
  // Every 2-byte text after a lead byte, and every 3-byte text after a 3- or 4-byte lead.
  for (int a = 0x80; a < 0x100; ++a) {
    for (int b = 0; b < 0x100; ++b) {
      for (int c = -1; c < (a >= 0xE0 ? 0x100 : 0); ++c) {
        std::string text = {static_cast<char>(a), static_cast<char>(b)};
        if (c >= 0) text.push_back(static_cast<char>(c));
        JsonMatcher m(any);
        EXPECT_EQ(m.Feed("\"" + text), prefixes.contains(text) || whole.contains(text))
            << Hex(text);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 60000);
  for (const std::string& text : whole) {  // every 4-byte character's last byte, among others
    if (text.size() != 4 || (static_cast<unsigned char>(text[1]) & 0x0F) != 0) continue;
    EXPECT_TRUE(Accepts(any, "\"" + text + "\"")) << Hex(text);
  }
  EXPECT_FALSE(Accepts(any, "\"\xf4\x90\x80\x80\""));  // U+110000
  EXPECT_FALSE(Accepts(any, "\"\xed\xa0\x80\""));      // U+D800
  EXPECT_FALSE(Accepts(any, "\"\xe0\x9c\xa8\""));      // the issue's overlong bytes
  // \u escapes of surrogates: none; of other code points: one character each.
  EXPECT_FALSE(Accepts(any, R"("\ud800")"));
  EXPECT_FALSE(Accepts(any, R"("\uDFFF")"));
  EXPECT_TRUE(Accepts(any, R"("\ud7ff\ue000")"));
  auto three = Grammar(R"({"type":"string","minLength":3,"maxLength":3})");
  EXPECT_TRUE(Accepts(three, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\""));  // é€😀
  EXPECT_TRUE(Accepts(three, R"("\u00e9a\n")"));
  EXPECT_FALSE(Accepts(three, "\"\xc3\xa9\xc3\xa9\""));
  EXPECT_FALSE(Accepts(three, "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\""));
  auto two_or_more = Grammar(R"({"type":"string","minLength":2})");  // no maxLength
  EXPECT_FALSE(Accepts(two_or_more, "\"\xc3\xa9\""));
  EXPECT_TRUE(Accepts(two_or_more, "\"\xc3\xa9\\n\""));
}

// Whether the integer `v` satisfies the bounds, computed directly.
TEST(JsonGrammarTest, IntegerBoundsAndMultiplesAreExact) {
  auto grammar = Grammar(R"({"type":"integer","minimum":-7,"exclusiveMaximum":23,"multipleOf":3})");
  for (int v = -200; v <= 200; ++v) {
    const bool in = v >= -7 && v < 23 && v % 3 == 0;
    EXPECT_EQ(Accepts(grammar, std::to_string(v)), in) << v;
  }
  EXPECT_FALSE(Accepts(grammar, "6.0"));
  auto age = Grammar(R"({"type":"integer","minimum":0,"maximum":150})");
  EXPECT_FALSE(Accepts(age, "2514300126145258"));  // the issue's age
  JsonMatcher prefix(age);
  EXPECT_TRUE(prefix.Feed("15"));
  EXPECT_FALSE(JsonMatcher(prefix).Feed("1"));  // 151 and longer cannot come back in range
  EXPECT_TRUE(JsonMatcher(prefix).Feed("0"));
  EXPECT_FALSE(JsonMatcher(age).Feed("-1"));
  EXPECT_TRUE(Accepts(age, "-0"));  // -0 is 0
  auto number = Grammar(R"({"type":"number","exclusiveMinimum":0.5,"maximum":0.75})");
  EXPECT_FALSE(Accepts(number, "0.5"));
  EXPECT_TRUE(Accepts(number, "0.500001"));
  EXPECT_TRUE(Accepts(number, "0.75"));
  EXPECT_FALSE(Accepts(number, "0.750001"));
  EXPECT_FALSE(Accepts(number, "1"));
  EXPECT_FALSE(JsonMatcher(number).Feed("1"));
  EXPECT_FALSE(JsonGrammar::FromSchema(ordered_json::parse(
                   R"({"type":"integer","minimum":1,"maximum":2,"multipleOf":5})"))
                   .ok());
  EXPECT_FALSE(JsonGrammar::FromSchema(ordered_json::parse(R"({"enum":[]})")).ok());
  // Issue 38's 400-request run: 14E442 parses in JSON's grammar but overflows a double.
  auto unbounded = Grammar(R"({"type":"number"})");
  EXPECT_TRUE(Accepts(unbounded, "9999999999999999.9999999999999999e+99"));
  EXPECT_FALSE(Accepts(unbounded, "14E442"));
  EXPECT_FALSE(Accepts(unbounded, "1e308"));
}

TEST(JsonGrammarTest, StrictRefusesWhatItCannotEnforce) {
  for (const char* schema : {
           R"({"type":"string","pattern":"^a+$"})",
           R"({"type":"object","properties":{"d":{"type":"string","format":"date"}}})",
           R"({"oneOf":[{"type":"string"},{"type":"integer"}]})",
           R"({"type":"number","multipleOf":0.5})",
           R"({"type":"array","items":{"type":"integer"},"uniqueItems":true})",
           R"({"allOf":[{"type":"string"}]})"}) {
    const ordered_json parsed = ordered_json::parse(schema);
    auto strict = JsonGrammar::FromSchema(parsed, /*strict=*/true);
    ASSERT_FALSE(strict.ok()) << schema;
    std::string keyword;
    for (const char* k : {"pattern", "format", "oneOf", "multipleOf", "uniqueItems", "allOf"}) {
      if (absl::StrContains(schema, absl::StrCat("\"", k, "\""))) keyword = k;
    }
    EXPECT_TRUE(absl::StrContains(strict.status().message(), absl::StrCat("'", keyword, "'")))
        << strict.status();
    EXPECT_TRUE(JsonGrammar::FromSchema(parsed, /*strict=*/false).ok()) << schema;  // best effort
  }
  EXPECT_TRUE(JsonGrammar::FromSchema(
                  ordered_json::parse(R"({"type":"object","title":"t","description":"d",
                      "additionalProperties":false,"required":["a"],"properties":{"a":{
                      "anyOf":[{"type":"integer","minimum":1,"multipleOf":2},{"enum":[[1],{"k":null}]}]}}})"),
                  /*strict=*/true)
                  .ok());
}

// MinBytesToEnd is exact along random walks: 0 exactly where the value can end, no byte lowers
// it by more than one, and following bytes that lower it by one ends the value in that many.
TEST(JsonGrammarTest, MinBytesToEndIsTheShortestFinish) {
  std::mt19937 rng(38);
  std::string alphabet;
  for (int b = 1; b < 256; ++b) alphabet.push_back(static_cast<char>(b));
  int states = 0;
  for (int i = 0; i < 120; ++i) {
    const ordered_json schema = RandomSchema(rng, 3);
    auto grammar = JsonGrammar::FromSchema(schema);
    ASSERT_TRUE(grammar.ok()) << schema.dump();
    JsonMatcher matcher(*grammar);
    EXPECT_EQ(matcher.MinBytesToEnd(), (*grammar)->MinBytes());
    for (int step = 0; step < 30; ++step) {
      const int m = matcher.MinBytesToEnd();
      ASSERT_GE(m, 0) << schema.dump();
      EXPECT_EQ(m == 0, matcher.CanEnd()) << schema.dump();
      std::vector<char> next;
      for (char c : alphabet) {
        JsonMatcher tried = matcher;
        if (!tried.Feed(std::string_view(&c, 1))) continue;
        EXPECT_GE(tried.MinBytesToEnd(), m - 1) << schema.dump() << " byte " << int(c);
        next.push_back(c);
      }
      // The shortest finish really is m bytes long.
      JsonMatcher shortest = matcher;
      for (int left = m; left > 0; --left) {
        bool moved = false;
        for (char c : alphabet) {
          JsonMatcher tried = shortest;
          if (tried.Feed(std::string_view(&c, 1)) && tried.MinBytesToEnd() == left - 1) {
            shortest = tried;
            moved = true;
            break;
          }
        }
        ASSERT_TRUE(moved) << schema.dump();
      }
      EXPECT_TRUE(shortest.CanEnd()) << schema.dump();
      ++states;
      if (next.empty()) break;
      const char c = next[rng() % next.size()];
      matcher.Feed(std::string_view(&c, 1));
    }
  }
  EXPECT_GT(states, 1000);
}

}  // namespace
}  // namespace k3
