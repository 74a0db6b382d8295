#include "cluster/actor_rpc.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"

namespace k3 {

grpc::ServerUnaryReactor* RunOnActor(Actor& actor, grpc::CallbackServerContext* context,
                                     std::function<absl::Status()> fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool posted =
      actor.Post([reactor, fn = std::move(fn)] { reactor->Finish(ToGrpcStatus(fn())); });
  if (!posted) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 absl::StrCat("actor ", actor.name(), " is stopping")));
  }
  return reactor;
}

}  // namespace k3
