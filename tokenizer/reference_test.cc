// The tokenizer against real reference encoders on testdata/corpus.txt (spec §6):
//   - the K3 pattern's splits against the release's own pattern in Python's `regex` module
//     (reference/k3_splits.py; needs Debian's python3-regex);
//   - ids with OpenAI's cl100k_base and o200k_base ranks and patterns against js-tiktoken
//     (reference/encode.mjs; needs Node.js and `npm ci` in tokenizer/reference, as tools/test.sh
//     runs before `bazel test`);
//   - decode(encode(x)) == x on every document;
//   - spec §5's goldens, where K3_RELEASE_TOKENIZER_DIR names a folder with the release's files.
// A missing tool skips its test with "SKIPPED: reason" on stdout. The scripts in the runfiles are
// links into the source tree; node resolves them there and finds tokenizer/reference/node_modules.
// The BUILD target is tagged "external" so that a result never comes from the cache once
// node_modules appears or changes.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/random_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

constexpr char kCorpus[] = "tokenizer/testdata/corpus.txt";
constexpr char kEncodeScript[] = "tokenizer/reference/encode.mjs";
constexpr char kSplitScript[] = "tokenizer/reference/k3_splits.py";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<std::string> Documents() {
  return absl::StrSplit(ReadFile(kCorpus), "\n=====8<=====\n");
}

std::string OutDir() { return std::getenv("TEST_TMPDIR"); }

// Runs `command` with stderr to a file; on failure prints the file and returns false.
bool RunCommand(const std::string& command) {
  const std::string log = OutDir() + "/stderr.txt";
  const int rc = std::system((command + " 2>" + log).c_str());
  if (rc != 0) ADD_FAILURE() << command << " failed (" << rc << "):\n" << ReadFile(log);
  return rc == 0;
}

bool Available(const std::string& probe) {
  return std::system((probe + " >/dev/null 2>&1").c_str()) == 0;
}

#define SKIP_UNLESS(condition, reason)           \
  if (!(condition)) {                            \
    std::cout << "SKIPPED: " << reason << "\n";  \
    GTEST_SKIP() << reason;                      \
  }

TEST(ReferenceTest, K3SplitsEqualTheReleasePatternInPythonRegex) {
  SKIP_UNLESS(Available("python3 -c 'import regex'"),
              "python3 with the regex module is missing (apt-get install python3-regex)");
  const std::string out = OutDir() + "/k3_splits.json";
  ASSERT_TRUE(RunCommand(absl::StrCat("python3 ", kSplitScript, " ", kCorpus, " ", out)));
  const nlohmann::json expected = nlohmann::json::parse(ReadFile(out));
  const std::vector<std::string> documents = Documents();
  ASSERT_EQ(expected.size(), documents.size());
  auto pretokenizer = Pretokenizer::Create(kK3Pattern);
  ASSERT_TRUE(pretokenizer.ok());
  for (size_t d = 0; d < documents.size(); ++d) {
    auto pieces = pretokenizer->Split(documents[d]);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    EXPECT_EQ(std::vector<std::string>(pieces->begin(), pieces->end()),
              expected[d].get<std::vector<std::string>>())
        << "document " << d;
  }
}

// Node and js-tiktoken are found once for the encodings below.
class JsTiktokenTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (!Available("node --version")) {
      skip_reason_ = "Node.js is missing";
      return;
    }
    const std::filesystem::path sources =
        std::filesystem::canonical(kEncodeScript).parent_path();
    if (!std::filesystem::exists(sources / "node_modules" / "js-tiktoken")) {
      skip_reason_ = absl::StrCat("js-tiktoken is not installed: run `npm ci` in ",
                                  sources.string());
      return;
    }
    ran_ = RunCommand(absl::StrCat("node ", kEncodeScript, " ", kCorpus, " ", OutDir()));
  }

  static std::string skip_reason_;
  static bool ran_;
};
std::string JsTiktokenTest::skip_reason_;
bool JsTiktokenTest::ran_ = false;

TEST_P(JsTiktokenTest, IdsEqualTheReferenceAndDecodeBack) {
  SKIP_UNLESS(skip_reason_.empty(), skip_reason_);
  ASSERT_TRUE(ran_);
  const std::string prefix = OutDir() + "/" + GetParam();
  auto tokenizer = Tokenizer::Create(ReadFile(prefix + ".tiktoken"), "",
                                     ReadFile(prefix + ".pattern"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const nlohmann::json expected = nlohmann::json::parse(ReadFile(prefix + ".ids.json"));
  const std::vector<std::string> documents = Documents();
  ASSERT_EQ(expected.size(), documents.size());
  for (size_t d = 0; d < documents.size(); ++d) {
    auto ids = tokenizer->Encode(documents[d]);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, expected[d].get<std::vector<int32_t>>()) << "document " << d;
    EXPECT_EQ(*tokenizer->Decode(*ids), documents[d]);
  }
  // The same ranks under the K3 pattern still round-trip.
  auto k3 = Tokenizer::Create(ReadFile(prefix + ".tiktoken"), "");
  ASSERT_TRUE(k3.ok());
  for (const std::string& document : Documents()) {
    EXPECT_EQ(*k3->Decode(*k3->Encode(document)), document);
  }
}

INSTANTIATE_TEST_SUITE_P(Encodings, JsTiktokenTest,
                         ::testing::Values("cl100k_base", "o200k_base"));

// Spec §5's goldens need the release's tiktoken.model and tokenizer_config.json, which are not in
// the repository: `bazel test --test_env=K3_RELEASE_TOKENIZER_DIR=/path/to/K3 ...` runs them.
TEST(ReferenceTest, ReleaseGoldens) {
  const char* dir = std::getenv("K3_RELEASE_TOKENIZER_DIR");
  SKIP_UNLESS(dir != nullptr, "K3_RELEASE_TOKENIZER_DIR (a folder with the release's tokenizer) "
                              "is not set");
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*tokenizer->Encode("Hello world"), (std::vector<int32_t>{19180, 2695}));
  EXPECT_EQ(*tokenizer->Encode("你好世界"), (std::vector<int32_t>{33845, 2243}));
  EXPECT_EQ(*tokenizer->Encode("The capital of France is"),
            (std::vector<int32_t>{1008, 10484, 318, 15383, 387}));
  EXPECT_EQ(tokenizer->named_ids().bos, 163584);
  EXPECT_EQ(*TurnEndId(*tokenizer), 163586);
}

TEST(ReferenceTest, RandomCheckpointTokenizerRoundTripsTheCorpus) {
  auto tokenizer = RandomTokenizer(512, TokenizerFamily::kK3);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (const std::string& document : Documents()) {
    EXPECT_EQ(*tokenizer->Decode(*tokenizer->Encode(document)), document);
  }
}

}  // namespace
}  // namespace k3
