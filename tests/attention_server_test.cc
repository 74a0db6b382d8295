// The attention server in process, over gRPC, with the routed experts computed in process
// (LocalRoutedMoe behind a wrapper that can fail on demand, standing in for the router tier):
// generations must equal the plain one-sequence loop (OracleGenerate), batching must not change them, bad input must be
// rejected, and cancellation, aborts and failed steps must end streams and free their state.
#include "attention_nodes/server/attention_server.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "attention_nodes/server/attention_service.h"
#include "attention_nodes/server/generate_client.h"
#include "engine/local_engine.h"
#include "engine/oracle_generation.h"
#include "engine/process_engine.h"
#include "cluster/grpc_server.h"
#include "cluster/metrics.h"
#include "cluster/test_wait.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "proto/cluster.grpc.pb.h"
#include "proto/generate.grpc.pb.h"
#include "engine/local_routed_moe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/text_prompt.h"
#include "tokenizer/tokenizer.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;
namespace v1 = k3serve::v1;

// LocalRoutedMoe that answers like a router whose expert worker died while `failure` is set, or
// (while `corrupt` is set) like one whose expert computes NaN.
class FlakyMoe final : public RoutedMoe {
 public:
  explicit FlakyMoe(const ModelWeights* weights)
      : local_(weights), width_(weights->config.ExpertWidth()) {}

  void SetFailure(absl::Status failure) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(failure);
  }
  void SetCorrupt(bool corrupt) {
    absl::MutexLock lock(&mu_);
    corrupt_ = corrupt;
  }
  // Each layer's answer comes `delay` late, as from a slow router.
  void SetDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

  absl::Status Begin(int layer, const float* x, int64_t tokens) override {
    tokens_ = tokens;
    return local_.Begin(layer, x, tokens);
  }
  absl::Status Wait(float* out) override {
    absl::Status local = local_.Wait(out);
    absl::MutexLock lock(&mu_);
    if (delay_ > absl::ZeroDuration()) absl::SleepFor(delay_);
    if (corrupt_) std::fill(out, out + tokens_ * width_, std::nanf(""));
    return failure_.ok() ? local : failure_;
  }

 private:
  LocalRoutedMoe local_;
  const int64_t width_;
  int64_t tokens_ = 0;  // of the step in flight
  absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool corrupt_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
};

// A sample of the process's metrics registry, e.g. "k3_attention_step_tokens_count"; -1 if absent.
double MetricValue(const std::string& sample) {
  for (absl::string_view line : absl::StrSplit(DefaultMetrics().ExpositionText(), '\n')) {
    if (absl::ConsumePrefix(&line, sample) && absl::ConsumePrefix(&line, " ")) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
  }
  return -1;
}

// A counter's value, 0 before it first appears.
double CounterValue(const std::string& sample) { return std::max(0.0, MetricValue(sample)); }

std::vector<int32_t> Prompt(int length, uint32_t seed) {
  std::vector<int32_t> prompt(length);
  for (int i = 0; i < length; ++i) prompt[i] = static_cast<int32_t>((seed * 131 + i * 37) % 512);
  return prompt;
}

v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_new_tokens) {
  v1::GenerateRequest request;
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  return request;
}

class AttentionServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = ModelDir();
    fs::remove_all(dir);
    absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
    ASSERT_TRUE(config.ok());
    ASSERT_TRUE(WriteRandomModelFolder(*config, 11, dir.string()).ok());
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.string());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(
        std::shared_ptr<const Checkpoint>(std::move(*checkpoint)), WeightSelection::All());
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
    absl::StatusOr<std::unique_ptr<LocalEngine>> engine = LocalEngine::Open(dir.string());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
  }
  static std::string ModelDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    return (fs::path(base ? base : "/tmp") / "attention_server_k3_tiny").string();
  }

  static void TearDownTestSuite() {
    delete engine_;
    delete weights_;
  }

  void SetUp() override { StartServer(SchedulerOptions()); }

  // `model`: the folder whose tokenizer the server loads; empty: token ids only.
  void StartServer(const SchedulerOptions& scheduler, const std::string& model = "") {
    server_.reset();
    moe_ = std::make_unique<FlakyMoe>(weights_);
    AttentionServerOptions options;
    options.node.host = "127.0.0.1";
    options.node.model = model;
    options.scheduler = scheduler;
    absl::StatusOr<std::unique_ptr<AttentionServer>> server =
        AttentionServer::StartStandalone(options, weights_, moe_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    stub_ = v1::K3Serve::NewStub(channel_);
  }

  absl::StatusOr<GenerateOutcome> Generate(const v1::GenerateRequest& request) {
    return GenerateOverGrpc(address_, request, absl::Seconds(30));
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new_tokens,
                                 const SamplingOptions& sampling = SamplingOptions(),
                                 std::vector<int32_t> stops = {}) {
    GenerationRequest request;
    request.prompt = prompt;
    request.max_new_tokens = max_new_tokens;
    request.sampling = sampling;
    request.stop_token_ids = std::move(stops);
    absl::StatusOr<std::vector<int32_t>> tokens = OracleGenerate(*engine_, request);
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    return tokens.ok() ? *tokens : std::vector<int32_t>();
  }

  v1::ServerInfo ServerInfo() {
    grpc::ClientContext context;
    v1::ServerInfo info;
    EXPECT_TRUE(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    return info;
  }

  // Starts a stream of `tokens` new tokens after `prompt` on a thread and returns once the server
  // generated a token after the call; join the thread before reading *outcome.
  std::thread StartDecoding(const std::vector<int32_t>& prompt, int tokens,
                            absl::StatusOr<GenerateOutcome>* outcome) {
    const double generated_before = CounterValue("k3_attention_generated_tokens_total");
    *outcome = absl::UnknownError("unset");
    std::thread decoder([this, prompt, tokens, outcome] {
      *outcome = Generate(Request(prompt, tokens));
    });
    EXPECT_TRUE(WaitFor(
        [&] {
          return CounterValue("k3_attention_generated_tokens_total") >= generated_before + 1;
        },
        absl::Seconds(30)));
    return decoder;
  }

  // Polls until no request holds state; false after 5 s.
  bool WaitStateFreed() {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      const v1::ServerInfo info = ServerInfo();
      if (info.active_requests() == 0 && info.cached_sequences() == 0 &&
          info.request_state_bytes() == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  static const ModelWeights* weights_;
  static LocalEngine* engine_;
  std::unique_ptr<FlakyMoe> moe_;
  std::unique_ptr<AttentionServer> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::K3Serve::Stub> stub_;
};

const ModelWeights* AttentionServerTest::weights_ = nullptr;
LocalEngine* AttentionServerTest::engine_ = nullptr;

TEST_F(AttentionServerTest, GreedyGenerationEqualsLocalEngine) {
  for (int length : {1, 6, 23}) {
    const std::vector<int32_t> prompt = Prompt(length, length);
    absl::StatusOr<GenerateOutcome> outcome = Generate(Request(prompt, 12));
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->tokens, Reference(prompt, 12)) << "prompt of " << length;
    EXPECT_EQ(outcome->complete.finish_reason(), v1::Complete::LENGTH);
    EXPECT_EQ(outcome->complete.usage().prompt_tokens(), length);
    EXPECT_EQ(outcome->complete.usage().generated_tokens(), 12);
    EXPECT_FALSE(outcome->request_id.empty());
  }
  EXPECT_TRUE(WaitStateFreed());
}

// Where each step's time went: one compute and one MoE-wait observation per step, one
// per-layer MoE wait per MoE layer of each step, and the parts fit in the step.
TEST_F(AttentionServerTest, StepProfileHistogramsCountEveryStepAndMoeLayer) {
  auto value = [](const std::string& sample) { return std::max(0.0, MetricValue(sample)); };
  const char* const samples[] = {
      "k3_attention_step_seconds_count", "k3_attention_step_compute_seconds_count",
      "k3_attention_step_moe_wait_seconds_count", "k3_attention_layer_moe_wait_seconds_count",
      "k3_attention_step_seconds_sum", "k3_attention_step_compute_seconds_sum",
      "k3_attention_step_moe_wait_seconds_sum"};
  std::vector<double> before;
  for (const char* sample : samples) before.push_back(value(sample));
  constexpr int kTokens = 5;  // one prefill step, then a decode step per later token
  absl::StatusOr<GenerateOutcome> outcome = Generate(Request(Prompt(6, 9), kTokens));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  std::vector<double> delta;
  for (size_t i = 0; i < before.size(); ++i) delta.push_back(value(samples[i]) - before[i]);
  EXPECT_EQ(delta[0], kTokens);
  EXPECT_EQ(delta[1], kTokens);
  EXPECT_EQ(delta[2], kTokens);
  const int moe_layers = weights_->config.NumMoeLayers();
  ASSERT_GT(moe_layers, 0);
  EXPECT_EQ(delta[3], kTokens * moe_layers);
  EXPECT_GT(delta[5], 0);
  EXPECT_GT(delta[6], 0);
  EXPECT_LE(delta[5] + delta[6], delta[4] * 1.001 + 1e-6);
}

TEST_F(AttentionServerTest, ChunkedPrefillGivesTheSameTokens) {
  SchedulerOptions scheduler;
  scheduler.max_batch_tokens = 5;  // a 23-token prompt takes five steps
  StartServer(scheduler);
  const std::vector<int32_t> prompt = Prompt(23, 3);
  absl::StatusOr<GenerateOutcome> outcome = Generate(Request(prompt, 8));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, Reference(prompt, 8));
}

// A conversation's next turn starts from the prefix cache (its prompt was cut at its last block
// boundary, and decoding passed more) and gives the tokens of the engine, which has no cache.
TEST_F(AttentionServerTest, NextTurnReusesTheCachedPrefixAndGivesTheSameTokens) {
  SchedulerOptions scheduler;
  scheduler.prefix_block_tokens = 16;
  StartServer(scheduler);
  const double hits_before = CounterValue("k3_attention_prefix_cache_hits_total");
  const double tokens_before = CounterValue("k3_attention_prefix_cache_hit_tokens_total");
  std::vector<int32_t> conversation = Prompt(70, 9);
  for (int turn = 0; turn < 3; ++turn) {
    absl::StatusOr<GenerateOutcome> outcome = Generate(Request(conversation, 10));
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    ASSERT_EQ(outcome->tokens, Reference(conversation, 10)) << "turn " << turn;
    conversation.insert(conversation.end(), outcome->tokens.begin(), outcome->tokens.end());
    const std::vector<int32_t> added = Prompt(5 + turn, 20 + turn);
    conversation.insert(conversation.end(), added.begin(), added.end());
  }
  // Turn 1 (70 tokens) is cut at 64 and decodes up to 79; turn 2 (85 tokens) restores 64, is cut
  // at 80 and decodes up to 94; turn 3 (101 tokens) restores 80.
  EXPECT_EQ(CounterValue("k3_attention_prefix_cache_hits_total") - hits_before, 2);
  EXPECT_EQ(CounterValue("k3_attention_prefix_cache_hit_tokens_total") - tokens_before, 64 + 80);
}

// A prompt admitted while another stream decodes is prefilled in chunks within the step's prompt
// budget (here the floor, 16 tokens: the step time target is below any step's), not in one step;
// neither stream's tokens change.
TEST_F(AttentionServerTest, ChunkedPrefillWhileAStreamDecodesGivesTheSameTokens) {
  SchedulerOptions scheduler;
  scheduler.step_target = absl::Microseconds(1);
  scheduler.ttft_target = absl::Hours(1);
  StartServer(scheduler);
  auto value = CounterValue;
  const std::vector<int32_t> running = Prompt(4, 21);
  constexpr int kRunningTokens = 400;  // decodes through the whole prefill below
  const double generated_before = value("k3_attention_generated_tokens_total");
  absl::StatusOr<GenerateOutcome> running_outcome;
  std::thread decoder = StartDecoding(running, kRunningTokens, &running_outcome);
  const std::vector<int32_t> prompt = Prompt(70, 5);  // crosses KDA's chunk boundaries
  const double steps_before = value("k3_attention_step_tokens_count");
  absl::StatusOr<GenerateOutcome> outcome = Generate(Request(prompt, 4));
  const double steps = value("k3_attention_step_tokens_count") - steps_before;
  const double running_generated = value("k3_attention_generated_tokens_total");
  decoder.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  ASSERT_TRUE(running_outcome.ok()) << running_outcome.status();
  EXPECT_EQ(outcome->tokens, Reference(prompt, 4));
  EXPECT_EQ(running_outcome->tokens, Reference(running, kRunningTokens));
  // One step for the whole prompt plus three decode steps would be 4; chunks of 16 tokens take
  // five for the prompt, as long as the other stream was still decoding.
  if (running_generated < generated_before + kRunningTokens + 4) {
    EXPECT_GE(steps, 5 + 3);
  }
  EXPECT_TRUE(WaitStateFreed());
}

// While a long prompt is admitted a few tokens a step (another stream decodes), a short prompt
// that arrives later is prefilled first: it gets its token long before the long prompt does,
// instead of queueing behind all of it. Tokens are unchanged.
TEST_F(AttentionServerTest, AShortPromptIsNotQueuedBehindALongOneBeingAdmitted) {
  // Steps of at most 64 tokens: the long prompt takes 24 or more, so what is left of it when the
  // short one arrives cannot fit in the step that serves the short one (with the default 2048 a
  // busy machine, whose slow steps let the chunks grow, could admit the rest in one step).
  SchedulerOptions scheduler;
  scheduler.max_batch_tokens = 64;
  StartServer(scheduler);
  auto value = CounterValue;
  const std::vector<int32_t> running = Prompt(4, 31);
  constexpr int kRunningTokens = 600;
  absl::StatusOr<GenerateOutcome> running_outcome;
  std::thread decoder = StartDecoding(running, kRunningTokens, &running_outcome);
  const std::vector<int32_t> long_prompt = Prompt(1500, 7);
  const std::vector<int32_t> short_prompt = Prompt(3, 8);
  absl::StatusOr<GenerateOutcome> long_outcome = absl::UnknownError("unset");
  absl::Time long_done;
  const double prompt_before = value("k3_attention_prompt_tokens_total");
  std::thread long_thread([&] {
    long_outcome = Generate(Request(long_prompt, 1));
    long_done = absl::Now();
  });
  // The long prompt is being admitted (its first chunks ran) before the short one arrives.
  ASSERT_TRUE(WaitFor(
      [&] { return value("k3_attention_prompt_tokens_total") >= prompt_before + 10; },
      absl::Seconds(30)));
  absl::StatusOr<GenerateOutcome> short_outcome = Generate(Request(short_prompt, 1));
  const absl::Time short_done = absl::Now();
  long_thread.join();
  decoder.join();
  ASSERT_TRUE(short_outcome.ok()) << short_outcome.status();
  ASSERT_TRUE(long_outcome.ok()) << long_outcome.status();
  ASSERT_TRUE(running_outcome.ok()) << running_outcome.status();
  // Queued behind the long prompt it would end in the long prompt's last step (or just after).
  EXPECT_GT(long_done - short_done, absl::Milliseconds(20))
      << "the short prompt waited for the long one";
  EXPECT_EQ(short_outcome->tokens, Reference(short_prompt, 1));
  EXPECT_EQ(long_outcome->tokens, Reference(long_prompt, 1));
  EXPECT_EQ(running_outcome->tokens, Reference(running, kRunningTokens));
  EXPECT_TRUE(WaitStateFreed());
}

// Batching changes the rounding of matrix products (rows of a batch go through other kernels),
// by about 1e-7 on these logits: far below the gaps between the top logits of this checkpoint, so
// greedy tokens do not change.
TEST_F(AttentionServerTest, ConcurrentStreamsGiveTheTokensOfSequentialRuns) {
  constexpr int kStreams = 8;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> sequential;
  const double steps_before = MetricValue("k3_attention_step_tokens_count");
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(Prompt(2 + 3 * i, 100 + i));
    absl::StatusOr<GenerateOutcome> outcome = Generate(Request(prompts[i], 10 + i));
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    sequential.push_back(outcome->tokens);
  }
  const double sequential_steps = MetricValue("k3_attention_step_tokens_count") - steps_before;
  EXPECT_EQ(sequential_steps, 8 * 10 + 28);  // one prefill step and a decode step per later token

  std::vector<absl::StatusOr<GenerateOutcome>> concurrent(kStreams, absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] { concurrent[i] = Generate(Request(prompts[i], 10 + i)); });
  }
  for (std::thread& thread : threads) thread.join();
  const double concurrent_steps =
      MetricValue("k3_attention_step_tokens_count") - steps_before - sequential_steps;
  EXPECT_LT(concurrent_steps, sequential_steps) << "the streams were not batched";
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(concurrent[i].ok()) << concurrent[i].status();
    EXPECT_EQ(concurrent[i]->tokens, sequential[i]) << "stream " << i;
    EXPECT_EQ(concurrent[i]->complete.usage().generated_tokens(), 10 + i);
  }
  EXPECT_TRUE(WaitStateFreed());
}

