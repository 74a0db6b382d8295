// K3ServeProxy: the front's gRPC side towards clients. The front serves k3serve.v1.K3Serve on its
// --grpc-port and forwards each call to the attention workers through its WorkerPool, so gRPC
// clients get what HTTP clients get: a new stream on the least-loaded reachable worker, another
// worker when one is unreachable before answering, and a conversation's next turn on the worker
// that holds its prefix (the prefix hint is taken from the prompt's token ids, or from the text
// or messages encoded and rendered with the front's tokenizer as the worker would).
//
//   Generate       forwarded message by message (the client's flow control reaches the worker:
//                  the next message is read once the previous one is written); a client that
//                  cancels cancels the worker's call, which frees the request's state there. A
//                  request without an id gets one unique to this front ("front-<random>-<n>"),
//                  so that Abort can name it.
//   Abort          to the worker serving that id through this front; found = false when none is.
//   GetModelInfo   from the least-loaded reachable worker.
//   GetServerInfo  likewise: one worker's counters, not the sum over workers.
// Clients must send `authorization: Bearer <token>` when the front has one (its --api-key-file,
// else the workers' --auth-token-file), as on the HTTP side.
//
// Threads: each Generate call runs on a thread of its own from its start to its end (it blocks on
// the worker's stream, as the HTTP front's connection threads do); the other calls use gRPC's
// callback client and block nothing. Thread-safe.
#ifndef K3SERVE_HTTP_FRONT_GRPC_PROXY_H_
#define K3SERVE_HTTP_FRONT_GRPC_PROXY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "http_front/worker_pool.h"
#include "proto/generate.grpc.pb.h"
#include "tokenizer/tokenizer.h"

namespace k3 {

class K3ServeProxy final : public k3serve::v1::K3Serve::CallbackService {
 public:
  // `pool` and `tokenizer` (null: prompts given as text or messages get no prefix hint) are not
  // owned and must outlive the gRPC server that serves this proxy. `auth_token`: the bearer token
  // clients must send (empty: none).
  K3ServeProxy(WorkerPool* pool, const Tokenizer* tokenizer, std::string auth_token);

  grpc::ServerWriteReactor<k3serve::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const k3serve::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const k3serve::v1::AbortRequest* request,
                                  k3serve::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const k3serve::v1::GetModelInfoRequest* request,
                                         k3serve::v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const k3serve::v1::GetServerInfoRequest* request,
                                          k3serve::v1::ServerInfo* response) override;

 private:
  class ProxiedGenerate;

  using Async = k3serve::v1::K3Serve::StubInterface::async_interface;
  using Done = std::function<void(grpc::Status)>;
  using Send = std::function<void(Async*, grpc::ClientContext*, Done)>;
  // Sends a unary call to `worker` through `send` (with this front's deadline and bearer token)
  // and finishes the client's call with the worker's answer.
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context, int worker,
                                    const Send& send);
  // A call any worker answers alike (the model's and server's info): authorized, then forwarded
  // to the least loaded worker with `method`, the worker's stub method of the same name.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* ForwardToAnyWorker(
      grpc::CallbackServerContext* context, const Request* request, Response* response,
      void (Async::*method)(grpc::ClientContext*, const Request*, Response*, Done));
  // The client's call finished at once with `status`.
  static grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                            const absl::Status& status);
  // OK when the call carries the bearer token this front requires.
  absl::Status Authorize(const grpc::CallbackServerContext& context) const;
  // The prompt's token ids for the prefix hint; empty when the request has ids itself (the pool
  // reads them), or when they cannot be made (the worker will say why).
  std::vector<int32_t> AffinityPrompt(const k3serve::v1::GenerateRequest& request) const;
  std::string NewRequestId();
  // Which worker serves `request_id` through this front, while its Generate runs.
  void Track(const std::string& request_id, int worker);
  void Untrack(const std::string& request_id);

  WorkerPool* const pool_;
  const Tokenizer* const tokenizer_;
  const std::string auth_token_;
  const uint64_t id_prefix_;  // random per front, so that two fronts' ids differ

  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> serving_ ABSL_GUARDED_BY(mu_);  // request id -> worker
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_GRPC_PROXY_H_
