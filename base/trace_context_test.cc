#include "base/trace_context.h"

#include <set>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// The example of the W3C Trace Context recommendation, section 3.2.
constexpr char kExample[] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

TEST(TraceContextTest, ParsesAndFormatsTheSpecExample) {
  absl::StatusOr<TraceContext> context = ParseTraceparent(kExample);
  ASSERT_TRUE(context.ok()) << context.status();
  EXPECT_EQ(HexId(context->trace_id), "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(HexId(context->span_id), "b7ad6b7169203331");
  EXPECT_EQ(context->trace_id[0], 0x0a);
  EXPECT_EQ(context->span_id[7], 0x31);
  EXPECT_TRUE(context->sampled());
  EXPECT_EQ(FormatTraceparent(*context), kExample);

  const TraceContext child = context->WithSpan(NewSpanId());
  EXPECT_EQ(child.trace_id, context->trace_id);
  EXPECT_NE(child.span_id, context->span_id);
  EXPECT_TRUE(ParseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
                  .value()
                  .sampled() == false);
}

TEST(TraceContextTest, RejectsWhatTheSpecRejects) {
  for (const char* bad : {
           "",
           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",        // no flags
           "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",     // uppercase
           "00-00000000000000000000000000000000-b7ad6b7169203331-01",     // zero trace id
           "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",     // zero parent id
           "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",     // version ff
           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",   // 00 has 4 fields
           "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",     // separator
           "00-0af7651916cd43dd8448eb211c8031zz-b7ad6b7169203331-01",     // not hex
       }) {
    EXPECT_EQ(ParseTraceparent(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // A later version may add fields; its first four are read.
  absl::StatusOr<TraceContext> future =
      ParseTraceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes");
  ASSERT_TRUE(future.ok()) << future.status();
  EXPECT_EQ(HexId(future->span_id), "b7ad6b7169203331");
}

TEST(TraceContextTest, NewSpanIdsAreNonZeroAndDistinct) {
  std::set<std::array<uint8_t, 8>> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::array<uint8_t, 8> id = NewSpanId();
    EXPECT_NE(id, (std::array<uint8_t, 8>{}));
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace k3
