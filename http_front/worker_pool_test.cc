// WorkerPool over real gRPC servers in this process: fake attention workers whose Generate sends
// one message and then holds the stream until released, so calls in flight are known exactly.
#include "http_front/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/grpc_server.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

class HoldingWorker final : public v1::K3Serve::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    v1::GenerateResponse first;
    first.set_request_id(request->request_id());
    writer->Write(first);
    while (!release_.HasBeenNotified() && !context->IsCancelled()) {
      release_.WaitForNotificationWithTimeout(absl::Milliseconds(10));
    }
    return grpc::Status::OK;
  }
  void Release() { release_.Notify(); }

 private:
  absl::Notification release_;
};

struct Fake {
  HoldingWorker service;
  std::unique_ptr<GrpcServer> server;
  std::string address;
};

std::unique_ptr<Fake> StartFake() {
  auto fake = std::make_unique<Fake>();
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  options.health_services = {"k3serve.v1.K3Serve"};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {&fake->service});
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  fake->server = *std::move(server);
  fake->address = absl::StrCat("127.0.0.1:", fake->server->port());
  return fake;
}

v1::GenerateRequest Request() {
  v1::GenerateRequest request;
  request.add_prompt_token_ids(1);
  return request;
}

TEST(WorkerPoolTest, NewCallsGoToTheLeastLoadedWorker) {
  std::unique_ptr<Fake> a = StartFake(), b = StartFake(), c = StartFake();
  ASSERT_TRUE(a && b && c);
  WorkerPool pool({a->address, b->address, c->address});
  std::vector<std::unique_ptr<GenerateCall>> calls;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
    ASSERT_TRUE(call.ok()) << call.status();
    calls.push_back(*std::move(call));
  }
  EXPECT_EQ(pool.Loads(), (std::vector<int>{2, 2, 2}));
  // Calls end in an order unrelated to their workers; each new one lands on a worker that had
  // the fewest calls in flight.
  for (int step = 0; step < 30; ++step) {
    if (step % 3 == 2) {
      calls.erase(calls.begin() + (step * 7) % calls.size());
      continue;
    }
    const std::vector<int> before = pool.Loads();
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
    ASSERT_TRUE(call.ok()) << call.status();
    calls.push_back(*std::move(call));
    const std::vector<int> after = pool.Loads();
    const int least = *std::min_element(before.begin(), before.end());
    for (size_t w = 0; w < after.size(); ++w) {
      if (after[w] > before[w]) {
        EXPECT_EQ(before[w], least) << "step " << step;
      }
    }
  }
  for (Fake* fake : {a.get(), b.get(), c.get()}) fake->service.Release();
}

v1::GenerateRequest Prompt(int length, int32_t first) {
  v1::GenerateRequest request;
  for (int i = 0; i < length; ++i) request.add_prompt_token_ids(first + i);
  return request;
}

// Which worker has one more call in flight than before.
int Grown(const std::vector<int>& before, const std::vector<int>& after) {
  for (size_t w = 0; w < after.size(); ++w) {
    if (after[w] > before[w]) return static_cast<int>(w);
  }
  return -1;
}

TEST(WorkerPoolTest, AConversationsNextTurnGoesToTheWorkerHoldingItsPrefix) {
  std::unique_ptr<Fake> a = StartFake(), b = StartFake(), c = StartFake();
  ASSERT_TRUE(a && b && c);
  WorkerPool pool({a->address, b->address, c->address});
  const int64_t block = WorkerPool::kAffinityBlockTokens;
  std::vector<std::unique_ptr<GenerateCall>> calls;
  auto start = [&](const v1::GenerateRequest& request) {
    const std::vector<int> before = pool.Loads();
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(request);
    EXPECT_TRUE(call.ok()) << call.status();
    if (call.ok()) calls.push_back(*std::move(call));
    return Grown(before, pool.Loads());
  };
  // Three conversations land on three workers (least loaded), each holding its call.
  std::vector<int> home;
  for (int c = 0; c < 3; ++c) home.push_back(start(Prompt(2 * block + 5, 1000 * c)));
  std::vector<int> sorted = home;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted, (std::vector<int>{0, 1, 2}));
  // Each one's next turn (the same first blocks and more) goes to its own worker, loads equal.
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(start(Prompt(3 * block + 9, 1000 * c)), home[c]) << "conversation " << c;
  }
  // Conversation 0's turns stay on its worker while it is at most kAffinitySlack busier than the
  // least loaded, then go by load.
  for (;;) {
    const std::vector<int> before = pool.Loads();
    const int least = *std::min_element(before.begin(), before.end());
    const int went = start(Prompt(4 * block, 0));
    if (before[home[0]] <= least + WorkerPool::kAffinitySlack) {
      ASSERT_EQ(went, home[0]) << "loads " << before[0] << " " << before[1] << " " << before[2];
      continue;
    }
    EXPECT_EQ(before[went], least);
    break;
  }
  // A prompt sharing no whole block goes by load alone: to a worker with the fewest calls.
  const std::vector<int> before = pool.Loads();
  const int least = *std::min_element(before.begin(), before.end());
  EXPECT_EQ(before[start(Prompt(block - 1, 0))], least);
  for (Fake* fake : {a.get(), b.get(), c.get()}) fake->service.Release();
}

