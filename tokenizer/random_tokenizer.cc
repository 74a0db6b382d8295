#include "tokenizer/random_tokenizer.h"

#include <map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/text_file.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace k3 {
namespace {

// Training text: enough variety that common English words, Chinese characters, code punctuation
// and digits become single tokens. Changing it changes every random checkpoint's tokenizer.
constexpr char kTrainingText[] = R"(The quick brown fox jumps over the lazy dog.
A language model reads text as tokens: pieces of words, whole words, spaces and punctuation.
The model predicts the next token, then the next one, until it writes the end of the message.
What is the capital of France? The capital of France is Paris. Paris is a city in France.
Hello world! Hello, how are you today? I'm fine, thank you. We're here, they've gone, it's late.
In the beginning there was a question, and then there were answers, and the answers were good.
Experts and attention layers work together: the router sends each token to a few experts.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 20 30 42 100 256 512 1024 2048 4096 3.14 2.718 1,000,000.
你好世界。今天天气很好。我们在学习语言模型。中文和英文混合的文本也可以分词。
人工智能正在改变世界，模型会根据上下文预测下一个词。谢谢你的帮助！
def main():
    for i in range(10):
        print(f"value {i}: {i * i}")
    return 0

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3};
  for (int v : values) std::cout << v << "\n";
  return 0;
}
{"role": "user", "content": "Tell me a story about a robot."}
Once upon a time, a small robot lived in a quiet town. Every morning it opened the shop,
cleaned the windows and said good morning to everyone who walked by. The people liked the robot.
)";

// Byte-pair training: repeatedly joins the most frequent adjacent pair of tokens over the text's
// pieces (the lowest pair of ids on ties, so the result is deterministic) into a new token.
absl::StatusOr<std::vector<std::string>> LearnTokens(size_t count) {
  std::vector<std::string> tokens;
  absl::flat_hash_map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string(1, static_cast<char>(b)));
    ids[tokens.back()] = b;
  }
  std::map<std::string, int64_t> piece_counts;  // ordered: determinism
  K3_ASSIGN_OR_RETURN(const Pretokenizer pretokenizer, Pretokenizer::Create(kK3Pattern));
  K3_RETURN_IF_ERROR(pretokenizer.ForEachPiece(
      kTrainingText, [&](std::string_view piece) { ++piece_counts[std::string(piece)]; }));
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [piece, n] : piece_counts) {
    Word word{{}, n};
    for (char c : piece) word.symbols.push_back(static_cast<uint8_t>(c));
    words.push_back(std::move(word));
  }
  while (tokens.size() < count) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pair_counts;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
        pair_counts[{w.symbols[i], w.symbols[i + 1]}] += w.count;
      }
    }
    if (pair_counts.empty()) break;
    auto best = pair_counts.begin();
    for (auto it = pair_counts.begin(); it != pair_counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [left, right] = best->first;
    // Two different pairs can spell the same bytes ("ab"+"c", "a"+"bc"): reuse the token then.
    const std::string joined = tokens[left] + tokens[right];
    auto [it, added] = ids.emplace(joined, static_cast<int32_t>(tokens.size()));
    if (added) tokens.push_back(joined);
    for (Word& w : words) {
      std::vector<int32_t> merged;
      for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == left && w.symbols[i + 1] == right) {
          merged.push_back(it->second);
          ++i;
        } else {
          merged.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(merged);
    }
  }
  return tokens;
}

// The name of special id `offset` places below the top block's start, or empty when unnamed.
const char* SpecialName(int offset, TokenizerFamily family) {
  for (const SpecialTokenSlot& slot : kSpecialTokenSlots) {
    const int small_offset =
        slot.offset < kSmallSpecialBlock ? slot.offset
                                         : slot.offset - kSpecialBlockSize + kSmallSpecialBlock;
    if (small_offset == offset) return family == TokenizerFamily::kK3 ? slot.k3_name : slot.kimi_name;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<TokenizerFiles> RandomTokenizerFiles(int64_t vocab_size, TokenizerFamily family) {
  if (vocab_size < kSmallestTokenizerVocab || vocab_size > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a random tokenizer needs a vocabulary of ", kSmallestTokenizerVocab, "..", 1 << 24,
        " ids (bytes and special tokens), got ", vocab_size));
  }
  const int64_t special_start = vocab_size - kSmallSpecialBlock;
  K3_ASSIGN_OR_RETURN(const std::vector<std::string> tokens, LearnTokens(special_start));
  TokenizerFiles files;
  for (size_t id = 0; id < tokens.size(); ++id) {
    absl::StrAppend(&files.tiktoken_model, absl::Base64Escape(tokens[id]), " ", id, "\n");
  }
  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  for (int64_t id = static_cast<int64_t>(tokens.size()); id < vocab_size; ++id) {
    const char* name = id >= special_start ? SpecialName(id - special_start, family) : nullptr;
    decoder[std::to_string(id)] = {
        {"content", name != nullptr ? std::string(name)
                                    : absl::StrCat("<|reserved_token_", id, "|>")},
        {"lstrip", false}, {"normalized", false}, {"rstrip", false},
        {"single_word", false}, {"special", true}};
  }
  const nlohmann::ordered_json config = {
      {"added_tokens_decoder", decoder}, {"bos_token", "[BOS]"}, {"eos_token", "[EOS]"},
      {"pad_token", "[PAD]"},           {"unk_token", "[UNK]"},  {"model_max_length", 1048576},
      {"tokenizer_class", "TikTokenTokenizer"}};
  files.config_json = config.dump(2) + "\n";
  return files;
}

absl::StatusOr<Tokenizer> RandomTokenizer(int64_t vocab_size, TokenizerFamily family) {
  K3_ASSIGN_OR_RETURN(const TokenizerFiles files, RandomTokenizerFiles(vocab_size, family));
  return Tokenizer::Create(files.tiktoken_model, files.config_json);
}

absl::Status WriteRandomTokenizer(const std::string& dir, int64_t vocab_size,
                                  TokenizerFamily family) {
  K3_ASSIGN_OR_RETURN(const TokenizerFiles files, RandomTokenizerFiles(vocab_size, family));
  K3_RETURN_IF_ERROR(
      WriteTextFile(absl::StrCat(dir, "/", Tokenizer::kRanksFile), files.tiktoken_model));
  return WriteTextFile(absl::StrCat(dir, "/", Tokenizer::kConfigFile), files.config_json);
}

}  // namespace k3
