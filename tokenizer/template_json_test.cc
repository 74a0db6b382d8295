#include "tokenizer/template_json.h"

#include "gtest/gtest.h"

namespace k3 {
namespace {

using nlohmann::ordered_json;

// Expected strings are what Python 3.11 printed for the same values (json.dumps with
// ensure_ascii=False, and the K3 template's json_sorted rendered by jinja2).
TEST(TemplateJsonTest, PythonDumps) {
  const ordered_json value = ordered_json::parse(
      R"({"z": 1, "a": [true, null, 0.5, "caf\u00e9\n\"q\""], "m": {}})");
  EXPECT_EQ(PythonJson(value), "{\"z\": 1, \"a\": [true, null, 0.5, \"café\\n\\\"q\\\"\"], \"m\": {}}");
}

TEST(TemplateJsonTest, SortedLikeJinjaDictsort) {
  const ordered_json value =
      ordered_json::parse(R"({"b": 1, "Units": [2, {"y": 1, "X": 2}], "a": "x"})");
  EXPECT_EQ(SortedTemplateJson(value), R"({"a":"x","b":1,"Units":[2,{"X":2,"y":1}]})");
}

}  // namespace
}  // namespace k3