TEST(WorkerPoolTest, AnUnreachableWorkerIsSkippedAndHealthSaysWhetherAnyCanServe) {
  std::unique_ptr<Fake> a = StartFake(), b = StartFake();
  ASSERT_TRUE(a && b);
  WorkerPool pool({a->address, b->address});
  // Neither is ready yet: /healthz must not say OK.
  EXPECT_FALSE(pool.Ping(absl::Seconds(2)).ok());
  b->server->SetServing("k3serve.v1.K3Serve", true);
  EXPECT_TRUE(pool.Ping(absl::Seconds(2)).ok());
  a->server->Shutdown(absl::ZeroDuration());
  a->server.reset();
  std::vector<std::unique_ptr<GenerateCall>> calls;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
    ASSERT_TRUE(call.ok()) << call.status();  // never the dead worker's UNAVAILABLE
    calls.push_back(*std::move(call));
  }
  EXPECT_EQ(pool.Loads(), (std::vector<int>{0, 4}));
  b->server->SetServing("k3serve.v1.K3Serve", false);
  const absl::Status health = pool.Ping(absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(health)) << health;
  b->service.Release();
  calls.clear();
  b->server->Shutdown(absl::ZeroDuration());
  // With none up, a new call waits for one (resume timeout), then says so in the project's words.
  pool.set_resume_timeout(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  const absl::Status none = pool.Start(Request()).status();
  EXPECT_TRUE(absl::IsUnavailable(none)) << none;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_TRUE(absl::StrContains(none.message(), "unreachable or not serving")) << none;
  EXPECT_FALSE(absl::StrContains(none.message(), "failed to connect")) << none;
}

// A fake worker that is draining: every Generate gets UNAVAILABLE before any message.
class DrainingWorker final : public v1::K3Serve::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateResponse>*) override {
    calls.fetch_add(1);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining");
  }
  std::atomic<int> calls{0};
};

// What a test's resolver answers, changed while the pool runs.
class FakeDns {
 public:
  void Set(std::vector<std::string> addresses) {
    absl::MutexLock lock(&mu_);
    addresses_ = std::move(addresses);
  }
  WorkerPoolResolver Resolver() {
    WorkerPoolResolver resolver;
    resolver.interval = absl::Milliseconds(50);
    resolver.resolve = [this](const std::string& host,
                              int port) -> absl::StatusOr<std::vector<std::string>> {
      absl::MutexLock lock(&mu_);
      asked_ = absl::StrCat(host, ":", port);
      return addresses_;
    };
    return resolver;
  }
  std::string asked() {
    absl::MutexLock lock(&mu_);
    return asked_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> addresses_;
  std::string asked_;
};

// Waits up to 5 s for the pool's addresses to be `expected`.
bool AddressesBecome(const WorkerPool& pool, const std::vector<std::string>& expected) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (pool.Addresses() != expected) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

TEST(WorkerPoolTest, ADnsNameIsOneWorkerPerAddressAndIsResolvedAgain) {
  std::unique_ptr<Fake> a = StartFake(), b = StartFake(), c = StartFake();
  ASSERT_TRUE(a && b && c);
  FakeDns dns;
  dns.Set({a->address, b->address});
  WorkerPool pool({"dns:///k3serve-attention-pods.k3serve.svc:50051"}, ClientTls(), "",
                  dns.Resolver());
  EXPECT_EQ(dns.asked(), "k3serve-attention-pods.k3serve.svc:50051");
  ASSERT_EQ(pool.Addresses(), (std::vector<std::string>{a->address, b->address}));
  // Balanced per pod, not per name.
  std::vector<std::unique_ptr<GenerateCall>> calls;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
    ASSERT_TRUE(call.ok()) << call.status();
    calls.push_back(*std::move(call));
  }
  EXPECT_EQ(pool.Loads(), (std::vector<int>{2, 2}));
  // A scale-up and a pod leaving: c is seen within a few intervals, a gets no new call (its calls
  // in flight go on) and keeps its index.
  dns.Set({b->address, c->address});
  ASSERT_TRUE(AddressesBecome(pool, {"", b->address, c->address}));
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
    ASSERT_TRUE(call.ok()) << call.status();
    EXPECT_NE(call->get()->worker(), 0);
    calls.push_back(*std::move(call));
  }
  EXPECT_EQ(pool.Loads(), (std::vector<int>{2, 3, 3}));
  EXPECT_NE(pool.LeastLoaded(), 0);  // never a pod that is gone
  // A resolver failure or an empty answer keeps the workers (a DNS hiccup must not empty them).
  dns.Set({});
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(pool.Addresses(), (std::vector<std::string>{"", b->address, c->address}));
  // a comes back under its old index.
  dns.Set({a->address, b->address, c->address});
  ASSERT_TRUE(AddressesBecome(pool, {a->address, b->address, c->address}));
  for (Fake* fake : {a.get(), b.get(), c.get()}) fake->service.Release();
}