TEST_F(AttentionServerTest, SeededSamplingIsReproducibleAndMatchesLocalEngine) {
  const std::vector<int32_t> prompt = Prompt(7, 9);
  v1::GenerateRequest request = Request(prompt, 10);
  request.mutable_sampling()->set_temperature(0.9f);
  request.mutable_sampling()->set_top_p(0.95f);
  request.mutable_sampling()->set_top_k(40);
  request.mutable_sampling()->set_seed(1234);
  absl::StatusOr<GenerateOutcome> first = Generate(request);
  absl::StatusOr<GenerateOutcome> second = Generate(request);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->tokens, second->tokens);
  SamplingOptions sampling;
  sampling.temperature = 0.9f;
  sampling.top_p = 0.95f;
  sampling.top_k = 40;
  sampling.seed = 1234;
  EXPECT_EQ(first->tokens, Reference(prompt, 10, sampling));
}

TEST_F(AttentionServerTest, StopTokenEndsTheStreamWithStop) {
  const std::vector<int32_t> prompt = Prompt(5, 21);
  const std::vector<int32_t> free_run = Reference(prompt, 12);
  ASSERT_EQ(free_run.size(), 12u);
  const int32_t stop = free_run[4];
  const size_t first = std::find(free_run.begin(), free_run.end(), stop) - free_run.begin();
  v1::GenerateRequest request = Request(prompt, 12);
  request.mutable_sampling()->add_stop_token_ids(stop);
  absl::StatusOr<GenerateOutcome> outcome = Generate(request);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));
  EXPECT_EQ(outcome->complete.finish_reason(), v1::Complete::STOP);
  EXPECT_EQ(outcome->complete.usage().generated_tokens(), static_cast<int>(first + 1));
  EXPECT_EQ(outcome->complete.usage().prompt_tokens(), 5);
}

