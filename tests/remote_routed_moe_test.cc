// RemoteRoutedMoe over the in-process transport, against fake routers that compute with
// LocalRoutedMoe: answers must equal LocalRoutedMoe called directly, bit for bit; a layer outlives
// a router's error, death or silence by sending its rows again until the layer's timeout, and
// then ends Wait with a clear status instead of a hang.
#include "attention_nodes/moe_client/remote_routed_moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "cluster/test_wait.h"
#include "attention_nodes/forward/model_runner.h"
#include "cluster/inproc_transport.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "engine/local_routed_moe.h"
#include "moe/moe_wire.h"
#include "tools/random_model_folder.h"

namespace k3 {
namespace {

namespace fs = std::filesystem;

constexpr PeerId kAttentionPeer = 100;  // the routers' name for the attention side

std::unique_ptr<ModelWeights> TinyWeights() {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : "/tmp") / "remote_routed_moe_k3_tiny";
  fs::remove_all(dir);
  absl::StatusOr<ModelConfig> config = NamedConfig("k3-tiny");
  EXPECT_TRUE(config.ok());
  EXPECT_TRUE(WriteRandomModelFolder(*config, 7, dir.string()).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.string());
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      LoadWeights(std::shared_ptr<const Checkpoint>(std::move(*checkpoint)), WeightSelection::All());
  EXPECT_TRUE(weights.ok()) << weights.status();
  return std::move(*weights);
}

std::vector<float> RandomRows(int64_t tokens, int width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> rows(static_cast<size_t>(tokens * width));
  for (float& v : rows) v = normal(rng);
  return rows;
}

// A router in a thread: answers each MoeRequest with LocalRoutedMoe, or as told by `mode`.
class FakeRouter {
 public:
  enum class Mode {
    kAnswer,          // the right answer
    kFail,            // status UNAVAILABLE naming a lost worker
    kAbort,           // status ABORTED: this router cannot serve (not connected yet)
    kSilent,          // never answers
    kStaleThenAnswer  // first an answer with another step id and garbage rows, then the right one
  };

  FakeRouter(InProcNetwork* network, const ModelWeights* weights, Mode mode)
      : transport_(network->CreateTransport()), moe_(weights), weights_(weights), mode_(mode) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeRouter() {
    stop_ = true;
    thread_.join();
  }

  InProcTransport& transport() { return *transport_; }
  int requests() const { return requests_; }
  // While held, requests are taken but not answered (a stopped process); Release answers them.
  void Hold() { held_ = true; }
  void Release() { held_ = false; }
  // The trace contexts each MoeRequest carried, in arrival order.
  std::vector<std::vector<TraceContext>> traces() {
    absl::MutexLock lock(&mu_);
    return traces_;
  }
  // How it answers from now on (a router or its expert worker coming back).
  void set_mode(Mode mode) { mode_ = mode; }
  // Simulated compute time before each answer.
  void set_delay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

