// GenerationScheduler over a StepRunner that is not the model: a counting runner whose logits
// name the next token (the last token + 1, modulo the vocabulary), so the tokens every request
// must get are known without the model, whatever the batching. It also has a fixed number of
// state slots, as a GPU runner has, to show what happens when admission finds none free.
#include "attention_nodes/scheduler/generation_scheduler.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "model/config.h"

namespace k3 {
namespace {

class CountingRunner final : public StepRunner {
 public:
  CountingRunner(ModelConfig config, int slots)
      : config_(std::move(config)), free_(std::make_shared<int>(slots)) {}

  const ModelConfig& config() const override { return config_; }
  absl::StatusOr<std::unique_ptr<SequenceState>> NewState() override {
    if (*free_ == 0) return absl::ResourceExhaustedError("no free state slot");
    --*free_;
    auto state = std::make_unique<SequenceState>();
    // Handed back when the scheduler lets the state go, as GpuStepRunner's slots are.
    state->device = std::shared_ptr<int>(free_.get(), [free = free_](int*) { ++*free; });
    return state;
  }
  absl::Status Step(absl::Span<const BatchEntry> batch, std::vector<float>* logits) override {
    logits->clear();
    ++steps_;
    for (const BatchEntry& entry : batch) {
      if (entry.state->device == nullptr) return absl::InternalError("a state from elsewhere");
      const size_t rows = entry.all_logits ? entry.tokens.size() : 1;
      for (size_t r = 0; r < rows; ++r) {
        const int32_t token = entry.tokens[entry.tokens.size() - rows + r];
        std::vector<float> row(config_.vocab_size, 0.0f);
        row[(token + 1) % config_.vocab_size] = 1.0f;
        logits->insert(logits->end(), row.begin(), row.end());
      }
      entry.state->length += static_cast<int64_t>(entry.tokens.size());
    }
    return absl::OkStatus();
  }
  const StepProfile& last_profile() const override { return profile_; }
  void set_ping_pong(PingPong) override {}
  bool host_state() const override { return false; }

  int free_slots() const { return *free_; }
  int steps() const { return steps_; }

 private:
  const ModelConfig config_;
  const std::shared_ptr<int> free_;
  int steps_ = 0;
  StepProfile profile_;
};

class Collector final : public GenerationSink {
 public:
  void OnToken(int32_t token, int, int) override {
    absl::MutexLock lock(&mu_);
    tokens_.push_back(token);
  }
  void OnFinish(const GenerationResult& result) override {
    {
      absl::MutexLock lock(&mu_);
      result_ = result;
    }
    done_.Notify();
  }
  bool Wait() { return done_.WaitForNotificationWithTimeout(absl::Seconds(10)); }
  std::vector<int32_t> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  GenerationResult result() const {
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int32_t> tokens_;
  GenerationResult result_;
  absl::Notification done_;
};

ModelConfig TinyConfig() {
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

GenerationRequest Counting(const std::string& id, int32_t last, int new_tokens) {
  GenerationRequest request;
  request.id = id;
  request.prompt = {3, 1, last};
  request.max_new_tokens = new_tokens;
  request.ignore_eos = true;
  return request;
}

TEST(GenerationSchedulerTest, BatchesRequestsOverAnyStepRunner) {
  auto owned = std::make_unique<CountingRunner>(TinyConfig(), 8);
  CountingRunner* runner = owned.get();
  const int32_t vocab = static_cast<int32_t>(runner->config().vocab_size);
  SchedulerOptions options;
  options.max_sequences = 8;
  GenerationScheduler scheduler(std::move(owned), options, nullptr);  // prefix cache: off
  // The prompts end near the end of the vocabulary, so the counts wrap around it.
  const auto Last = [vocab](int i) { return (vocab - 2 + i) % vocab; };
  std::vector<std::shared_ptr<Collector>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_shared<Collector>());
    ASSERT_TRUE(
        scheduler.Submit(Counting("r" + std::to_string(i), Last(i), 5), sinks[i]).ok());
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sinks[i]->Wait()) << i;
    EXPECT_EQ(sinks[i]->result().reason, FinishReason::kLength) << sinks[i]->result().message;
    std::vector<int32_t> want;
    for (int n = 1; n <= 5; ++n) want.push_back((Last(i) + n) % vocab);
    EXPECT_EQ(sinks[i]->tokens(), want) << i;
  }
  ASSERT_TRUE(scheduler.WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(runner->free_slots(), 8);  // every state went back
  scheduler.Shutdown();
}

// max_sequences allows two, the runner holds one: the second request ends with the runner's
// error at admission, and the first is not disturbed.
TEST(GenerationSchedulerTest, ARunnerWithoutRoomEndsTheRequestNotTheOthers) {
  auto owned = std::make_unique<CountingRunner>(TinyConfig(), 1);
  CountingRunner* runner = owned.get();
  SchedulerOptions options;
  options.max_sequences = 2;
  GenerationScheduler scheduler(std::move(owned), options, nullptr);
  auto first = std::make_shared<Collector>();
  auto second = std::make_shared<Collector>();
  ASSERT_TRUE(scheduler.Submit(Counting("first", 10, 200), first).ok());
  ASSERT_TRUE(scheduler.Submit(Counting("second", 20, 3), second).ok());
  ASSERT_TRUE(second->Wait());
  EXPECT_EQ(second->result().reason, FinishReason::kError);
  EXPECT_EQ(second->result().status.code(), absl::StatusCode::kResourceExhausted)
      << second->result().status;
  EXPECT_TRUE(second->tokens().empty());
  ASSERT_TRUE(first->Wait());
  EXPECT_EQ(first->result().reason, FinishReason::kLength) << first->result().message;
  EXPECT_EQ(first->tokens().size(), 200u);
  ASSERT_TRUE(scheduler.WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(runner->free_slots(), 1);
  scheduler.Shutdown();
}

}  // namespace
}  // namespace k3