TEST(WorkerPoolTest, ADrainingPodsUnavailableSendsTheCallToAnotherPod) {
  DrainingWorker draining;
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {&draining});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string draining_address = absl::StrCat("127.0.0.1:", (*server)->port());
  std::unique_ptr<Fake> live = StartFake();
  ASSERT_TRUE(live);
  FakeDns dns;
  dns.Set({draining_address, live->address});
  WorkerPool pool({"dns:///pods:50051"}, ClientTls(), "", dns.Resolver());
  std::vector<std::unique_ptr<GenerateCall>> calls;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
    ASSERT_TRUE(call.ok()) << call.status();  // never the draining pod's UNAVAILABLE
    EXPECT_EQ(call->get()->worker(), 1);
    calls.push_back(*std::move(call));
  }
  // It was asked (the first call's turn could not know it drains) and then skipped as down.
  EXPECT_GE(draining.calls.load(), 1);
  EXPECT_LE(draining.calls.load(), 2);
  EXPECT_EQ(pool.Loads(), (std::vector<int>{0, 4}));
  live->service.Release();
}

// A fake worker that continues any prompt with last prompt token + 1, + 2, ... (a deterministic
// "greedy" model), one chunk per token, and that dies (once, on `die_after` tokens) mid-stream:
// it signals `dying` and holds the stream until its server is shut down.
class CountingWorker final : public v1::K3Serve::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    requests.fetch_add(1);
    const int prompt = request->prompt_token_ids_size();
    const int32_t last = request->prompt_token_ids(prompt - 1);
    const int n = request->sampling().max_new_tokens();
    for (int i = 0; i < n; ++i) {
      if (i == die_after.load() && !dying.HasBeenNotified()) {
        dying.Notify();
        while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "socket closed");
      }
      v1::GenerateResponse response;
      response.set_request_id(request->request_id());
      v1::TokenChunk& chunk = *response.mutable_chunk();
      chunk.add_token_ids(last + 1 + i);
      chunk.set_prompt_tokens(prompt);
      chunk.set_generated_tokens(i + 1);
      if (!writer->Write(response)) return grpc::Status::CANCELLED;
    }
    v1::GenerateResponse done;
    done.set_request_id(request->request_id());
    done.mutable_complete()->set_finish_reason(v1::Complete::LENGTH);
    done.mutable_complete()->mutable_usage()->set_prompt_tokens(prompt);
    done.mutable_complete()->mutable_usage()->set_generated_tokens(n);
    writer->Write(done);
    return grpc::Status::OK;
  }

  std::atomic<int> die_after{1 << 30};
  std::atomic<int> requests{0};
  absl::Notification dying;
};