 private:
  void Loop() {
    while (!stop_) {
      absl::StatusOr<Received> received =
          transport_->Receive(absl::Now() + absl::Milliseconds(20));
      if (!received.ok() && !absl::IsDeadlineExceeded(received.status())) {
        absl::SleepFor(absl::Milliseconds(1));  // killed: nothing more will arrive
      }
      if (received.ok() && received->kind == Received::Kind::kMessage) {
        backlog_.push_back(*std::move(received));
        ++requests_;
      }
      if (held_ || backlog_.empty()) continue;
      received = std::move(backlog_.front());
      backlog_.erase(backlog_.begin());
      MoeRequest request;
      ASSERT_TRUE(Decode(received->bytes, &request).ok());
      {
        absl::MutexLock lock(&mu_);
        traces_.push_back(request.traces);
        if (delay_ > absl::ZeroDuration()) absl::SleepFor(delay_);
      }
      MoeResponse response;
      response.step_id = request.step_id;
      switch (mode_.load()) {
        case Mode::kSilent:
          continue;
        case Mode::kFail:
          response.status = absl::UnavailableError("expert worker node 5 (pid 42 on h) lost");
          break;
        case Mode::kAbort:
          response.status = absl::AbortedError("expert worker node 5 is not connected to this router");
          break;
        case Mode::kStaleThenAnswer: {
          MoeResponse stale;
          stale.step_id = request.step_id + 1000000;
          stale.tokens = request.tokens;
          stale.width = weights_->config.ExpertWidth();
          stale.rows.assign(static_cast<size_t>(stale.tokens * stale.width), 1e9f);
          ASSERT_TRUE(transport_->Send(received->from, Encode(stale)).ok());
          [[fallthrough]];
        }
        case Mode::kAnswer:
          response.tokens = request.tokens;
          response.width = weights_->config.ExpertWidth();
          response.rows.resize(static_cast<size_t>(response.tokens * response.width));
          response.status = moe_.Begin(request.layer, request.rows.data(), request.tokens);
          if (response.status.ok()) response.status = moe_.Wait(response.rows.data());
          if (!response.status.ok()) response.rows.clear();
          break;
      }
      ASSERT_TRUE(transport_->Send(received->from, Encode(response)).ok());
    }
  }

  std::unique_ptr<InProcTransport> transport_;
  LocalRoutedMoe moe_;
  const ModelWeights* weights_;
  std::atomic<Mode> mode_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::atomic<bool> held_{false};
  std::vector<Received> backlog_;  // loop thread only
  absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::vector<std::vector<TraceContext>> traces_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class RemoteRoutedMoeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { weights_ = TinyWeights().release(); }
  static void TearDownTestSuite() { delete weights_; }

  // Links the attention transport and a router both ways; the attention side calls it `id`.
  void Link(FakeRouter& router, PeerId id) {
    ASSERT_TRUE(attention_->Connect(id, router.transport().LocalAddress()).ok());
    ASSERT_TRUE(router.transport().Connect(kAttentionPeer, attention_->LocalAddress()).ok());
  }

  const ModelConfig& config() const { return weights_->config; }
  // What the in-process engine answers for MoE layer `layer` on `tokens` rows x.
  std::vector<float> InProcessAnswer(int layer, const std::vector<float>& x, int64_t tokens) {
    std::vector<float> out(static_cast<size_t>(tokens * config().ExpertWidth()));
    LocalRoutedMoe local(weights_);
    EXPECT_TRUE(local.Begin(layer, x.data(), tokens).ok());
    EXPECT_TRUE(local.Wait(out.data()).ok());
    return out;
  }
  int FirstMoeLayer() const {
    for (int l = 0; l < config().num_hidden_layers; ++l) {
      if (config().IsMoe(l)) return l;
    }
    return -1;
  }

