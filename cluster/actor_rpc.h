// RunOnActor: a unary RPC of gRPC's callback API carried out on an actor.
//
// The handler posts the work to the actor and returns at once; the actor runs it and finishes the
// call with its status. So no gRPC thread waits on an actor (a synchronous handler would hold one
// of gRPC's threads in Actor::Call while the actor sits in a long closure), and what the work
// touches is the actor's state, needing no lock.
//
// The request and response that `fn` captures stay valid until the call is finished, which is
// after fn returns. If the actor has begun stopping, the call ends UNAVAILABLE without running fn.
// A client that gives up (deadline, cancel) does not stop fn: it runs when its turn comes, as an
// Actor::Call whose deadline passed does.
//
// Thread-safety: call from a gRPC handler (any thread).
#ifndef K3SERVE_CLUSTER_ACTOR_RPC_H_
#define K3SERVE_CLUSTER_ACTOR_RPC_H_

#include <functional>

#include "absl/status/status.h"
#include "cluster/actor.h"
#include "grpcpp/grpcpp.h"

namespace k3 {

grpc::ServerUnaryReactor* RunOnActor(Actor& actor, grpc::CallbackServerContext* context,
                                     std::function<absl::Status()> fn);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_ACTOR_RPC_H_