// The model's eos_token_id ends a stream like a stop token, unless the request says ignore_eos;
// the single-process engine does the same. The reference is the suite's free run cut after its
// first eos (the checkpoint below differs from the suite's only in eos_token_id).
TEST_F(AttentionServerTest, EosTokenEndsTheStreamUnlessIgnored) {
  const std::vector<int32_t> prompt = Prompt(5, 23);
  const std::vector<int32_t> free_run = Reference(prompt, 12);
  ASSERT_EQ(free_run.size(), 12u);
  const int32_t eos = free_run[3];
  const size_t first = std::find(free_run.begin(), free_run.end(), eos) - free_run.begin();
  const std::vector<int32_t> until_eos(free_run.begin(), free_run.begin() + first + 1);

  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  ASSERT_NE(config->eos_token_id, eos);
  config->eos_token_id = eos;
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / "attention_server_k3_tiny_eos";
  ASSERT_TRUE(WriteRandomModelFolder(*config, 11, dir.string()).ok());
  absl::StatusOr<std::unique_ptr<ProcessEngine>> engine =
      ProcessEngine::Open(dir.string(), ComputeDevice());
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerationRequest local_request;
  local_request.prompt = prompt;
  local_request.max_new_tokens = 12;
  absl::StatusOr<std::vector<int32_t>> local = (*engine)->Generate(local_request);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, until_eos);
  local_request.ignore_eos = true;
  local = (*engine)->Generate(local_request);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, free_run);

  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadWeights(
      std::shared_ptr<const Checkpoint>(std::move(*checkpoint)), WeightSelection::All());
  ASSERT_TRUE(weights.ok()) << weights.status();
  FlakyMoe moe(weights->get());
  AttentionServerOptions server_options;
  server_options.node.host = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<AttentionServer>> server =
      AttentionServer::StartStandalone(server_options, weights->get(), &moe);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  absl::StatusOr<GenerateOutcome> outcome =
      GenerateOverGrpc(address, Request(prompt, 12), absl::Seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, until_eos);
  EXPECT_EQ(outcome->complete.finish_reason(), v1::Complete::STOP);
  v1::GenerateRequest ignoring = Request(prompt, 12);
  ignoring.mutable_sampling()->set_ignore_eos(true);
  outcome = GenerateOverGrpc(address, ignoring, absl::Seconds(30));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, free_run);
  EXPECT_EQ(outcome->complete.finish_reason(), v1::Complete::LENGTH);
  (*server)->Shutdown();
}