  static const ModelWeights* weights_;
  InProcNetwork network_;
  std::unique_ptr<InProcTransport> attention_ = network_.CreateTransport();
};

const ModelWeights* RemoteRoutedMoeTest::weights_ = nullptr;

TEST_F(RemoteRoutedMoeTest, LayerAnswersEqualLocalRoutedMoe) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  const int width = config().ExpertWidth();
  int checked = 0;
  for (int layer = 0; layer < config().num_hidden_layers; ++layer) {
    if (!config().IsMoe(layer)) continue;
    for (int64_t tokens : {1, 5}) {
      const std::vector<float> x = RandomRows(tokens, config().hidden_size, layer * 10 + tokens);
      std::vector<float> got(tokens * width);
      ASSERT_TRUE(remote.Begin(layer, x.data(), tokens).ok());
      ASSERT_TRUE(remote.Wait(got.data()).ok());
      EXPECT_EQ(got, InProcessAnswer(layer, x, tokens)) << "layer " << layer << ", " << tokens
                                                       << " rows";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST_F(RemoteRoutedMoeTest, ModelStepLogitsEqualTheInProcessEngine) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  LocalRoutedMoe local(weights_);
  ModelRunner remote_runner(weights_, &remote);
  ModelRunner local_runner(weights_, &local);
  const std::vector<int32_t> prompt = {3, 17, 250, 9, 511, 0, 42};
  std::unique_ptr<SequenceState> a = remote_runner.NewSequence();
  std::unique_ptr<SequenceState> b = local_runner.NewSequence();
  std::vector<float> got, want;
  ASSERT_TRUE(remote_runner.Step({{a.get(), prompt, true}}, &got).ok());
  ASSERT_TRUE(local_runner.Step({{b.get(), prompt, true}}, &want).ok());
  EXPECT_EQ(got, want);
  const std::vector<int32_t> next = {77};
  ASSERT_TRUE(remote_runner.Step({{a.get(), next, false}}, &got).ok());
  ASSERT_TRUE(local_runner.Step({{b.get(), next, false}}, &want).ok());
  EXPECT_EQ(got, want);
}

// Ping-pong: two layers in flight at once are answered in the order they were begun, each with
// its own rows; a third Begin is refused.
TEST_F(RemoteRoutedMoeTest, TwoLayersInFlightAreAnsweredInTheOrderBegun) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  router.set_delay(absl::Milliseconds(5));
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  ASSERT_EQ(remote.Concurrency(), 2);
  const int width = config().ExpertWidth();
  std::vector<int> layers;
  for (int l = 0; l < config().num_hidden_layers; ++l) {
    if (config().IsMoe(l)) layers.push_back(l);
  }
  ASSERT_GE(layers.size(), 2u);
  const std::vector<float> a = RandomRows(3, config().hidden_size, 21);
  const std::vector<float> b = RandomRows(2, config().hidden_size, 22);
  std::vector<float> got_a(3 * width), got_b(2 * width);
  ASSERT_TRUE(remote.Begin(layers[0], a.data(), 3).ok());
  ASSERT_TRUE(remote.Begin(layers[1], b.data(), 2).ok());
  EXPECT_EQ(remote.Begin(layers[0], a.data(), 3).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(remote.Wait(got_a.data()).ok());
  ASSERT_TRUE(remote.Wait(got_b.data()).ok());
  EXPECT_EQ(got_a, InProcessAnswer(layers[0], a, 3));
  EXPECT_EQ(got_b, InProcessAnswer(layers[1], b, 2));
  EXPECT_EQ(router.requests(), 2);
}

// A failed layer fails the step and abandons the other layer in flight: nothing is left to wait
// for, and the next step starts clean.
TEST_F(RemoteRoutedMoeTest, AFailedLayerAbandonsTheOtherOneInFlight) {
  FakeRouter failing(&network_, weights_, FakeRouter::Mode::kFail);
  Link(failing, 1);
  RemoteRoutedMoeOptions options;
  options.timeout = absl::Milliseconds(300);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  const std::vector<float> x = RandomRows(2, config().hidden_size, 23);
  std::vector<float> out(2 * config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  EXPECT_EQ(remote.Wait(out.data()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(remote.Wait(out.data()).code(), absl::StatusCode::kFailedPrecondition);

  FakeRouter good(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(good, 2);
  remote.SetRouters({2});
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  remote.Abandon();  // e.g. the step failed in an attention layer
  EXPECT_EQ(remote.Wait(out.data()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  ASSERT_TRUE(remote.Wait(out.data()).ok());
  EXPECT_EQ(out, InProcessAnswer(FirstMoeLayer(), x, 2));  // not the abandoned layers' answers
}

// A batch of several sequences runs as two ping-pong micro-batches through the router tier; each
// sequence's logits match the in-process engine running the whole batch (up to fp32 summation
// order: the micro-batches share fewer rows per product) and greedy decoding picks the same tokens.
TEST_F(RemoteRoutedMoeTest, PingPongMicroBatchesDecodeLikeTheInProcessEngine) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  LocalRoutedMoe local(weights_);
  ModelRunner remote_runner(weights_, &remote);
  remote_runner.set_ping_pong(PingPong::kAlways);
  ModelRunner local_runner(weights_, &local);
  const std::vector<std::vector<int32_t>> prompts = {{3, 17, 250, 9}, {511, 0}, {42, 8, 1}};
  std::vector<std::unique_ptr<SequenceState>> remote_states, local_states;
  for (size_t i = 0; i < prompts.size(); ++i) {
    remote_states.push_back(remote_runner.NewSequence());
    local_states.push_back(local_runner.NewSequence());
  }
  const int moe_layers = config().NumMoeLayers();
  std::vector<std::vector<int32_t>> inputs = prompts;
  std::vector<std::vector<int32_t>> remote_tokens(prompts.size()), local_tokens(prompts.size());
  const int vocab = config().vocab_size;
  for (int step = 0; step < 6; ++step) {
    std::vector<BatchEntry> remote_batch, local_batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      remote_batch.push_back({remote_states[i].get(), inputs[i], false});
      local_batch.push_back({local_states[i].get(), inputs[i], false});
    }
    std::vector<float> got, want;
    ASSERT_TRUE(remote_runner.Step(remote_batch, &got).ok());
    ASSERT_TRUE(local_runner.Step(local_batch, &want).ok());
    // Two micro-batches: each MoE layer waited for twice.
    EXPECT_TRUE(remote_runner.last_profile().ping_pong);
    EXPECT_EQ(remote_runner.last_profile().layer_moe_wait.size(), 2u * moe_layers);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "step " << step << " " << i;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const float* g = got.data() + i * vocab;
      const float* w = want.data() + i * vocab;
      remote_tokens[i].push_back(static_cast<int32_t>(std::max_element(g, g + vocab) - g));
      local_tokens[i].push_back(static_cast<int32_t>(std::max_element(w, w + vocab) - w));
      inputs[i] = {local_tokens[i].back()};
    }
  }
  EXPECT_EQ(remote_tokens, local_tokens);
  // Off, the same runner steps the batch whole.
  remote_runner.set_ping_pong(PingPong::kOff);
  std::vector<BatchEntry> batch;
  for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({remote_states[i].get(), inputs[i], false});
  std::vector<float> logits;
  ASSERT_TRUE(remote_runner.Step(batch, &logits).ok());
  EXPECT_FALSE(remote_runner.last_profile().ping_pong);
  EXPECT_EQ(remote_runner.last_profile().layer_moe_wait.size(), static_cast<size_t>(moe_layers));
}

// Traced sequences' contexts go with the MoE rows of the micro-batch that holds them: with
// ping-pong each layer's two requests split the traces between them; whole, one request carries
// all; an untraced step carries none.
TEST_F(RemoteRoutedMoeTest, TraceContextsGoWithTheirMicroBatchsRows) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  ModelRunner runner(weights_, &remote);
  runner.set_ping_pong(PingPong::kAlways);
  const TraceContext first =
      ParseTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").value();
  const TraceContext last = first.WithSpan(NewSpanId());
  const std::vector<std::vector<int32_t>> prompts = {{3, 17, 250, 9}, {511, 0}, {42, 8, 1}};
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<BatchEntry> batch;
  for (const std::vector<int32_t>& prompt : prompts) {
    states.push_back(runner.NewSequence());
    batch.push_back({states.back().get(), prompt, false});
  }
  batch[0].trace = &first;
  batch[2].trace = &last;
  const int moe_layers = config().NumMoeLayers();
  std::vector<float> logits;
  ASSERT_TRUE(runner.Step(batch, &logits).ok());
  ASSERT_TRUE(runner.last_profile().ping_pong);
  std::vector<std::vector<TraceContext>> seen = router.traces();
  ASSERT_EQ(seen.size(), 2u * moe_layers);
  int carried_first = 0, carried_last = 0;
  for (const std::vector<TraceContext>& traces : seen) {
    ASSERT_EQ(traces.size(), 1u);  // the cut puts sequences 0 and 2 in different micro-batches
    carried_first += traces[0] == first ? 1 : 0;
    carried_last += traces[0] == last ? 1 : 0;
  }
  EXPECT_EQ(carried_first, moe_layers);
  EXPECT_EQ(carried_last, moe_layers);

  runner.set_ping_pong(PingPong::kOff);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].tokens = absl::MakeConstSpan(&prompts[i][0], 1);
  }
  ASSERT_TRUE(runner.Step(batch, &logits).ok());
  batch[0].trace = batch[2].trace = nullptr;
  ASSERT_TRUE(runner.Step(batch, &logits).ok());
  seen = router.traces();
  ASSERT_EQ(seen.size(), 4u * moe_layers);
  for (int i = 0; i < moe_layers; ++i) {
    EXPECT_EQ(seen[2 * moe_layers + i], (std::vector<TraceContext>{first, last}));
    EXPECT_TRUE(seen[3 * moe_layers + i].empty());
  }
}

// A router that keeps answering UNAVAILABLE (its expert worker is lost and nobody else holds its
// experts) gets the rows again with a back-off; at the layer's timeout its error stands.
TEST_F(RemoteRoutedMoeTest, RouterErrorIsReturnedWithItsMessageAtTheTimeout) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kFail);
  Link(router, 1);
  RemoteRoutedMoeOptions options;
  options.timeout = absl::Milliseconds(500);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  const std::vector<float> x = RandomRows(2, config().hidden_size, 1);
  std::vector<float> out(2 * config().ExpertWidth());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  const absl::Status status = remote.Wait(out.data());
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(status.message(), "expert worker node 5")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "router 1")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "--moe-timeout-ms")) << status;
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(3));
  // Sent again with a back-off of 100, 200 ms...: a few times, not in a busy loop.
  EXPECT_GE(router.requests(), 2);
  EXPECT_LE(router.requests(), 5);
}

