// K3ServeProxy served by a real gRPC server in this process, over fake attention workers (real gRPC
// servers too) that say what they were asked: the client sees each worker's stream as the worker
// sent it, cancellation and Abort reach the worker that serves the request and no other, a text
// prompt's next turn goes to the worker that served the first, and the bearer token is checked.
#include "http_front/grpc_proxy.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/grpc_server.h"
#include "cluster/security.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tokenizer/random_tokenizer.h"

namespace k3 {
namespace {

namespace v1 = k3serve::v1;

// A worker whose Generate sends `messages` chunks (token ids 100 * worker + i), or, for a
// request whose sampling.max_new_tokens is 0, holds the stream until it is cancelled.
class FakeWorker final : public v1::K3Serve::Service {
 public:
  explicit FakeWorker(int id) : id_(id) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      served_.push_back(request->request_id());
    }
    if (request->sampling().max_new_tokens() == 0) {
      v1::GenerateResponse first;
      first.set_request_id(request->request_id());
      writer->Write(first);
      while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      absl::MutexLock lock(&mu_);
      cancelled_.push_back(request->request_id());
      return grpc::Status::CANCELLED;
    }
    for (int i = 0; i < 5; ++i) {
      v1::GenerateResponse response;
      if (i == 0) response.set_request_id(request->request_id());
      response.mutable_chunk()->add_token_ids(100 * id_ + i);
      if (!writer->Write(response)) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override {
    absl::MutexLock lock(&mu_);
    aborted_.push_back(request->request_id());
    response->set_found(true);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest*,
                            v1::ModelInfo* info) override {
    absl::MutexLock lock(&mu_);
    const auto& metadata = context->client_metadata();
    auto it = metadata.find(kAuthorizationMetadata);
    authorization_ = it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
    info->set_model_type(absl::StrCat("fake-", id_));
    return grpc::Status::OK;
  }

  std::vector<std::string> served() {
    absl::MutexLock lock(&mu_);
    return served_;
  }
  std::vector<std::string> cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  std::vector<std::string> aborted() {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }
  std::string authorization() {
    absl::MutexLock lock(&mu_);
    return authorization_;
  }

 private:
  const int id_;
  absl::Mutex mu_;
  std::vector<std::string> served_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> aborted_ ABSL_GUARDED_BY(mu_);
  std::string authorization_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<GrpcServer> Serve(grpc::Service* service) {
  GrpcServerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, {service});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

class GrpcProxyTest : public testing::Test {
 protected:
  void Start(const std::string& worker_token, const std::string& client_token) {
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(i));
      servers_.push_back(Serve(workers_.back().get()));
      ASSERT_NE(servers_.back(), nullptr);
      addresses_.push_back(absl::StrCat("127.0.0.1:", servers_.back()->port()));
    }
    absl::StatusOr<Tokenizer> tokenizer = RandomTokenizer(512, TokenizerFamily::kK3);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_.emplace(*std::move(tokenizer));
    pool_ = std::make_unique<WorkerPool>(addresses_, ClientTls(), worker_token);
    proxy_ = std::make_unique<K3ServeProxy>(pool_.get(), &*tokenizer_, client_token);
    front_ = Serve(proxy_.get());
    ASSERT_NE(front_, nullptr);
    stub_ = v1::K3Serve::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", front_->port()), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (front_) front_->Shutdown(absl::Seconds(1));
  }

  // The whole stream of `request` through the front: its messages and final status.
  grpc::Status Generate(const v1::GenerateRequest& request,
                        std::vector<v1::GenerateResponse>* messages,
                        const std::string& token = "") {
    grpc::ClientContext context;
    AddBearer(token, &context);
    auto reader = stub_->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) messages->push_back(response);
    return reader->Finish();
  }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::vector<std::string> addresses_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<K3ServeProxy> proxy_;
  std::unique_ptr<GrpcServer> front_;
  std::unique_ptr<v1::K3Serve::Stub> stub_;
};

v1::GenerateRequest Request(const std::string& id) {
  v1::GenerateRequest request;
  request.set_request_id(id);
  request.add_prompt_token_ids(1);
  request.mutable_sampling()->set_max_new_tokens(5);
  return request;
}

TEST_F(GrpcProxyTest, StreamsArriveAsTheWorkerSentThemAndIdsAreAssigned) {
  ASSERT_NO_FATAL_FAILURE(Start("", ""));
  std::vector<v1::GenerateResponse> messages;
  ASSERT_TRUE(Generate(Request("mine"), &messages).ok());
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[0].request_id(), "mine");
  const int worker = messages[0].chunk().token_ids(0) / 100;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(messages[i].chunk().token_ids(0), 100 * worker + i);
  EXPECT_EQ(workers_[worker]->served(), std::vector<std::string>{"mine"});

  // Without an id the front picks one of its own, unique, and the client sees it.
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    std::vector<v1::GenerateResponse> stream;
    ASSERT_TRUE(Generate(Request(""), &stream).ok());
    ASSERT_FALSE(stream.empty());
    EXPECT_EQ(stream[0].request_id().rfind("front-", 0), 0u) << stream[0].request_id();
    ids.push_back(stream[0].request_id());
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
}