// A long request_id is refused; an accepted one is sent back once, in the stream's first message.
TEST_F(AttentionServerTest, RequestIdIsBoundedAndSentOncePerStream) {
  v1::GenerateRequest request = Request(Prompt(4, 3), 8);
  request.set_request_id(std::string(kMaxRequestIdBytes + 1, 'x'));
  absl::StatusOr<GenerateOutcome> outcome = Generate(request);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(outcome.status().message(), "request_id has 257 bytes"))
      << outcome.status();

  request.set_request_id(std::string(kMaxRequestIdBytes, 'y'));
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, request);
  std::vector<std::string> ids;
  v1::GenerateResponse response;
  while (reader->Read(&response)) ids.push_back(response.request_id());
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(ids.size(), 9u);  // 8 chunks of one token, then the Complete
  EXPECT_EQ(ids[0], request.request_id());
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(ids[i], "") << "message " << i;
}

// A broken step that yields NaN logits ends the stream with INTERNAL and no token; the server
// keeps serving.
TEST_F(AttentionServerTest, NonFiniteLogitsEndTheStreamWithInternalAndNoToken) {
  const std::vector<int32_t> prompt = Prompt(6, 17);
  moe_->SetCorrupt(true);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, Request(prompt, 4));
  int chunks = 0;
  v1::GenerateResponse response;
  while (reader->Read(&response)) chunks += response.has_chunk() ? 1 : 0;
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(chunks, 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "non-finite logits"))
      << status.error_message();
  EXPECT_TRUE(WaitStateFreed());

  moe_->SetCorrupt(false);
  absl::StatusOr<GenerateOutcome> outcome = Generate(Request(prompt, 4));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, Reference(prompt, 4));
}