std::unique_ptr<GrpcServer> StartServer(grpc::Service* service) {
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {service});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// A stream whose worker dies mid-way goes on, on the other worker, as prompt + tokens sent: the
// client sees every token once, in order, with the original stream's counts.
TEST(WorkerPoolTest, AStreamWhoseWorkerDiesIsResumedOnAnotherWorker) {
  constexpr int kPrompt = 5, kTokens = 12, kDieAfter = 4;
  CountingWorker services[2];
  std::unique_ptr<GrpcServer> servers[2];
  std::vector<std::string> addresses;
  for (int w = 0; w < 2; ++w) {
    services[w].die_after = kDieAfter;
    servers[w] = StartServer(&services[w]);
    ASSERT_NE(servers[w], nullptr);
    addresses.push_back(absl::StrCat("127.0.0.1:", servers[w]->port()));
  }
  WorkerPool pool(addresses);
  v1::GenerateRequest request = Prompt(kPrompt, 100);
  request.set_request_id("r1");
  request.mutable_sampling()->set_max_new_tokens(kTokens);
  absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(request);
  ASSERT_TRUE(call.ok()) << call.status();
  const int first = (*call)->worker();
  services[1 - first].die_after = 1 << 30;  // the other one serves the rest
  std::thread kill([&] {
    services[first].dying.WaitForNotification();
    servers[first]->Shutdown(absl::ZeroDuration());
  });
  std::vector<int32_t> tokens;
  v1::GenerateResponse response;
  bool complete = false;
  while ((*call)->Next(&response)) {
    if (response.has_chunk()) {
      tokens.insert(tokens.end(), response.chunk().token_ids().begin(),
                    response.chunk().token_ids().end());
      EXPECT_EQ(response.chunk().prompt_tokens(), kPrompt);
      EXPECT_EQ(response.chunk().generated_tokens(), static_cast<int>(tokens.size()));
    } else if (response.has_complete()) {
      complete = true;
      EXPECT_EQ(response.complete().finish_reason(), v1::Complete::LENGTH);
      EXPECT_EQ(response.complete().usage().prompt_tokens(), kPrompt);
      EXPECT_EQ(response.complete().usage().generated_tokens(), kTokens);
    }
  }
  kill.join();
  const absl::Status status = (*call)->Finish();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(complete);
  std::vector<int32_t> want;  // the prompt is 100..104
  for (int i = 0; i < kTokens; ++i) want.push_back(100 + kPrompt + i);
  EXPECT_EQ(tokens, want);
  EXPECT_EQ((*call)->resumes(), 1);
  EXPECT_EQ((*call)->worker(), 1 - first);
  EXPECT_EQ(services[1 - first].requests.load(), 1);
}

// A constrained request is not resumed (its grammar state was the worker's): the stream fails,
// saying why in the project's words.
TEST(WorkerPoolTest, AConstrainedStreamWhoseWorkerDiesFailsSayingWhy) {
  CountingWorker service;
  service.die_after = 2;
  std::unique_ptr<GrpcServer> server = StartServer(&service);
  ASSERT_NE(server, nullptr);
  WorkerPool pool({absl::StrCat("127.0.0.1:", server->port())});
  v1::GenerateRequest request = Prompt(3, 10);
  request.mutable_sampling()->set_max_new_tokens(8);
  request.mutable_sampling()->mutable_constraint()->add_alternatives()->add_pieces()->set_token_id(
      7);
  absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(request);
  ASSERT_TRUE(call.ok()) << call.status();
  std::thread kill([&] {
    service.dying.WaitForNotification();
    server->Shutdown(absl::ZeroDuration());
  });
  v1::GenerateResponse response;
  int chunks = 0;
  while ((*call)->Next(&response)) chunks += response.has_chunk();
  kill.join();
  EXPECT_EQ(chunks, 2);
  const absl::Status status = (*call)->Finish();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "output constraint cannot be resumed")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "after 2 tokens")) << status;
  EXPECT_EQ(service.requests.load(), 1);
}

TEST(WorkerPoolTest, ANameThatResolvesToNothingYetIsUnavailableUntilItDoes) {
  std::unique_ptr<Fake> a = StartFake();
  ASSERT_TRUE(a);
  FakeDns dns;
  WorkerPool pool({"dns:///pods:50051"}, ClientTls(), "", dns.Resolver());
  pool.set_resume_timeout(absl::Milliseconds(300));
  absl::StatusOr<std::unique_ptr<GenerateCall>> call = pool.Start(Request());
  ASSERT_TRUE(absl::IsUnavailable(call.status())) << call.status();
  EXPECT_NE(call.status().message().find("dns:///pods:50051"), std::string::npos);
  EXPECT_EQ(pool.LeastLoaded(), -1);
  dns.Set({a->address});
  ASSERT_TRUE(AddressesBecome(pool, {a->address}));
  call = pool.Start(Request());
  EXPECT_TRUE(call.ok()) << call.status();
  a->service.Release();
}

TEST(WorkerPoolTest, TheSystemResolverFindsLocalhost) {
  absl::StatusOr<std::vector<std::string>> found = ResolveHost("localhost", 50051);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_NE(std::find(found->begin(), found->end(), "127.0.0.1:50051"), found->end());
  EXPECT_FALSE(ResolveHost("no-such-host.invalid", 1).ok());
}

}  // namespace
}  // namespace k3