// The same router serves the layer once its expert worker is back: the step does not fail.
TEST_F(RemoteRoutedMoeTest, ALayerIsSentAgainUntilItsRouterCanServeIt) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kFail);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(2, config().hidden_size, 31);
  std::vector<float> got(2 * config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(layer, x.data(), 2).ok());
  std::thread heal([&] {
    ASSERT_TRUE(WaitFor([&] { return router.requests() >= 2; }));
    router.set_mode(FakeRouter::Mode::kAnswer);
  });
  const absl::Status status = remote.Wait(got.data());
  heal.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, InProcessAnswer(layer, x, 2));
  EXPECT_GE(remote.retries(), 2u);
}

// A router that cannot serve (ABORTED: e.g. just started, not yet connected to every expert
// worker) hands the layer to another router; alone, its error stands.
TEST_F(RemoteRoutedMoeTest, AnAbortedLayerGoesToAnotherRouter) {
  FakeRouter starting(&network_, weights_, FakeRouter::Mode::kAbort);
  FakeRouter healthy(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(starting, 1);
  Link(healthy, 2);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1, 2});
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(3, config().hidden_size, 6);
  std::vector<float> got(3 * config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(layer, x.data(), 3).ok());  // round-robin starts with router 1
  ASSERT_TRUE(remote.Wait(got.data()).ok());
  EXPECT_EQ(got, InProcessAnswer(layer, x, 3));
  EXPECT_EQ(starting.requests(), 1);
  EXPECT_EQ(healthy.requests(), 1);

  RemoteRoutedMoeOptions options;
  options.timeout = absl::Milliseconds(300);
  RemoteRoutedMoe alone(attention_.get(), config(), options);
  alone.SetRouters({1});
  ASSERT_TRUE(alone.Begin(layer, x.data(), 3).ok());
  const absl::Status status = alone.Wait(got.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "router 1")) << status;
}

