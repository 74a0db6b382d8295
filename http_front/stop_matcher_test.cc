#include "http_front/stop_matcher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace k3 {
namespace {

// Feeds `pieces` and returns the concatenated output plus Finish.
std::string Feed(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) out += matcher.Push(piece);
  return out + matcher.Finish();
}

TEST(StopMatcherTest, NoStopsPassesEverythingAtOnce) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.Push("hello"), "hello");
  EXPECT_EQ(matcher.Push(" world"), " world");
  EXPECT_EQ(matcher.Finish(), "");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, StopSplitAcrossPiecesIsNeverEmitted) {
  StopMatcher matcher({"END"});
  EXPECT_EQ(matcher.Push("abcE"), "abc");  // "E" may start "END"
  EXPECT_EQ(matcher.Push("N"), "");
  EXPECT_EQ(matcher.Push("Dxyz"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.Push("more"), "");
  EXPECT_EQ(matcher.Finish(), "");
}

TEST(StopMatcherTest, HeldBackTextThatDoesNotBecomeAStopIsReleased) {
  StopMatcher matcher({"END"});
  EXPECT_EQ(matcher.Push("aEN"), "a");
  EXPECT_EQ(matcher.Push("x"), "ENx");
  EXPECT_EQ(matcher.Push("EN"), "");
  EXPECT_EQ(matcher.Finish(), "EN");  // the generation ended: it was text after all
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher matcher({"world", "lo w"});
  EXPECT_EQ(Feed(matcher, {"hel", "lo wor", "ld"}), "hel");
  EXPECT_TRUE(matcher.stopped());
}

TEST(StopMatcherTest, OutputIsThePrefixBeforeTheFirstStopForEverySplit) {
  const std::string text = "one two\nthree\n\nfour";
  const std::vector<std::string> stops = {"\n\n", "thx"};
  const std::string expected = text.substr(0, text.find("\n\n"));
  // Every way of cutting the text in two and three pieces.
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      StopMatcher matcher(stops);
      EXPECT_EQ(Feed(matcher, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}), expected)
          << i << " " << j;
    }
  }
}

TEST(StopMatcherTest, MultibyteStopKeepsOutputValidUtf8) {
  StopMatcher matcher({"\xe4\xb8\x96\xe7\x95\x8c"});  // "世界"
  // "你好世" then "x": "世" is held (it could start "世界") and released whole.
  EXPECT_EQ(matcher.Push("\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96"), "\xe4\xbd\xa0\xe5\xa5\xbd");
  EXPECT_EQ(matcher.Push("x"), "\xe4\xb8\x96x");
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  StopMatcher matcher({""});
  EXPECT_EQ(Feed(matcher, {"abc"}), "abc");
  EXPECT_FALSE(matcher.stopped());
}

}  // namespace
}  // namespace k3
