#include "attention_nodes/remote_routed_moe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "moe/moe_wire.h"

namespace k3 {
namespace {

// Process-wide, so that two RemoteRoutedMoe objects (or a restarted one) never reuse an id a
// router might still answer.
uint64_t NextStepId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

RemoteRoutedMoe::RemoteRoutedMoe(Transport* transport, const ModelConfig& config,
                                 RemoteRoutedMoeOptions options)
    : transport_(transport),
      hidden_size_(config.hidden_size),
      expert_width_(config.ExpertWidth()),
      options_(std::move(options)) {}

void RemoteRoutedMoe::SetRouters(std::vector<PeerId> routers) {
  absl::MutexLock lock(&mu_);
  routers_ = std::move(routers);
}

int RemoteRoutedMoe::usable_routers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(routers_.size());
}

void RemoteRoutedMoe::DropRouter(PeerId router) {
  absl::MutexLock lock(&mu_);
  routers_.erase(std::remove(routers_.begin(), routers_.end(), router), routers_.end());
}

absl::Status RemoteRoutedMoe::Begin(int layer, const float* x, int64_t tokens) {
  if (in_flight_) return absl::FailedPreconditionError("Begin while a layer is in flight");
  if (tokens <= 0) return absl::InvalidArgumentError("a MoE layer step needs at least one row");
  layer_ = layer;
  x_ = x;
  tokens_ = tokens;
  deadline_ = absl::Now() + options_.timeout;
  if (absl::Status s = SendToNextRouter(); !s.ok()) return s;
  in_flight_ = true;
  return absl::OkStatus();
}

absl::Status RemoteRoutedMoe::SendToNextRouter() {
  MoeRequest request;
  request.layer = layer_;
  request.tokens = tokens_;
  request.width = hidden_size_;
  request.rows.assign(x_, x_ + tokens_ * hidden_size_);
  absl::Status last_error = absl::UnavailableError("no router is connected");
  while (true) {
    PeerId router = 0;
    {
      absl::MutexLock lock(&mu_);
      if (routers_.empty()) break;
      router = routers_[next_router_++ % routers_.size()];
    }
    request.step_id = NextStepId();
    absl::Status sent = transport_->Send(router, Encode(request));
    if (sent.ok()) {
      step_id_ = request.step_id;
      router_ = router;
      return absl::OkStatus();
    }
    LOG(WARNING) << "MoE layer " << layer_ << ": router " << router
                 << " does not take requests, dropping it: " << sent;
    DropRouter(router);
    if (absl::IsUnavailable(sent) && options_.on_router_failed) {
      options_.on_router_failed(router, sent);
    }
    last_error = absl::UnavailableError(
        absl::StrCat("no router takes MoE requests; last error: router ", router, ": ",
                     sent.message()));
  }
  return last_error;
}

absl::Status RemoteRoutedMoe::Wait(float* out) {
  if (!in_flight_) return absl::FailedPreconditionError("Wait without Begin");
  in_flight_ = false;
  while (true) {
    absl::StatusOr<Received> received = transport_->Receive(deadline_);
    if (!received.ok()) {
      if (absl::IsDeadlineExceeded(received.status())) {
        return absl::DeadlineExceededError(
            absl::StrCat("router ", router_, " did not answer MoE layer ", layer_, " (", tokens_,
                         " rows) within ", absl::FormatDuration(options_.timeout)));
      }
      if (absl::IsCancelled(received.status())) {
        return absl::UnavailableError("the data-plane transport is closed");
      }
      return received.status();
    }
    if (received->kind == Received::Kind::kPeerFailed) {
      DropRouter(received->from);
      if (options_.on_router_failed) options_.on_router_failed(received->from, received->error);
      if (received->from != router_) continue;
      LOG(WARNING) << "router " << router_ << " failed during MoE layer " << layer_
                   << ", sending the rows to another router: " << received->error;
      if (absl::Status s = SendToNextRouter(); !s.ok()) {
        return absl::UnavailableError(absl::StrCat(received->error.message(), "; ", s.message()));
      }
      continue;
    }
    absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received->bytes);
    if (!kind.ok() || *kind != MoeMessageKind::kMoeResponse) {
      LOG(WARNING) << "dropping a data-plane message from peer " << received->from
                   << " that is not a MoeResponse";
      continue;
    }
    MoeResponse response;
    if (absl::Status s = Decode(received->bytes, &response); !s.ok()) {
      LOG(WARNING) << "dropping a malformed MoeResponse from peer " << received->from << ": " << s;
      continue;
    }
    if (response.step_id != step_id_) {
      ++stale_answers_;
      continue;
    }
    if (!response.status.ok()) {
      return absl::Status(response.status.code(),
                          absl::StrCat("router ", received->from, ": ", response.status.message()));
    }
    if (response.tokens != tokens_ || response.width != expert_width_ ||
        response.rows.size() != static_cast<size_t>(tokens_ * expert_width_)) {
      return absl::InternalError(absl::StrCat(
          "router ", received->from, " answered MoE layer ", layer_, " with ", response.tokens,
          " x ", response.width, " rows; expected ", tokens_, " x ", expert_width_));
    }
    std::memcpy(out, response.rows.data(), response.rows.size() * sizeof(float));
    return absl::OkStatus();
  }
}

}  // namespace k3