TEST_F(RemoteRoutedMoeTest, StaleAnswersAreDropped) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kStaleThenAnswer);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1});
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(3, config().hidden_size, 2);
  std::vector<float> got(3 * config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(layer, x.data(), 3).ok());
  ASSERT_TRUE(remote.Wait(got.data()).ok());
  EXPECT_EQ(got, InProcessAnswer(layer, x, 3));
  EXPECT_EQ(remote.stale_answers(), 1u);
}

TEST_F(RemoteRoutedMoeTest, SilentRouterHitsTheDeadline) {
  FakeRouter silent(&network_, weights_, FakeRouter::Mode::kSilent);
  Link(silent, 1);
  RemoteRoutedMoeOptions options;
  options.timeout = absl::Milliseconds(200);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  const std::vector<float> x = RandomRows(1, config().hidden_size, 3);
  std::vector<float> out(config().ExpertWidth());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 1).ok());
  const absl::Status status = remote.Wait(out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "router 1")) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// A layer whose only router died waits for a router to be listed (its restart, under whatever
// id) and goes there; with none listed within the timeout it fails naming the dead router.
TEST_F(RemoteRoutedMoeTest, ALayerWhoseOnlyRouterDiedGoesToTheRestartedOne) {
  FakeRouter doomed(&network_, weights_, FakeRouter::Mode::kSilent);
  Link(doomed, 1);
  std::vector<PeerId> failed;
  RemoteRoutedMoeOptions options;
  options.on_router_failed = [&failed](PeerId peer, const absl::Status&) { failed.push_back(peer); };
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(1, config().hidden_size, 4);
  std::vector<float> got(config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(layer, x.data(), 1).ok());
  ASSERT_TRUE(WaitFor([&] { return doomed.requests() == 1; }));
  doomed.transport().Kill();
  FakeRouter restarted(&network_, weights_, FakeRouter::Mode::kAnswer);
  std::thread restart([&] {
    ASSERT_TRUE(WaitFor([&] { return remote.usable_routers() == 0; }));
    absl::SleepFor(absl::Milliseconds(200));
    Link(restarted, 2);
    remote.SetRouters({2});
  });
  const absl::Status status = remote.Wait(got.data());
  restart.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, InProcessAnswer(layer, x, 1));
  EXPECT_EQ(failed, std::vector<PeerId>{1});
  EXPECT_EQ(restarted.requests(), 1);
}

