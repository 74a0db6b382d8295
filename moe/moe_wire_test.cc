#include "moe/moe_wire.h"

#include <random>

#include "gtest/gtest.h"

namespace k3 {
namespace {

TEST(MoeWireTest, RoundTripsEveryMessage) {
  MoeRequest request{7, 3, 2, 4, {1, 2, 3, 4, 5, 6, 7, 8}};
  MoeRequest request_back;
  ASSERT_TRUE(Decode(Encode(request), &request_back).ok());
  EXPECT_EQ(request_back.step_id, 7u);
  EXPECT_EQ(request_back.layer, 3);
  EXPECT_EQ(request_back.rows, request.rows);

  MoeResponse failed{9, absl::UnavailableError("expert worker 3 lost"), 0, 0, {}};
  MoeResponse failed_back;
  ASSERT_TRUE(Decode(Encode(failed), &failed_back).ok());
  EXPECT_EQ(failed_back.status, failed.status);

  ExpertRequest dispatch{11, 2, 5, 2, 3, {{0, 4, 0.5f}, {1, 9, 0.25f}}, {1, 2, 3, 4, 5, 6}};
  ExpertRequest dispatch_back;
  ASSERT_TRUE(Decode(Encode(dispatch), &dispatch_back).ok());
  ASSERT_EQ(dispatch_back.assignments.size(), 2u);
  EXPECT_EQ(dispatch_back.assignments[1].expert, 9);
  EXPECT_EQ(dispatch_back.assignments[1].weight, 0.25f);
  EXPECT_EQ(dispatch_back.rows, dispatch.rows);
  EXPECT_EQ(dispatch_back.placement_version, 5u);

  ExpertResponse answer{11, absl::OkStatus(), 2, 3, {6, 5, 4, 3, 2, 1}};
  ExpertResponse answer_back;
  ASSERT_TRUE(Decode(Encode(answer), &answer_back).ok());
  EXPECT_EQ(answer_back.rows, answer.rows);
}

// Every truncation and random corruption of a valid message decodes to an error or a message
// whose sizes agree with its rows; never a crash (run under ASan in CI).
TEST(MoeWireTest, MalformedMessagesFailCleanly) {
  ExpertRequest dispatch{11, 2, 5, 2, 3, {{0, 4, 0.5f}, {1, 9, 0.25f}}, {1, 2, 3, 4, 5, 6}};
  const std::string good = Encode(dispatch);
  for (size_t cut = 0; cut < good.size(); ++cut) {
    ExpertRequest back;
    EXPECT_FALSE(Decode(good.substr(0, cut), &back).ok()) << cut;
  }
  std::mt19937 rng(1);
  for (int trial = 0; trial < 5000; ++trial) {
    std::string bad = good;
    for (int flips = 0; flips < 3; ++flips) bad[rng() % bad.size()] = static_cast<char>(rng());
    ExpertRequest back;
    if (Decode(bad, &back).ok()) {
      EXPECT_EQ(back.rows.size(), static_cast<size_t>(back.rows_count * back.width));
    }
  }
  MoeRequest wrong_kind;
  EXPECT_FALSE(Decode(good, &wrong_kind).ok());
  EXPECT_FALSE(PeekMoeMessageKind("").ok());
  EXPECT_FALSE(PeekMoeMessageKind(std::string(1, '\x09')).ok());
}

}  // namespace
}  // namespace k3