TEST_F(AttentionServerTest, InvalidRequestsAreRejectedWithInvalidArgument) {
  struct Case {
    const char* what;
    v1::GenerateRequest request;
  };
  std::vector<Case> cases;
  cases.push_back({"prompt_token_ids is empty", Request({}, 4)});
  cases.push_back({"outside the vocabulary", Request({1, 512}, 4)});
  cases.push_back({"outside the vocabulary", Request({-1}, 4)});
  cases.push_back({"max_new_tokens", Request({1}, 4097)});
  v1::GenerateRequest bad = Request({1}, 4);
  bad.mutable_sampling()->set_temperature(-1);
  cases.push_back({"temperature", bad});
  bad = Request({1}, 4);
  bad.mutable_sampling()->set_top_p(0);
  cases.push_back({"top_p", bad});
  bad = Request({1}, 4);
  bad.mutable_sampling()->set_top_p(1.5f);
  cases.push_back({"top_p", bad});
  bad = Request({1}, 4);
  bad.mutable_sampling()->set_top_k(-3);
  cases.push_back({"top_k", bad});
  bad = Request({1}, 4);
  bad.mutable_sampling()->add_stop_token_ids(100000);
  cases.push_back({"stop token", bad});
  for (const Case& c : cases) {
    absl::StatusOr<GenerateOutcome> outcome = Generate(c.request);
    EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(absl::StrContains(outcome.status().message(), c.what))
        << c.what << ": " << outcome.status();
  }
  EXPECT_TRUE(WaitStateFreed());
}

// The latency histograms and call counts users watch, against what this test did: one
// time-to-first-token and one end-to-end observation per request, one inter-token observation per
// token after a request's first, one call per status code.
TEST_F(AttentionServerTest, LatencyHistogramsAndCallCountsMatchTheRequestsMade) {
  const std::string ttft = "k3_attention_time_to_first_token_seconds";
  const std::string itl = "k3_attention_inter_token_seconds";
  const std::string e2e = "k3_attention_request_seconds";
  const std::string ok_calls = "k3_attention_generate_calls_total{code=\"OK\"}";
  const std::string invalid_calls = "k3_attention_generate_calls_total{code=\"INVALID_ARGUMENT\"}";
  auto count = [](const std::string& sample) { return std::max(0.0, MetricValue(sample)); };
  const double ttft0 = count(ttft + "_count"), itl0 = count(itl + "_count");
  const double e2e0 = count(e2e + "_count"), ttft_sum0 = count(ttft + "_sum");
  const double e2e_sum0 = count(e2e + "_sum");
  const double ok0 = count(ok_calls), invalid0 = count(invalid_calls);

  constexpr int kRequests = 4;
  int tokens_after_first = 0;
  for (int i = 0; i < kRequests; ++i) {
    absl::StatusOr<GenerateOutcome> outcome = Generate(Request(Prompt(3 + i, 40 + i), 2 + 3 * i));
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    ASSERT_FALSE(outcome->tokens.empty());
    tokens_after_first += static_cast<int>(outcome->tokens.size()) - 1;
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Generate(Request({}, 4)).status().code(), absl::StatusCode::kInvalidArgument);
  }

  EXPECT_EQ(count(ttft + "_count") - ttft0, kRequests);
  EXPECT_EQ(count(itl + "_count") - itl0, tokens_after_first);
  EXPECT_EQ(count(e2e + "_count") - e2e0, kRequests);
  EXPECT_EQ(count(ok_calls) - ok0, kRequests);
  EXPECT_EQ(count(invalid_calls) - invalid0, 2);
  // Every request's first token came before its end.
  EXPECT_GT(count(ttft + "_sum") - ttft_sum0, 0);
  EXPECT_GE(count(e2e + "_sum") - e2e_sum0, count(ttft + "_sum") - ttft_sum0);
  // The +Inf bucket of a histogram holds its count.
  EXPECT_EQ(MetricValue(itl + "_bucket{le=\"+Inf\"}"), count(itl + "_count"));
}