TEST_F(GrpcProxyTest, CancelAndAbortReachTheServingWorkerOnly) {
  ASSERT_NO_FATAL_FAILURE(Start("", ""));
  // A held stream, cancelled by its client: the worker's call is cancelled.
  {
    v1::GenerateRequest held = Request("held");
    held.mutable_sampling()->set_max_new_tokens(0);
    grpc::ClientContext context;
    auto reader = stub_->Generate(&context, held);
    v1::GenerateResponse first;
    ASSERT_TRUE(reader->Read(&first));
    context.TryCancel();
    while (reader->Read(&first)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (workers_[0]->cancelled().size() + workers_[1]->cancelled().size() < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(workers_[0]->cancelled().size() + workers_[1]->cancelled().size(), 1u);

  // Abort of a request in flight goes to its worker alone; of an unknown one, to none.
  v1::GenerateRequest held = Request("to-abort");
  held.mutable_sampling()->set_max_new_tokens(0);
  grpc::ClientContext stream_context;
  auto reader = stub_->Generate(&stream_context, held);
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  const int worker = workers_[0]->served().back() == "to-abort" ? 0 : 1;
  ASSERT_EQ(workers_[worker]->served().back(), "to-abort");
  for (const char* id : {"to-abort", "unknown"}) {
    grpc::ClientContext context;
    v1::AbortRequest abort;
    abort.set_request_id(id);
    v1::AbortResponse response;
    ASSERT_TRUE(stub_->Abort(&context, abort, &response).ok());
    EXPECT_EQ(response.found(), std::string(id) == "to-abort") << id;
  }
  EXPECT_EQ(workers_[worker]->aborted(), std::vector<std::string>{"to-abort"});
  EXPECT_TRUE(workers_[1 - worker]->aborted().empty());
  stream_context.TryCancel();
  while (reader->Read(&first)) {
  }
  reader->Finish();
}

TEST_F(GrpcProxyTest, ShuttingTheFrontDownEndsStreamsInFlight) {
  ASSERT_NO_FATAL_FAILURE(Start("", ""));
  v1::GenerateRequest held = Request("held");
  held.mutable_sampling()->set_max_new_tokens(0);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, held);
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  const absl::Time start = absl::Now();
  front_->Shutdown(absl::Milliseconds(100));
  while (reader->Read(&first)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The worker's call was cancelled with it: nothing is left running there.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (workers_[0]->cancelled().size() + workers_[1]->cancelled().size() < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(workers_[0]->cancelled().size() + workers_[1]->cancelled().size(), 1u);
}

TEST_F(GrpcProxyTest, ATextConversationsNextTurnGoesToTheWorkerThatServedItsPrefix) {
  ASSERT_NO_FATAL_FAILURE(Start("", ""));
  // Ten conversations, each long enough for two whole prefix blocks: first turns one after
  // another (nothing in flight, so they alternate between the workers), then second turns that
  // extend them.
  std::vector<std::string> texts;
  std::vector<int> first_worker;
  for (int conversation = 0; conversation < 10; ++conversation) {
    std::string text;
    for (int i = 0; i < 300; ++i) absl::StrAppend(&text, "w", conversation, "x", i, " ");
    v1::GenerateRequest first = Request(absl::StrCat("c", conversation, "-1"));
    first.clear_prompt_token_ids();
    first.set_prompt_text(text);
    std::vector<v1::GenerateResponse> one;
    ASSERT_TRUE(Generate(first, &one).ok());
    ASSERT_FALSE(one.empty());
    texts.push_back(text);
    first_worker.push_back(one[0].chunk().token_ids(0) / 100);
  }
  EXPECT_FALSE(workers_[0]->served().empty());
  EXPECT_FALSE(workers_[1]->served().empty());
  for (int conversation = 9; conversation >= 0; --conversation) {
    v1::GenerateRequest next = Request(absl::StrCat("c", conversation, "-2"));
    next.clear_prompt_token_ids();
    next.set_prompt_text(texts[conversation] + " and then some more words");
    std::vector<v1::GenerateResponse> two;
    ASSERT_TRUE(Generate(next, &two).ok());
    ASSERT_FALSE(two.empty());
    EXPECT_EQ(two[0].chunk().token_ids(0) / 100, first_worker[conversation])
        << "conversation " << conversation;
  }
}

TEST_F(GrpcProxyTest, ClientsNeedTheFrontsTokenAndWorkersGetTheirs) {
  ASSERT_NO_FATAL_FAILURE(Start("worker-secret", "client-secret"));
  std::vector<v1::GenerateResponse> messages;
  EXPECT_EQ(Generate(Request("a"), &messages).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Generate(Request("b"), &messages, "worker-secret").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(workers_[0]->served().empty() && workers_[1]->served().empty());
  EXPECT_TRUE(Generate(Request("c"), &messages, "client-secret").ok());
  grpc::ClientContext context;
  AddBearer("client-secret", &context);
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.model_type().rfind("fake-", 0), 0u);
  const int worker = info.model_type() == "fake-0" ? 0 : 1;
  EXPECT_EQ(workers_[worker]->authorization(), "Bearer worker-secret");
  grpc::ClientContext unauthorized;
  EXPECT_EQ(stub_->GetModelInfo(&unauthorized, {}, &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace k3
