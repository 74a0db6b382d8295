#include "attention_nodes/server/generate_client.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/generate.grpc.pb.h"

namespace k3 {

namespace v1 = k3serve::v1;

v1::GenerateRequest GreedyRequest(const std::string& request_id, const std::vector<int32_t>& prompt,
                                  int max_new_tokens) {
  v1::GenerateRequest request;
  request.set_request_id(request_id);
  request.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  return request;
}

absl::StatusOr<GenerateOutcome> GenerateOverGrpc(
    const std::string& address, const v1::GenerateRequest& request, absl::Duration timeout,
    const std::function<void(absl::Span<const int32_t>)>& on_tokens) {
  return GenerateOverGrpc(GenerateClientOptions(), address, request, timeout, on_tokens);
}

absl::StatusOr<GenerateOutcome> GenerateOverGrpc(
    const GenerateClientOptions& client, const std::string& address,
    const v1::GenerateRequest& request, absl::Duration timeout,
    const std::function<void(absl::Span<const int32_t>)>& on_tokens) {
  std::unique_ptr<v1::K3Serve::Stub> stub = v1::K3Serve::NewStub(client.tls.Connect(address));
  grpc::ClientContext context;
  AddBearer(client.auth_token, &context);
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  GenerateOutcome outcome;
  bool complete = false;
  bool extra = false;  // messages after the Complete
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (complete) {
      extra = true;
      continue;
    }
    if (!response.request_id().empty()) outcome.request_id = response.request_id();
    if (response.has_chunk()) {
      outcome.tokens.insert(outcome.tokens.end(), response.chunk().token_ids().begin(),
                            response.chunk().token_ids().end());
      if (on_tokens) on_tokens(response.chunk().token_ids());
      outcome.text += response.chunk().text();
      outcome.logprobs.insert(outcome.logprobs.end(), response.chunk().logprobs().begin(),
                              response.chunk().logprobs().end());
    } else if (response.has_complete()) {
      outcome.complete = response.complete();
      outcome.text += response.complete().text();
      complete = true;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (!complete || extra) {
    return absl::InternalError(absl::StrCat(
        "the Generate stream from ", address,
        complete ? " went on after its Complete message" : " ended without a Complete message"));
  }
  return outcome;
}

}  // namespace k3