TEST_F(AttentionServerTest, CancelledStreamFreesItsState) {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, Request(Prompt(9, 4), 4096));
  v1::GenerateResponse response;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&response));
  const v1::ServerInfo busy = ServerInfo();
  EXPECT_EQ(busy.active_requests(), 1);
  EXPECT_EQ(busy.cached_sequences(), 1);
  EXPECT_GT(busy.request_state_bytes(), 0);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitStateFreed());
}

TEST_F(AttentionServerTest, AbortEndsTheStreamWithCancelled) {
  grpc::ClientContext context;
  v1::GenerateRequest request = Request(Prompt(4, 8), 4096);
  request.set_request_id("abort-me");
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, request);
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.request_id(), "abort-me");

  // While it runs, its id is taken.
  absl::StatusOr<GenerateOutcome> duplicate = Generate(request);
  EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists) << duplicate.status();

  v1::AbortRequest abort;
  abort.set_request_id("abort-me");
  v1::AbortResponse aborted;
  {
    grpc::ClientContext abort_context;
    ASSERT_TRUE(stub_->Abort(&abort_context, abort, &aborted).ok());
  }
  EXPECT_TRUE(aborted.found());
  bool complete = false;
  int generated = 1;
  while (reader->Read(&response)) {
    if (response.has_chunk()) ++generated;
    if (response.has_complete()) {
      complete = true;
      EXPECT_EQ(response.complete().finish_reason(), v1::Complete::CANCELLED);
      EXPECT_EQ(response.complete().usage().generated_tokens(), generated);
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(complete);
  EXPECT_TRUE(WaitStateFreed());
  {
    grpc::ClientContext abort_context;
    ASSERT_TRUE(stub_->Abort(&abort_context, abort, &aborted).ok());
  }
  EXPECT_FALSE(aborted.found());
}

TEST_F(AttentionServerTest, FailedStepEndsEveryStreamWithUnavailableAndServingContinues) {
  constexpr int kStreams = 3;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers;
  v1::GenerateResponse response;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub_->Generate(contexts.back().get(), Request(Prompt(3 + i, i), 4096)));
    ASSERT_TRUE(readers.back()->Read(&response));
  }
  const absl::Time failed_at = absl::Now();
  moe_->SetFailure(absl::UnavailableError("expert worker node 9 (pid 77 on host-b) lost: killed"));
  for (int i = 0; i < kStreams; ++i) {
    bool error_complete = false;
    while (readers[i]->Read(&response)) {
      if (response.has_complete()) {
        error_complete = response.complete().finish_reason() == v1::Complete::ERROR;
      }
    }
    const grpc::Status status = readers[i]->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << "stream " << i;
    EXPECT_TRUE(absl::StrContains(status.error_message(), "expert worker node 9"))
        << status.error_message();
    EXPECT_TRUE(error_complete) << "stream " << i;
  }
  EXPECT_LT(absl::Now() - failed_at, absl::Seconds(2));
  EXPECT_TRUE(WaitStateFreed());

  moe_->SetFailure(absl::OkStatus());
  const std::vector<int32_t> prompt = Prompt(6, 30);
  absl::StatusOr<GenerateOutcome> outcome = Generate(Request(prompt, 6));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens, Reference(prompt, 6));
}

