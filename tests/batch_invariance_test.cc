// The same request gives the same bits (issue 39): a request's full-vocabulary logits at every
// position, through the one generation loop (GenerationScheduler over the CPU's ModelRunner with
// the router math and experts in process, the composition of `generate --model`), are bitwise equal
// (memcmp of the floats) to those of the request computed alone, whatever it is batched with.
//
// The reference is the plainest computation there is: the prompt as one step, then one greedy
// decode step per token, stepped directly on a ModelRunner inside a job of a one-thread pool (so
// every kernel runs on one thread). Against it run 50 random prompts through schedulers of 2 kernel
// threads (K3SERVE_THREADS=2, BUILD), among 1, 7 and 31 concurrent requests of random prompt
// lengths, with step budgets of 16, 64 and 512 tokens (cut prompts, mixed prefill and decode
// steps: the row kernel and the tiled kernel for the same token), each prompt cold and again after
// its prefix is in the cache (a hit restores the state at a block boundary). Some of the others
// share a prefix with a target, so targets also hit states that other requests left.
//
// A step runner wrapper records every new token's logits row (it asks the inner runner for all
// rows and gives the scheduler the rows it asked for), keyed by the request and the position.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "attention_nodes/scheduler/generation_scheduler.h"
#include "attention_nodes/forward/model_runner.h"
#include "attention_nodes/forward/step_runner.h"
#include "engine/local_routed_moe.h"
#include "engine/process_engine.h"
#include "gtest/gtest.h"
#include "kernels/thread_pool.h"
#include "kernels/thread_pool_internal.h"
#include "model/config.h"
#include "model/weights.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base ? base : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// (label, position) -> the logits row after the token at that position.
using Rows = std::map<std::pair<std::string, int64_t>, std::vector<float>>;

// Records every new token's logits row of the sequences it steps. The k-th state it makes belongs
// to the k-th label pushed (the scheduler admits in submission order).
class RecordingRunner final : public StepRunner {
 public:
  RecordingRunner(const ModelWeights* weights, RoutedMoe* moe) : inner_(weights, moe) {}

  void PushLabel(std::string label) {
    absl::MutexLock lock(&mu_);
    labels_.push_back(std::move(label));
  }
  Rows TakeRows() {
    absl::MutexLock lock(&mu_);
    return std::move(rows_);
  }

  const ModelConfig& config() const override { return inner_.config(); }
  absl::StatusOr<std::unique_ptr<SequenceState>> NewState() override {
    std::unique_ptr<SequenceState> state = inner_.NewSequence();
    absl::MutexLock lock(&mu_);
    if (next_label_ >= labels_.size()) return absl::InternalError("a state with no label");
    label_of_[state.get()] = labels_[next_label_++];
    return state;
  }
  absl::Status Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) override {
    std::vector<BatchEntry> all(batch.begin(), batch.end());
    std::vector<int64_t> start;
    for (BatchEntry& entry : all) {
      entry.all_logits = true;
      start.push_back(entry.state->length);
    }
    const absl::Status status = inner_.Step(all, &every_);
    if (!status.ok()) return status;
    const int64_t vocab = config().vocab_size;
    logits->clear();
    absl::MutexLock lock(&mu_);
    const float* row = every_.data();
    for (size_t e = 0; e < batch.size(); ++e) {
      const int64_t n = static_cast<int64_t>(batch[e].tokens.size());
      const std::string& label = label_of_.at(batch[e].state);
      for (int64_t i = 0; i < n; ++i, row += vocab) {
        rows_[{label, start[e] + i}].assign(row, row + vocab);
        if (batch[e].all_logits || i == n - 1) logits->insert(logits->end(), row, row + vocab);
      }
    }
    return absl::OkStatus();
  }
  const StepProfile& last_profile() const override { return inner_.last_profile(); }
  void set_ping_pong(PingPong mode) override { inner_.set_ping_pong(mode); }
  bool host_state() const override { return true; }

 private:
  ModelRunner inner_;
  std::vector<float> every_;
  absl::Mutex mu_;
  std::vector<std::string> labels_ ABSL_GUARDED_BY(mu_);
  size_t next_label_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const SequenceState*, std::string> label_of_ ABSL_GUARDED_BY(mu_);
  Rows rows_ ABSL_GUARDED_BY(mu_);
};