TEST_F(RemoteRoutedMoeTest, ADeadRouterFailsTheLayerWhenNoneComesBack) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kSilent);
  Link(router, 1);
  RemoteRoutedMoeOptions options;
  options.timeout = absl::Milliseconds(500);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  const std::vector<float> x = RandomRows(1, config().hidden_size, 4);
  std::vector<float> out(config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 1).ok());
  ASSERT_TRUE(WaitFor([&] { return router.requests() == 1; }));
  router.transport().Kill();
  const absl::Status status = remote.Wait(out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "router 1")) << status;
  EXPECT_EQ(remote.usable_routers(), 0);
}

// A router stopped past the step deadline with no other router: the layer waits for it, through
// the owner's DEAD verdict (unlisted) and its return (listed again), and takes its answer.
TEST_F(RemoteRoutedMoeTest, AStoppedOnlyRouterIsWaitedForAndUsedAgain) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(router, 1);
  RemoteRoutedMoeOptions options;
  options.retry_floor = absl::Milliseconds(50);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(2, config().hidden_size, 12);
  std::vector<float> got(2 * config().ExpertWidth());
  router.Hold();
  ASSERT_TRUE(remote.Begin(layer, x.data(), 2).ok());
  std::thread resume([&] {
    absl::SleepFor(absl::Milliseconds(300));
    remote.SetRouters({});  // declared DEAD
    absl::SleepFor(absl::Milliseconds(300));
    remote.SetRouters({1});  // ALIVE again: the rows go to it again; then it runs
    ASSERT_TRUE(WaitFor([&] { return router.requests() == 2; }));
    router.Release();
  });
  const absl::Status status = remote.Wait(got.data());
  resume.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, InProcessAnswer(layer, x, 2));
  // Its first attempt and the one sent when it was listed again; the later answer is stale.
  EXPECT_EQ(router.requests(), 2);
  // New layers go to it as before.
  ASSERT_TRUE(remote.Begin(layer, x.data(), 2).ok());
  ASSERT_TRUE(remote.Wait(got.data()).ok());
  EXPECT_EQ(got, InProcessAnswer(layer, x, 2));
}