TEST_F(AttentionServerTest, ModelInfoHealthAndDrain) {
  {
    grpc::ClientContext context;
    v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.vocab_size(), weights_->config.vocab_size);
    EXPECT_EQ(info.num_layers(), weights_->config.num_hidden_layers);
    EXPECT_EQ(info.max_new_tokens_limit(), SchedulerOptions().max_new_tokens_limit);
    EXPECT_EQ(info.model_type(), weights_->config.model_type);
  }
  absl::StatusOr<bool> serving = CheckServing(channel_, kK3ServeServiceName, absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);

  // A request in flight when the drain starts still runs to its end.
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, Request(Prompt(3, 5), 40));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  auto control = k3serve::cluster::v1::AttentionControl::NewStub(channel_);
  grpc::ClientContext drain_context;
  k3serve::cluster::v1::DrainNodeRequest drain;
  drain.set_deadline_ms(10000);
  k3serve::cluster::v1::DrainNodeResponse drained;
  ASSERT_TRUE(control->Drain(&drain_context, drain, &drained).ok());
  EXPECT_EQ(drained.active_requests(), 0);
  int generated = 1;
  while (reader->Read(&response)) {
    if (response.has_chunk()) ++generated;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(generated, 40);
  serving = CheckServing(channel_, kK3ServeServiceName, absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  EXPECT_TRUE(ServerInfo().draining());
  absl::StatusOr<GenerateOutcome> refused = Generate(Request({1, 2}, 2));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
}

// A drain whose deadline passes cancels what still runs, with UNAVAILABLE, and answers how many
// requests that was, no earlier than the deadline.
TEST_F(AttentionServerTest, ADrainWhoseDeadlinePassesCancelsWhatRunsAndCountsIt) {
  moe_->SetDelay(absl::Milliseconds(5));  // 40 tokens of k3-tiny's MoE layers: seconds
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, Request(Prompt(3, 7), 40));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  auto control = k3serve::cluster::v1::AttentionControl::NewStub(channel_);
  grpc::ClientContext drain_context;
  k3serve::cluster::v1::DrainNodeRequest drain;
  drain.set_deadline_ms(300);
  k3serve::cluster::v1::DrainNodeResponse drained;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(control->Drain(&drain_context, drain, &drained).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_EQ(drained.active_requests(), 1);
  while (reader->Read(&response)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "drain deadline passed"))
      << status.error_message();
  moe_->SetDelay(absl::ZeroDuration());
}

// Runs `request` and returns its tokens and the text of its chunks and Complete, concatenated.
struct TextOutcome {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
};
TextOutcome GenerateText(v1::K3Serve::Stub* stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto reader = stub->Generate(&context, request);
  TextOutcome outcome;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      outcome.tokens.insert(outcome.tokens.end(), response.chunk().token_ids().begin(),
                            response.chunk().token_ids().end());
      outcome.text += response.chunk().text();
    } else {
      outcome.text += response.complete().text();
    }
  }
  outcome.status = reader->Finish();
  return outcome;
}

TEST_F(AttentionServerTest, TextPromptStreamsTheTextOfTheTokens) {
  StartServer(SchedulerOptions(), ModelDir());
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(ModelDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  v1::GenerateRequest request = Request({}, 10);
  request.set_prompt_text("The sky is \xe2\x98\x80 blue");
  const TextOutcome outcome = GenerateText(stub_.get(), request);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_EQ(outcome.tokens, Reference(*tokenizer->Encode(request.prompt_text()), 10));
  EXPECT_EQ(outcome.text, *DecodeForDisplay(*tokenizer, outcome.tokens));
  EXPECT_TRUE(WaitStateFreed());
}

TEST_F(AttentionServerTest, ChatMessagesAreRenderedAndStopAtTheTurnEnd) {
  StartServer(SchedulerOptions(), ModelDir());
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(ModelDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  v1::GenerateRequest request = Request({}, 10);
  v1::ChatMessage* message = request.add_messages();
  message->set_role("user");
  message->set_content("Hello");
  const TextOutcome outcome = GenerateText(stub_.get(), request);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  const std::vector<int32_t> prompt =
      *RenderChat(*tokenizer, {{.role = "user", .content = "Hello"}}, {.thinking = false});
  EXPECT_EQ(outcome.tokens, Reference(prompt, 10, SamplingOptions(), {*TurnEndId(*tokenizer)}));
  // The turn end that may close the answer adds no text.
  std::vector<int32_t> answer = outcome.tokens;
  if (!answer.empty() && answer.back() == *TurnEndId(*tokenizer)) answer.pop_back();
  EXPECT_EQ(outcome.text, *DecodeForDisplay(*tokenizer, answer));
}

TEST_F(AttentionServerTest, TextNeedsATokenizerAndOnePromptForm) {
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_FALSE(info.has_tokenizer());
  v1::GenerateRequest request = Request({}, 4);
  request.set_prompt_text("hello");
  TextOutcome outcome = GenerateText(stub_.get(), request);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(outcome.status.error_message(), "tokenizer"))
      << outcome.status.error_message();

  StartServer(SchedulerOptions(), ModelDir());
  grpc::ClientContext context2;
  ASSERT_TRUE(stub_->GetModelInfo(&context2, {}, &info).ok());
  EXPECT_TRUE(info.has_tokenizer());
  request.add_prompt_token_ids(1);  // text and ids at once
  outcome = GenerateText(stub_.get(), request);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Token-id requests still get ids, now with their text.
  outcome = GenerateText(stub_.get(), Request(Prompt(5, 1), 4));
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(ModelDir());
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(outcome.text, *DecodeForDisplay(*tokenizer, outcome.tokens));
}

}  // namespace
}  // namespace k3
