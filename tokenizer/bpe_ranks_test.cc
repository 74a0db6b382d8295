#include "tokenizer/bpe_ranks.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// tiktoken.model text: the 256 single bytes at ranks 0..255, then `merged` at 256, 257, ...
std::string RankFile(const std::vector<std::string>& merged) {
  std::string text;
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&text, absl::Base64Escape(std::string(1, static_cast<char>(b))), " ", b, "\n");
  }
  for (size_t i = 0; i < merged.size(); ++i) {
    absl::StrAppend(&text, absl::Base64Escape(merged[i]), " ", 256 + i, "\n");
  }
  return text;
}

std::vector<int32_t> Encode(const BpeRanks& ranks, std::string_view piece) {
  std::vector<int32_t> ids;
  ranks.Encode(piece, &ids);
  return ids;
}

// Expected ids worked out by hand from the merge rule (lowest rank first, leftmost on ties).
TEST(BpeRanksTest, MergesByRankNotByPosition) {
  auto ranks = BpeRanks::Parse(RankFile({"bc", "ab", "abcd", "cd"}));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  // "bc" (256) beats "ab" (257): a + bc, and "abc" is no token.
  EXPECT_THAT(Encode(*ranks, "abc"), ElementsAre('a', 256));
  // b+c first, then nothing joins a|bc|d ("abc", "bcd" are not tokens): "abcd" is unreachable
  // from pairs but is the whole piece, which tiktoken takes as one token.
  EXPECT_THAT(Encode(*ranks, "abcd"), ElementsAre(258));
  EXPECT_THAT(Encode(*ranks, "abcde"), ElementsAre('a', 256, 'd', 'e'));
  EXPECT_THAT(Encode(*ranks, "cdab"), ElementsAre(259, 257));
  EXPECT_THAT(Encode(*ranks, ""), ElementsAre());
}

TEST(BpeRanksTest, EqualPairsMergeLeftmostFirst) {
  auto ranks = BpeRanks::Parse(RankFile({"aa", "aaa"}));
  ASSERT_TRUE(ranks.ok());
  // aaaa: aa at 0 first (leftmost), then aa|aa ("aaaa" is no token) stays.
  EXPECT_THAT(Encode(*ranks, "aaaa"), ElementsAre(256, 256));
  // aaaaa: aa|aa|a, then "aaa" (aa+a) needs the last pair: aa|aaa.
  EXPECT_THAT(Encode(*ranks, "aaaaa"), ElementsAre(256, 257));
}

// Pieces over 128 bytes take the heap path; the merge order must stay tiktoken's.
TEST(BpeRanksTest, LongPiecesMergeLikeShortOnes) {
  auto ranks = BpeRanks::Parse(RankFile({"ab", "abab", "ba"}));
  ASSERT_TRUE(ranks.ok());
  std::string short_piece, long_piece;
  for (int i = 0; i < 10; ++i) short_piece += "ab";
  for (int i = 0; i < 1000; ++i) long_piece += "ab";
  // ab|ab|... (256 beats "ba" at 258), then abab leftmost first: pairs of pairs.
  EXPECT_EQ(Encode(*ranks, short_piece), std::vector<int32_t>(5, 257));
  EXPECT_EQ(Encode(*ranks, long_piece), std::vector<int32_t>(500, 257));
  // An odd count leaves a lone "ab" at the right end.
  EXPECT_EQ(Encode(*ranks, long_piece + "ab"),
            [] {
              std::vector<int32_t> ids(500, 257);
              ids.push_back(256);
              return ids;
            }());
  // A leading b: "ab" (256) outranks "ba" (258) at the front, so the b stays alone.
  std::vector<int32_t> expected(500, 257);
  expected.insert(expected.begin(), 'b');
  expected.push_back('x');
  EXPECT_EQ(Encode(*ranks, "b" + long_piece + "x"), expected);
}

TEST(BpeRanksTest, LooksUpBothWays) {
  auto ranks = BpeRanks::Parse(RankFile({"hello"}));
  ASSERT_TRUE(ranks.ok());
  EXPECT_EQ(ranks->Rank("hello"), 256);
  EXPECT_EQ(ranks->Rank("hell"), std::nullopt);
  EXPECT_EQ(ranks->Bytes(256), "hello");
  EXPECT_EQ(ranks->Bytes('x'), "x");
  EXPECT_EQ(ranks->Bytes(257), "");
  EXPECT_EQ(ranks->Bytes(-1), "");
  EXPECT_EQ(ranks->end(), 257);
}

TEST(BpeRanksTest, RejectsMalformedFiles) {
  auto error = [](const std::string& text) {
    auto ranks = BpeRanks::Parse(text);
    EXPECT_FALSE(ranks.ok());
    return std::string(ranks.status().message());
  };
  const std::string bytes = RankFile({});
  EXPECT_THAT(error(bytes + "aGk=\n"), HasSubstr("line 257: expected"));
  EXPECT_THAT(error(bytes + "aGk= 1 2\n"), HasSubstr("line 257: expected"));
  EXPECT_THAT(error(bytes + "a*k= 300\n"), HasSubstr("line 257: bad base64"));
  EXPECT_THAT(error(bytes + "aGk= x\n"), HasSubstr("line 257: bad rank"));
  EXPECT_THAT(error(bytes + "aGk= -4\n"), HasSubstr("line 257: bad rank"));
  EXPECT_THAT(error(bytes + "aGk= 99999999999\n"), HasSubstr("line 257: bad rank"));
  EXPECT_THAT(error(bytes + " 300\n"), HasSubstr("line 257: empty token"));
  EXPECT_THAT(error(bytes + "aGk= 5\n"), HasSubstr("rank 5 appears twice"));
  EXPECT_THAT(error(bytes + "aGk= 300\naGk= 301\n"), HasSubstr("\"hi\" appears twice"));
  EXPECT_THAT(error("aGk= 300\n"), HasSubstr("no token for the byte 0x00"));
  EXPECT_TRUE(BpeRanks::Parse(bytes + "\r\n\naGk= 300\r\n").ok());
}

}  // namespace
}  // namespace k3