struct Target {
  std::vector<int32_t> prompt;
  int max_new = 1;
  // Positions' logits of the reference: prompt positions, then each generated token's but the last.
  std::vector<std::vector<float>> rows;
};

int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// The reference: prompt in one step, then greedy decode, every kernel on this thread.
void ComputeReference(const ModelWeights& weights, RoutedMoe* moe, Target* target) {
  ModelRunner runner(&weights, moe);
  internal::ThreadPool one(1);
  one.ParallelFor(1, 1, [&](int64_t, int64_t) {
    std::unique_ptr<SequenceState> state = runner.NewSequence();
    const int64_t vocab = weights.config.vocab_size;
    std::vector<float> logits;
    std::vector<int32_t> feed = target->prompt;
    for (int step = 0; step < target->max_new; ++step) {
      const BatchEntry entry{state.get(), feed, /*all_logits=*/true};
      ASSERT_TRUE(runner.Step({entry}, &logits).ok());
      for (size_t i = 0; i < feed.size(); ++i) {
        target->rows.emplace_back(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
      }
      feed = {Argmax(target->rows.back())};
    }
  });
}

// Compares a run's rows of `label` with the reference from its first computed position on (the
// prompt's last one at the latest); returns the number of positions checked.
int64_t ExpectSameBits(const Target& target, const Rows& rows, const std::string& label,
                       const std::string& what) {
  int64_t checked = 0;
  // A prefix restored from the cache is not computed again: its positions have no rows.
  size_t first = 0;
  while (first + 1 < target.prompt.size() && rows.count({label, static_cast<int64_t>(first)}) == 0) {
    ++first;
  }
  for (size_t pos = first; pos < target.rows.size(); ++pos) {
    auto it = rows.find({label, static_cast<int64_t>(pos)});
    if (it == rows.end()) {
      ADD_FAILURE() << what << " " << label << ": no logits at position " << pos;
      return checked;
    }
    const std::vector<float>& got = it->second;
    const std::vector<float>& want = target.rows[pos];
    if (std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0) {
      float worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      ADD_FAILURE() << what << " " << label << " (prompt " << target.prompt.size()
                    << " tokens): logits at position " << pos << " differ by up to " << worst;
      return checked;  // later positions follow from a different token
    }
    ++checked;
  }
  return checked;
}

// Waits for a request's end.
class DoneSink : public GenerationSink {
 public:
  void OnToken(int32_t, int, int) override {}
  void OnFinish(const GenerationResult& result) override {
    result_ = result;
    done_.Notify();
  }
  GenerationResult Wait() {
    done_.WaitForNotification();
    return result_;
  }

 private:
  GenerationResult result_;
  absl::Notification done_;
};

class BatchInvarianceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(BatchInvarianceTest, LogitsDoNotDependOnTheBatch) {
  ASSERT_EQ(KernelThreadCount(), 2) << "the BUILD rule sets K3SERVE_THREADS=2";
  const std::string model = GetParam();
  const bool tiny = model == "k3-tiny";
  if (!tiny && std::getenv("K3_BATCH_INVARIANCE_PERF") == nullptr) {
    GTEST_SKIP() << "k3-perf (a 1.4 GB checkpoint, minutes): bazel test -c opt "
                    "//tests:batch_invariance_perf_test";
  }
  absl::StatusOr<ModelConfig> config = NamedConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string dir = TempDir("batch_invariance_" + model);
  ASSERT_TRUE(WriteRandomModelFolder(*config, 39, dir, 1).ok());
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(dir, WeightSelection::All());
  ASSERT_TRUE(weights.ok()) << weights.status();
  LocalRoutedMoe moe(weights->get());

  std::mt19937 rng(39);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = uniform(0, static_cast<int>(config->vocab_size) - 1);
    return t;
  };
  const int targets_count = tiny ? 50 : 6;
  const int longest = tiny ? 300 : 160;
  std::vector<Target> targets(targets_count);
  for (Target& target : targets) {
    target.prompt = random_tokens(uniform(1, longest));
    target.max_new = uniform(1, 6);
    ComputeReference(**weights, &moe, &target);
  }

  // Rounds of (step budget, others per target); each round runs every target twice (cold, then
  // with its prompt's blocks cached by the first run) in waves of one target and its others.
  struct Round {
    int64_t budget;
    int others;
  };
  const std::vector<Round> rounds =
      tiny ? std::vector<Round>{{16, 1}, {64, 7}, {512, 31}, {512, 1}, {16, 7}, {64, 31}}
           : std::vector<Round>{{16, 1}, {64, 7}, {512, 31}};
  int64_t positions = 0;
  for (const Round& round : rounds) {
    SchedulerOptions options;
    options.max_batch_tokens = round.budget;
    options.max_sequences = 64;
    options.prefix_block_tokens = 32;
    auto runner = std::make_unique<RecordingRunner>(weights->get(), &moe);
    RecordingRunner* recorder = runner.get();
    GenerationScheduler scheduler(std::move(runner), options, /*metrics=*/nullptr);
    const std::string what = absl::StrCat(model, " budget ", round.budget, " with ", round.others,
                                          " others");
    // Each target runs in one round.
    for (int t = 0; t < targets_count; ++t) {
      if (t % static_cast<int>(rounds.size()) != &round - rounds.data()) continue;
      const Target& target = targets[t];
      for (int pass = 0; pass < 2; ++pass) {
        std::vector<std::shared_ptr<DoneSink>> sinks;
        const int target_slot = uniform(0, round.others);
        for (int o = 0; o <= round.others; ++o) {
          GenerationRequest request;
          request.ignore_eos = true;
          std::string label;
          if (o == target_slot) {
            request.prompt = target.prompt;
            request.max_new_tokens = target.max_new;
            label = absl::StrCat("target ", t, " pass ", pass);
          } else {
            // Some others share a prefix with the target.
            if (uniform(0, 3) == 0) {
              request.prompt.assign(
                  target.prompt.begin(),
                  target.prompt.begin() + uniform(1, static_cast<int>(target.prompt.size())));
            }
            const std::vector<int32_t> tail = random_tokens(uniform(1, longest / 3));
            request.prompt.insert(request.prompt.end(), tail.begin(), tail.end());
            request.max_new_tokens = uniform(1, 8);
            label = absl::StrCat("other ", t, " ", pass, " ", o);
          }
          recorder->PushLabel(label);  // the scheduler admits in submission order
          sinks.push_back(std::make_shared<DoneSink>());
          ASSERT_TRUE(scheduler.Submit(std::move(request), sinks.back()).ok());
        }
        for (const auto& sink : sinks) {
          const GenerationResult result = sink->Wait();
          ASSERT_TRUE(result.status.ok()) << result.status;
          ASSERT_EQ(result.reason, FinishReason::kLength);
        }
        const Rows rows = recorder->TakeRows();
        positions += ExpectSameBits(target, rows, absl::StrCat("target ", t, " pass ", pass),
                                    absl::StrCat(what, pass == 0 ? " (cold)" : " (cached)"));
        if (HasFailure()) return;
      }
    }
    const PrefixCacheStats stats = scheduler.prefix_cache_stats();
    std::cout << what << ": prefix cache hits " << stats.hits << "\n";
  }
  std::cout << model << ": " << positions << " positions' logits bitwise equal\n";
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvarianceTest, ::testing::Values("k3-tiny", "k3-perf"),
                         [](const auto& info) { return std::string(info.param) == "k3-tiny"
                                                           ? "Tiny" : "Perf"; });

}  // namespace
}  // namespace k3
