#include "cluster/span_log.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

std::vector<nlohmann::json> ReadLines(const std::string& path) {
  std::ifstream file(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(SpanLogTest, WritesOneJsonObjectPerSpanWithTheIdsInHex) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/spans.jsonl");
  absl::StatusOr<std::unique_ptr<SpanLog>> log = SpanLog::Open(path, "router-0");
  ASSERT_TRUE(log.ok()) << log.status();
  TraceContext context =
      ParseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").value();
  Span span;
  span.name = "k3.router.layer";
  span.parent = context.span_id;
  span.context = context.WithSpan({1, 2, 3, 4, 5, 6, 7, 8});
  span.start = absl::FromUnixNanos(1000);
  span.end = absl::FromUnixNanos(2500);
  span.attributes = {{"k3.layer", 3}, {"k3.rows", 9}};
  (*log)->Record(span);
  // Several threads at once: every line stays whole.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) (*log)->Record(span);
    });
  }
  for (std::thread& t : threads) t.join();

  const std::vector<nlohmann::json> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 201u);
  const nlohmann::json& first = lines[0];
  EXPECT_EQ(first["name"], "k3.router.layer");
  EXPECT_EQ(first["trace_id"], "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(first["parent_span_id"], "b7ad6b7169203331");
  EXPECT_EQ(first["span_id"], "0102030405060708");
  EXPECT_EQ(first["start_time_unix_nano"], 1000);
  EXPECT_EQ(first["end_time_unix_nano"], 2500);
  EXPECT_EQ(first["service"], "router-0");
  EXPECT_EQ(first["attributes"]["k3.rows"], 9);
}

TEST(SpanLogTest, AnUnwritablePathIsAClearError) {
  absl::StatusOr<std::unique_ptr<SpanLog>> log = SpanLog::Open("/nonexistent/dir/spans", "x");
  EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(log.status().message().find("/nonexistent/dir/spans"), std::string::npos);
}

}  // namespace
}  // namespace k3
