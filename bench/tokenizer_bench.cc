// tokenizer_bench: single-thread tokenizer throughput in bytes/s and tokens/s.
//
//   bazel run -c opt //bench:tokenizer_bench -- [MODEL_DIR] [TEXT_FILE]
//
// MODEL_DIR holds tiktoken.model and tokenizer_config.json (default: the 512-id tokenizer a
// random k3-tiny checkpoint ships with, written to a temporary folder). For a release-sized
// vocabulary, export OpenAI's ranks with tokenizer/reference/encode.mjs and put cl100k_base.tiktoken
// or o200k_base.tiktoken there as tiktoken.model beside a tokenizer_config.json of "{}": the K3
// pattern then runs over 100k / 200k real ranks. TEXT_FILE defaults to the tokenizer's test corpus
// (English, Chinese, other scripts, code, emoji, numbers, whitespace runs), repeated to 8 MiB.
//
// Times (best of 5, in CPU time of the thread, since the build machines are shared and wall time
// counts other people's work): Encode of the whole text; Decode of its ids; StreamingDecoder over
// the ids one at a time (what a streamed answer costs per token).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "tokenizer/random_tokenizer.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr size_t kTextBytes = 8 << 20;

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

double BestSeconds(const std::function<void()>& run) {
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const double start = ThreadCpuSeconds();
    run();
    best = std::min(best, ThreadCpuSeconds() - start);
  }
  return best;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tokenizer_bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = argc > 1 ? argv[1] : "";
  if (model_dir.empty()) {
    model_dir = (std::filesystem::temp_directory_path() / "k3_tokenizer_bench").string();
    std::filesystem::create_directories(model_dir);
    if (auto s = k3::WriteRandomTokenizer(model_dir, 512, k3::TokenizerFamily::kK3); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  const std::string seed = ReadFile(argc > 2 ? argv[2] : "tokenizer/testdata/corpus.txt");
  if (seed.empty()) return Fail("empty or missing text file");
  std::string text;
  while (text.size() < kTextBytes) text += seed;

  auto tokenizer = k3::Tokenizer::Load(model_dir);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));
  auto ids = tokenizer->Encode(text);
  if (!ids.ok()) return Fail(std::string(ids.status().message()));

  const double encode = BestSeconds([&] { (void)tokenizer->Encode(text); });
  const double decode = BestSeconds([&] { (void)tokenizer->Decode(*ids); });
  const double stream = BestSeconds([&] {
    k3::StreamingDecoder decoder(*tokenizer);
    size_t bytes = 0;
    for (int32_t id : *ids) bytes += decoder.Push(id)->size();
    if (bytes == 0) std::abort();
  });
  const double mb = text.size() / 1e6, mtok = ids->size() / 1e6;
  std::printf("model %s: vocab %d; text %.1f MB, %.2f M tokens (%.2f bytes/token)\n",
              model_dir.c_str(), tokenizer->vocab_size(), mb, mtok, text.size() * 1.0 / ids->size());
  std::printf("encode:           %7.1f MB/s  %6.2f M tokens/s\n", mb / encode, mtok / encode);
  std::printf("decode:           %7.1f MB/s  %6.2f M tokens/s\n", mb / decode, mtok / decode);
  std::printf("streaming decode: %7.1f MB/s  %6.2f M tokens/s\n", mb / stream, mtok / stream);
  return 0;
}