TEST_F(RemoteRoutedMoeTest, RowsMoveToAnotherRouterWhenTheirRouterDies) {
  FakeRouter doomed(&network_, weights_, FakeRouter::Mode::kSilent);
  FakeRouter healthy(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(doomed, 1);
  Link(healthy, 2);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1, 2});
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(4, config().hidden_size, 5);
  std::vector<float> got(4 * config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(layer, x.data(), 4).ok());  // round-robin starts with router 1
  while (doomed.requests() == 0) absl::SleepFor(absl::Milliseconds(1));
  doomed.transport().Kill();
  ASSERT_TRUE(remote.Wait(got.data()).ok());
  EXPECT_EQ(got, InProcessAnswer(layer, x, 4));
  EXPECT_EQ(healthy.requests(), 1);
  EXPECT_EQ(remote.usable_routers(), 1);
}

// A router that hangs (no failure, no answer) costs a layer one step deadline: the rows go to the
// other router, new layers avoid the late one until it answers again.
TEST_F(RemoteRoutedMoeTest, AHungRouterIsRoutedAroundAfterTheStepDeadline) {
  FakeRouter hung(&network_, weights_, FakeRouter::Mode::kAnswer);
  FakeRouter healthy(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(hung, 1);
  Link(healthy, 2);
  RemoteRoutedMoeOptions options;
  options.retry_floor = absl::Milliseconds(300);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1, 2});
  EXPECT_EQ(remote.step_deadline(), absl::Milliseconds(300));
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(3, config().hidden_size, 8);
  std::vector<float> got(3 * config().ExpertWidth());
  const std::vector<float> want = InProcessAnswer(layer, x, 3);

  hung.Hold();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(remote.Begin(layer, x.data(), 3).ok());  // round-robin starts with router 1
  ASSERT_TRUE(remote.Wait(got.data()).ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(got, want);
  EXPECT_EQ(remote.retries(), 1u);
  EXPECT_EQ(hung.requests(), 1);
  EXPECT_EQ(healthy.requests(), 1);

  // The hung router is suspect: the next layers all go to the other one, without waiting.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(remote.Begin(layer, x.data(), 3).ok());
    ASSERT_TRUE(remote.Wait(got.data()).ok());
    EXPECT_EQ(got, want);
  }
  EXPECT_EQ(hung.requests(), 1);
  EXPECT_EQ(healthy.requests(), 5);
  EXPECT_EQ(remote.retries(), 1u);

  // Running again, it answers the abandoned step (dropped as stale) and gets layers again.
  hung.Release();
  const bool used_again = WaitFor([&] {
    EXPECT_TRUE(remote.Begin(layer, x.data(), 3).ok());
    EXPECT_TRUE(remote.Wait(got.data()).ok());
    EXPECT_EQ(got, want);
    return hung.requests() > 1;
  });
  EXPECT_TRUE(used_again);
  EXPECT_EQ(remote.stale_answers(), 1u);
}

// When the owner stops listing the router a layer waits for (the coordinator declared it DEAD),
// the rows go to another router at once, long before the step deadline.
TEST_F(RemoteRoutedMoeTest, ARouterNoLongerListedIsRoutedAroundAtOnce) {
  FakeRouter hung(&network_, weights_, FakeRouter::Mode::kAnswer);
  FakeRouter healthy(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(hung, 1);
  Link(healthy, 2);
  RemoteRoutedMoeOptions options;
  options.retry_floor = absl::Seconds(60);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1, 2});
  hung.Hold();
  const std::vector<float> x = RandomRows(2, config().hidden_size, 9);
  std::vector<float> out(2 * config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 2).ok());
  absl::Time dropped;
  std::thread verdict([&] {
    ASSERT_TRUE(WaitFor([&] { return hung.requests() == 1; }));
    dropped = absl::Now();
    remote.SetRouters({2});
  });
  const absl::Status status = remote.Wait(out.data());
  verdict.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(absl::Now() - dropped, absl::Seconds(1));
  EXPECT_EQ(healthy.requests(), 1);
  EXPECT_EQ(remote.retries(), 1u);
}

