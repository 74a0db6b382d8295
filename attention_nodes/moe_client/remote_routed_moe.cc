#include "attention_nodes/moe_client/remote_routed_moe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "kernels/thread_pool.h"
#include "moe/moe_wire.h"

namespace k3 {
namespace {

// Process-wide, so that two RemoteRoutedMoe objects (or a restarted one) never reuse an id a
// router might still answer.
// How often a waiting Wait looks whether its router is still listed (or one is listed again).
constexpr absl::Duration kRecheck = absl::Milliseconds(50);
// The back-off before sending a layer again to a router that answered it with a passing error.
constexpr absl::Duration kFirstBackOff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackOff = absl::Seconds(1);

// Router answers worth sending the rows again for: the cluster may heal within the layer's
// timeout (an expert worker restarted, a router connected).
bool Passing(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) ||
         absl::IsDeadlineExceeded(status);
}

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
      options_(std::move(options)),
      step_deadline_(options_.retry_floor, options_.retry_p99_factor) {}

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

bool RemoteRoutedMoe::HasLiveAttempt(const InFlight& layer) {
  return std::any_of(layer.attempts.begin(), layer.attempts.end(),
                     [](const Attempt& a) { return !a.orphaned; });
}

bool RemoteRoutedMoe::Usable(PeerId router) const {
  absl::MutexLock lock(&mu_);
  return std::find(routers_.begin(), routers_.end(), router) != routers_.end();
}

absl::Status RemoteRoutedMoe::Begin(int layer, const float* x, int64_t tokens) {
  if (in_flight_.size() >= kConcurrency) {
    return absl::FailedPreconditionError(
        absl::StrCat("Begin with ", in_flight_.size(), " layers in flight"));
  }
  if (tokens <= 0) return absl::InvalidArgumentError("a MoE layer step needs at least one row");
  InFlight& begun = in_flight_.emplace_back();
  begun.layer = layer;
  begun.x = x;
  begun.tokens = tokens;
  const absl::Time now = absl::Now();
  begun.deadline = now + options_.timeout;
  begun.retry_at = now + step_deadline_.deadline();
  if (absl::Status s = SendToNextRouter(begun); !s.ok()) {
    // No router now: Wait sends the rows once one is listed (or fails at the deadline).
    LOG_EVERY_N(WARNING, 100) << "MoE layer " << layer << " waits for a router (every 100th "
                              << "logged): " << s.message();
    begun.last_error = std::move(s);
    begun.resend_at = now + kRecheck;
  }
  return absl::OkStatus();
}

absl::Status RemoteRoutedMoe::SendToNextRouter(InFlight& layer) {
  MoeRequest request;  // the fields; the rows go straight from x into each message
  request.layer = layer.layer;
  request.tokens = layer.tokens;
  request.width = hidden_size_;
  request.traces = traces_;
  absl::Status last_error = absl::UnavailableError(
      layer.tried.empty() ? "no router is connected"
                          : absl::StrCat("no other router is usable (tried: router ",
                                         absl::StrJoin(layer.tried, ", router "), ")"));
  while (true) {
    // Round-robin from next_router_, over routers without a live attempt of this layer: the
    // first untried router that is not suspect, else an untried one, else a tried one that is not
    // suspect, else any.
    PeerId router = 0;
    bool found = false;
    {
      absl::MutexLock lock(&mu_);
      const size_t n = routers_.size();
      for (int pass = 0; pass < 4 && !found; ++pass) {
        for (size_t i = 0; i < n; ++i) {
          const PeerId candidate = routers_[(next_router_ + i) % n];
          if (std::any_of(layer.attempts.begin(), layer.attempts.end(), [&](const Attempt& a) {
                return a.router == candidate && !a.orphaned;
              })) {
            continue;
          }
          const bool tried =
              std::find(layer.tried.begin(), layer.tried.end(), candidate) != layer.tried.end();
          if (tried != (pass >= 2)) continue;
          if (pass % 2 == 0 && suspects_.count(candidate) > 0) continue;
          router = candidate;
          next_router_ += i + 1;
          found = true;
          break;
        }
      }
    }
    if (!found) break;
    request.step_id = NextStepId();
    std::string message;
    std::memcpy(EncodeLeavingRows(request, &message), layer.x,
                sizeof(float) * layer.tokens * hidden_size_);
    absl::Status sent = transport_->Send(router, std::move(message));
    if (sent.ok()) {
      layer.attempts.push_back(Attempt{request.step_id, router, absl::Now(), false});
      layer.tried.push_back(router);
      layer.last_superseded = false;
      return absl::OkStatus();
    }
    LOG(WARNING) << "MoE layer " << layer.layer << ": router " << router
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

void RemoteRoutedMoe::MaybeRetry(InFlight& layer, absl::Time now) {
  // Attempts whose router is no longer listed stop counting as live (their answers still count).
  bool orphaned_now = false;
  for (Attempt& attempt : layer.attempts) {
    if (!attempt.orphaned && !Usable(attempt.router)) {
      attempt.orphaned = true;
      orphaned_now = true;
    }
  }
  if (!HasLiveAttempt(layer)) {
    // Gone, failed or answered with an error: send the rows again as soon as a router takes
    // them (after the back-off of an error answer).
    if (now < layer.resend_at) return;
    const absl::Status sent = SendToNextRouter(layer);
    if (!sent.ok()) {
      layer.resend_at = now + kRecheck;  // look again when the owner may list a router
      if (layer.last_error.ok()) layer.last_error = sent;
      return;
    }
    retries_.fetch_add(1, std::memory_order_relaxed);
    layer.retry_at = now + step_deadline_.deadline();
    LOG_EVERY_N(WARNING, 20) << "MoE layer " << layer.layer << " (" << layer.tokens
                             << " rows) sent again, to router " << layer.tried.back()
                             << " (every 20th logged)"
                             << (orphaned_now ? ": its router is no longer usable" : "");
    return;
  }
  if (layer.last_superseded || now < layer.retry_at) return;
  // The last attempt is late: another router may answer sooner.
  const PeerId last = layer.attempts.back().router;
  layer.last_superseded = true;
  const bool newly_suspect = suspects_.insert(last).second;
  layer.retry_at = now + step_deadline_.deadline();
  // With nobody else to ask now, keep waiting for what is in flight.
  if (!SendToNextRouter(layer).ok()) return;
  retries_.fetch_add(1, std::memory_order_relaxed);
  if (newly_suspect) {
    LOG(WARNING) << "router " << last << " did not answer MoE layer " << layer.layer << " ("
                 << layer.tokens << " rows) within the step deadline of "
                 << absl::FormatDuration(step_deadline_.deadline()) << "; sending it to router "
                 << layer.tried.back() << " and no new layers to router " << last
                 << " until it answers";
  }
}

void RemoteRoutedMoe::Settle(InFlight& layer, absl::Status result) {
  layer.done = true;
  layer.result = std::move(result);
  layer.attempts.clear();
}

absl::Status RemoteRoutedMoe::Wait(float* out) {
  if (in_flight_.empty()) return absl::FailedPreconditionError("Wait without Begin");
  RestKernelThreads();  // nothing to compute until the router answers
  AwaitOldest();
  InFlight oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (!oldest.result.ok()) {
    in_flight_.clear();  // the step fails: nobody waits for the others
    return oldest.result;
  }
  std::memcpy(out, oldest.answer.data() + oldest.rows_offset,
              sizeof(float) * oldest.tokens * expert_width_);
  return absl::OkStatus();
}

void RemoteRoutedMoe::AwaitOldest() {
  InFlight& oldest = in_flight_.front();
  while (!oldest.done) {
    const absl::Time now = absl::Now();
    if (now >= oldest.deadline) {
      const std::string within = absl::StrCat(" within ", absl::FormatDuration(options_.timeout),
                                              " (--moe-timeout-ms)");
      if (!oldest.last_error.ok()) {
        Settle(oldest, absl::Status(oldest.last_error.code(),
                                    absl::StrCat(oldest.last_error.message(), "; MoE layer ",
                                                 oldest.layer, " got no answer", within)));
      } else {
        Settle(oldest, absl::DeadlineExceededError(absl::StrCat(
                           "router ", absl::StrJoin(oldest.tried, ", router "),
                           " did not answer MoE layer ", oldest.layer, " (", oldest.tokens,
                           " rows)", within)));
      }
      return;
    }
    // Wakes at least every kRecheck to notice a router the owner no longer (or again) lists.
    absl::Time wake = std::min(oldest.deadline, now + kRecheck);
    for (InFlight& layer : in_flight_) {
      if (layer.done) continue;
      MaybeRetry(layer, now);
      wake = std::min(wake, HasLiveAttempt(layer) ? layer.retry_at : layer.resend_at);
    }
    absl::StatusOr<Received> received = transport_->Receive(wake);
    if (received.ok()) {
      Deliver(*std::move(received));
    } else if (absl::IsCancelled(received.status())) {
      Settle(oldest, absl::UnavailableError("the data-plane transport is closed"));
    } else if (!absl::IsDeadlineExceeded(received.status())) {
      Settle(oldest, received.status());
    }
  }
}

void RemoteRoutedMoe::OnRouterFailed(PeerId from, const absl::Status& error) {
  DropRouter(from);
  if (options_.on_router_failed) options_.on_router_failed(from, error);
  for (InFlight& layer : in_flight_) {
    if (layer.done) continue;
    const size_t before = layer.attempts.size();
    layer.attempts.erase(std::remove_if(layer.attempts.begin(), layer.attempts.end(),
                                        [from](const Attempt& a) { return a.router == from; }),
                         layer.attempts.end());
    if (layer.attempts.size() == before || HasLiveAttempt(layer)) continue;
    layer.last_error = absl::UnavailableError(absl::StrCat("router ", from, ": ", error.message()));
    LOG(WARNING) << "router " << from << " failed during MoE layer " << layer.layer
                 << ", sending the rows to another router (or the same once it is back): "
                 << error;
    layer.resend_at = absl::Now();
    MaybeRetry(layer, layer.resend_at);
  }
}

void RemoteRoutedMoe::OnErrorAnswer(InFlight& layer, PeerId from, const absl::Status& status) {
  layer.last_error =
      absl::Status(status.code(), absl::StrCat("router ", from, ": ", status.message()));
  if (!Passing(status)) {
    Settle(layer, layer.last_error);
    return;
  }
  // Another attempt may still answer.
  if (HasLiveAttempt(layer)) return;
  // Another router may serve it now; the same one after a back-off (the cluster heals: an expert
  // worker restarts and takes its experts again, a router connects).
  const bool untried = [&] {
    absl::MutexLock lock(&mu_);
    return std::any_of(routers_.begin(), routers_.end(), [&](PeerId r) {
      return std::find(layer.tried.begin(), layer.tried.end(), r) == layer.tried.end();
    });
  }();
  const absl::Duration back_off =
      untried ? absl::ZeroDuration()
              : std::min(kMaxBackOff, kFirstBackOff * (1 << std::min(layer.error_answers, 4)));
  if (layer.error_answers++ == 0) {  // once per layer: a lost node fails every layer's try
    LOG(WARNING) << "router " << from << " cannot serve MoE layer " << layer.layer
                 << " now: " << status.message() << "; sending it again until it can, for up to "
                 << absl::FormatDuration(layer.deadline - absl::Now());
  }
  layer.resend_at = absl::Now() + back_off;
  if (untried) MaybeRetry(layer, layer.resend_at);
}

void RemoteRoutedMoe::Deliver(Received received) {
  const PeerId from = received.from;
  if (received.kind == Received::Kind::kPeerFailed) {
    OnRouterFailed(received.from, received.error);
    return;
  }
  if (suspects_.erase(from) > 0) {
    LOG(INFO) << "router " << from << " answers again; new MoE layers may go to it";
  }
  absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received.bytes);
  if (kind.ok() && *kind == MoeMessageKind::kDeviceExpertResponse) {
    ++stale_answers_;  // a late answer of a device layer that failed (RemoteDeviceExperts)
    return;
  }
  if (!kind.ok() || *kind != MoeMessageKind::kMoeResponse) {
    LOG(WARNING) << "dropping a data-plane message from peer " << from
                 << " that is not a MoeResponse";
    return;
  }
  MoeResponse response;
  absl::Span<const float> rows;
  if (absl::Status s = DecodeInPlace(received.bytes, &response, &rows); !s.ok()) {
    LOG(WARNING) << "dropping a malformed MoeResponse from peer " << from << ": " << s;
    return;
  }
  InFlight* layer = nullptr;
  std::vector<Attempt>::iterator attempt;
  for (InFlight& candidate : in_flight_) {
    attempt = std::find_if(candidate.attempts.begin(), candidate.attempts.end(),
                           [&](const Attempt& a) { return a.step_id == response.step_id; });
    if (attempt != candidate.attempts.end()) {
      layer = &candidate;
      break;
    }
  }
  if (layer == nullptr) {
    ++stale_answers_;
    return;
  }
  const absl::Time sent = attempt->sent;
  if (!response.status.ok()) {
    layer->attempts.erase(attempt);
    OnErrorAnswer(*layer, from, response.status);
    return;
  }
  if (response.tokens != layer->tokens || response.width != expert_width_ ||
      rows.size() != static_cast<size_t>(layer->tokens * expert_width_)) {
    Settle(*layer, absl::InternalError(absl::StrCat(
                       "router ", from, " answered MoE layer ", layer->layer, " with ",
                       response.tokens, " x ", response.width, " rows; expected ", layer->tokens,
                       " x ", expert_width_)));
    return;
  }
  step_deadline_.Record(absl::Now() - sent);
  layer->rows_offset = static_cast<size_t>(reinterpret_cast<const char*>(rows.data()) -
                                           received.bytes.data());
  layer->answer = std::move(received.bytes);
  Settle(*layer, absl::OkStatus());
}

}  // namespace k3
