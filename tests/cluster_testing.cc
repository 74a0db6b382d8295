#include "tests/cluster_testing.h"

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "engine/local_engine.h"
#include "engine/oracle_generation.h"
#include "model/config.h"
#include "tools/random_model_folder.h"

namespace k3 {

namespace {

std::string TestTmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// The log folders of the clusters the running test started (TestClusterOptions).
std::vector<std::string>& ClusterLogDirs() {
  static std::vector<std::string>* dirs = new std::vector<std::string>;
  return *dirs;
}

// What a node's log says that explains a failure: its warnings and errors (glog lines start with
// the severity letter) and its last lines, at most `keep` of each.
void PrintLogExcerpt(const std::filesystem::path& path, size_t keep) {
  std::ifstream in(path);
  std::deque<std::string> problems;
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && (line[0] == 'W' || line[0] == 'E' || line[0] == 'F')) {
      problems.push_back(line);
      if (problems.size() > keep) problems.pop_front();
    }
    last.push_back(std::move(line));
    if (last.size() > keep) last.pop_front();
  }
  std::cerr << "---- " << path.string() << ": its last " << problems.size()
            << " warnings and errors\n";
  for (const std::string& line : problems) std::cerr << line << "\n";
  std::cerr << "---- " << path.filename().string() << ": its last " << last.size() << " lines\n";
  for (const std::string& line : last) std::cerr << line << "\n";
}

// A failed cluster test shows what its nodes logged while it ran: on a CI machine the logs go
// with the sandbox, and the test's own output rarely says why a node did what it did. Clusters
// may outlive a test (started in SetUpTestSuite): every log written since the test began counts.
class ClusterLogsOnFailure : public testing::EmptyTestEventListener {
  void OnTestStart(const testing::TestInfo&) override {
    test_start_ = std::filesystem::file_time_type::clock::now();
  }
  void OnTestEnd(const testing::TestInfo& test) override {
    if (test.result() == nullptr || !test.result()->Failed()) return;
    for (const std::string& dir : ClusterLogDirs()) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        if (entry.path().extension() != ".log") continue;
        if (entry.last_write_time(ec) < test_start_) continue;
        PrintLogExcerpt(entry.path(), 25);
      }
    }
  }

  // Installed by the first cluster's options, during a test: that one counts from the start.
  std::filesystem::file_time_type test_start_ = std::filesystem::file_time_type::min();
};

void ShowClusterLogsOnFailure() {
  static const bool installed = [] {
    testing::UnitTest::GetInstance()->listeners().Append(new ClusterLogsOnFailure);
    return true;
  }();
  (void)installed;
}

}  // namespace

std::string RandomCheckpointDir(const std::string& config, uint64_t seed, bool mxfp4) {
  using Key = std::tuple<std::string, uint64_t, bool>;
  static std::map<Key, std::string>* written = new std::map<Key, std::string>;
  auto it = written->find({config, seed, mxfp4});
  if (it != written->end()) return it->second;
  const std::string dir = absl::StrCat(TestTmpDir(), "/", config, "-", seed, mxfp4 ? "-mxfp4" : "");
  absl::StatusOr<ModelConfig> model = NamedConfig(config);
  if (!model.ok()) {
    std::cerr << "config " << config << ": " << model.status() << "\n";
    std::abort();
  }
  RandomCheckpointOptions options;
  options.mxfp4 = mxfp4;
  if (absl::Status s = WriteRandomModelFolder(*model, seed, dir, options); !s.ok()) {
    std::cerr << "writing " << dir << ": " << s << "\n";
    std::abort();
  }
  written->emplace(Key{config, seed, mxfp4}, dir);
  return dir;
}

LocalClusterOptions TestClusterOptions(const std::string& model, int attention, int routers,
                                       int experts, std::vector<int> expert_slots) {
  static int clusters = 0;
  LocalClusterOptions options;
  // Bazel runs tests in their runfiles folder, where the data dependency //:k3serve lies.
  options.binary = std::filesystem::absolute("k3serve").string();
  options.model = model;
  options.attention = attention;
  options.routers = routers;
  options.experts = experts;
  options.expert_slots = std::move(expert_slots);
  // The tests choose their replicas (the coordinator's --spare-slots-per-worker) themselves;
  // those of `k3serve local`'s default topology set spare_expert_slots back to -1.
  options.spare_expert_slots = 0;
  options.log_dir = absl::StrCat(TestTmpDir(), "/cluster-", clusters++);
  ShowClusterLogsOnFailure();
  ClusterLogDirs().push_back(options.log_dir);
  options.startup_timeout = absl::Seconds(60);
  // Every node exits within a second or so of SIGTERM on an idle machine, but its bounded waits
  // (steps in flight, Leave, transport and gRPC shutdown) add up to more than 3 s on a loaded
  // one (tests in parallel on 2 cores): a node still running after 10 s is really stuck.
  options.stop_grace = absl::Seconds(10);
  options.progress = [](const std::string& line) { std::cerr << line << std::endl; };
  return options;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> SingleProcessTokens(
    const std::string& model, const std::vector<std::vector<int32_t>>& prompts,
    int max_new_tokens) {
  absl::StatusOr<std::unique_ptr<LocalEngine>> engine = LocalEngine::Open(model);
  if (!engine.ok()) return engine.status();
  GenerationRequest request;
  request.sampling.temperature = 0.0f;
  request.max_new_tokens = max_new_tokens;
  std::vector<std::vector<int32_t>> tokens;
  for (const std::vector<int32_t>& prompt : prompts) {
    request.prompt = prompt;
    absl::StatusOr<std::vector<int32_t>> generated = OracleGenerate(**engine, request);
    if (!generated.ok()) return generated.status();
    tokens.push_back(*std::move(generated));
  }
  return tokens;
}

std::vector<std::vector<int32_t>> TestPrompts(int count, int vocab_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> prompt(1 + (3 * i + 2) % 11);
    for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % vocab_size);
    prompts.push_back(prompt);
  }
  return prompts;
}

std::string CommandOutput(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

}  // namespace k3