// The step deadline is a multiple of the measured p99 round trip, never below the floor.
TEST_F(RemoteRoutedMoeTest, TheStepDeadlineFollowsTheMeasuredRoundTrips) {
  FakeRouter slow(&network_, weights_, FakeRouter::Mode::kAnswer);
  slow.set_delay(absl::Milliseconds(20));
  Link(slow, 1);
  RemoteRoutedMoeOptions options;
  options.retry_floor = absl::Milliseconds(1);
  options.retry_p99_factor = 4;
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  remote.SetRouters({1});
  EXPECT_EQ(remote.step_deadline(), absl::Milliseconds(1));  // no measurement yet: the floor
  const std::vector<float> x = RandomRows(1, config().hidden_size, 10);
  std::vector<float> out(config().ExpertWidth());
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 1).ok());
    ASSERT_TRUE(remote.Wait(out.data()).ok());
  }
  EXPECT_GE(remote.step_deadline(), absl::Milliseconds(80));
  EXPECT_LT(remote.step_deadline(), absl::Seconds(10));
  EXPECT_EQ(remote.retries(), 0u);
}

TEST_F(RemoteRoutedMoeTest, LayersAlternateBetweenRouters) {
  FakeRouter first(&network_, weights_, FakeRouter::Mode::kAnswer);
  FakeRouter second(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(first, 1);
  Link(second, 2);
  RemoteRoutedMoe remote(attention_.get(), config());
  remote.SetRouters({1, 2});
  const std::vector<float> x = RandomRows(1, config().hidden_size, 6);
  std::vector<float> out(config().ExpertWidth());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 1).ok());
    ASSERT_TRUE(remote.Wait(out.data()).ok());
  }
  EXPECT_EQ(first.requests(), 3);
  EXPECT_EQ(second.requests(), 3);
}

// With no router at Begin (e.g. right after a router resumed, before the cluster state lists it
// again) the layer waits for one instead of failing the step.
TEST_F(RemoteRoutedMoeTest, ALayerBegunWithoutARouterWaitsForOne) {
  FakeRouter router(&network_, weights_, FakeRouter::Mode::kAnswer);
  Link(router, 1);
  RemoteRoutedMoe remote(attention_.get(), config());
  const int layer = FirstMoeLayer();
  const std::vector<float> x = RandomRows(1, config().hidden_size, 7);
  std::vector<float> got(config().ExpertWidth());
  ASSERT_TRUE(remote.Begin(layer, x.data(), 1).ok());
  std::thread listed([&] {
    absl::SleepFor(absl::Milliseconds(200));
    remote.SetRouters({1});
  });
  const absl::Status status = remote.Wait(got.data());
  listed.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, InProcessAnswer(layer, x, 1));
}

TEST_F(RemoteRoutedMoeTest, NoRouterWithinTheTimeoutIsUnavailable) {
  RemoteRoutedMoeOptions options;
  options.timeout = absl::Milliseconds(200);
  RemoteRoutedMoe remote(attention_.get(), config(), options);
  const std::vector<float> x = RandomRows(1, config().hidden_size, 7);
  ASSERT_TRUE(remote.Begin(FirstMoeLayer(), x.data(), 1).ok());
  std::vector<float> out(config().ExpertWidth());
  const absl::Status status = remote.Wait(out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(status.message(), "no router")) << status;
  EXPECT_EQ(remote.Wait(out.data()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace k3
