#include "tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Pieces(const Pretokenizer& p, std::string_view text) {
  auto pieces = p.Split(text);
  EXPECT_TRUE(pieces.ok()) << pieces.status();
  return pieces.ok() ? std::vector<std::string>(pieces->begin(), pieces->end())
                     : std::vector<std::string>();
}

// The splits below follow from the pattern's branches by hand; tokenizer/reference_test.cc checks
// the pattern against the release's own form (python3-regex) on the whole corpus.
TEST(PretokenizerTest, K3PatternSplitsHanFromOtherLetters) {
  auto p = Pretokenizer::Create(kK3Pattern);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Pieces(*p, "中文English混合"), ElementsAre("中文", "English", "混合"));
  EXPECT_THAT(Pieces(*p, "Hello world"), ElementsAre("Hello", " world"));
  // Shared CJK punctuation is Script=Common (only its Script_Extensions include Han).
  EXPECT_THAT(Pieces(*p, "世界。《书》"), ElementsAre("世界", "。《", "书", "》"));
  EXPECT_THAT(Pieces(*p, "I'LL don't"), ElementsAre("I'LL", " don't"));
  EXPECT_THAT(Pieces(*p, "12345 x"), ElementsAre("123", "45", " x"));
  EXPECT_THAT(Pieces(*p, "a  \n\n b"), ElementsAre("a", "  \n\n", " b"));
  EXPECT_THAT(Pieces(*p, "x   y"), ElementsAre("x", "  ", " y"));
  EXPECT_THAT(Pieces(*p, "f(x);\n"), ElementsAre("f", "(x", ");\n"));
  EXPECT_THAT(Pieces(*p, "CamelCase"), ElementsAre("Camel", "Case"));
}

TEST(PretokenizerTest, PiecesCoverTheText) {
  auto p = Pretokenizer::Create(kK3Pattern);
  ASSERT_TRUE(p.ok());
  const std::string text = "Ünïcödé 😀😀 \t\r\n  tabs\tand 123456789 日本語の文章 Ελληνικά!!\n\n";
  std::string joined;
  for (const std::string& piece : Pieces(*p, text)) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST(PretokenizerTest, RejectsInvalidUtf8AndBadPatterns) {
  auto p = Pretokenizer::Create(kK3Pattern);
  ASSERT_TRUE(p.ok());
  auto bad = p->Split("ok \xff\xfe");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("UTF-8 at byte 3"));
  EXPECT_EQ(p->Split("\xe4\xb8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pretokenizer::Create("(unclosed").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The release's cuts: at most 25,000 consecutive whitespace or non-whitespace characters reach
// the pattern at once, and at most 400,000 characters.
TEST(PretokenizerTest, CutsLongRunsAsTheReleaseDoes) {
  auto p = Pretokenizer::Create(kK3Pattern);
  ASSERT_TRUE(p.ok());
  const std::string a25k(25000, 'a'), a5k(5000, 'a');
  EXPECT_THAT(Pieces(*p, a25k + a5k + " b"), ElementsAre(a25k, a5k, " b"));
  EXPECT_THAT(Pieces(*p, a25k), ElementsAre(a25k));
  // Whitespace runs: the cut part ends in whitespace, so \s+ takes all of it.
  const std::string s25k(25000, ' ');
  EXPECT_THAT(Pieces(*p, "x" + s25k + "   y"), ElementsAre("x", s25k, "  ", " y"));
  // Characters, not bytes: 25,000 three-byte letters stay one run.
  std::string greek;
  for (int i = 0; i < 25001; ++i) greek += "ω";
  auto pieces = p->Split(greek);
  ASSERT_TRUE(pieces.ok());
  ASSERT_EQ(pieces->size(), 2u);
  EXPECT_EQ((*pieces)[0].size(), 2u * 25000);
  // Hiragana is Lo, in both letter classes: the deepest backtracking the pattern allows.
  std::string kana;
  for (int i = 0; i < 30000; ++i) kana += "あ";
  auto kana_pieces = p->Split(kana);
  ASSERT_TRUE(kana_pieces.ok()) << kana_pieces.status();
  ASSERT_EQ(kana_pieces->size(), 2u);
  EXPECT_EQ((*kana_pieces)[1].size(), 3u * 5000);
  // The 400,000-character window: "xy" then 80,000 "abcd " puts character 400,000 on the last
  // word's d, so that word is split as " abc" | "d".
  std::string words = "xy";
  for (int i = 0; i < 80000; ++i) words += "abcd ";
  auto cut = p->Split(words);
  ASSERT_TRUE(cut.ok());
  ASSERT_GE(cut->size(), 4u);
  EXPECT_THAT(std::vector<std::string>(cut->end() - 4, cut->end()),
              ElementsAre(" abcd", " abc", "d", " "));
  // Invalid UTF-8 is still found past a cut, at its byte in the whole text.
  auto bad = p->Split(a25k + a5k + "\xff");
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("UTF-8 at byte 30000"));
}

TEST(PretokenizerTest, EmptyMatchesAdvanceOneCharacter) {
  auto p = Pretokenizer::Create("a*");
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(Pieces(*p, "aa中a"), ElementsAre("aa", "a"));
}

}  // namespace
}  // namespace k3
