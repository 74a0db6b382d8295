#include "attention_nodes/remote_routed_moe.h"

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
// Round trips the step deadline is computed from, how often it is recomputed, and how many it
// waits for before the first time (until then: the floor).
constexpr size_t kRoundTripWindow = 512;
constexpr size_t kRecomputeEvery = 32;
constexpr size_t kMinRoundTrips = 32;
// How often a waiting Wait looks whether its router is still listed.
constexpr absl::Duration kRecheck = absl::Milliseconds(50);

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
      step_deadline_(options_.retry_floor) {}

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

bool RemoteRoutedMoe::Usable(PeerId router) const {
  absl::MutexLock lock(&mu_);
  return std::find(routers_.begin(), routers_.end(), router) != routers_.end();
}

void RemoteRoutedMoe::RecordRoundTrip(absl::Duration round_trip) {
  if (round_trips_.size() < kRoundTripWindow) {
    round_trips_.push_back(round_trip);
  } else {
    round_trips_[next_round_trip_ % kRoundTripWindow] = round_trip;
  }
  ++next_round_trip_;
  if (round_trips_.size() < kMinRoundTrips || next_round_trip_ % kRecomputeEvery != 0) return;
  std::vector<absl::Duration> sorted = round_trips_;
  const size_t p99 = sorted.size() * 99 / 100;
  std::nth_element(sorted.begin(), sorted.begin() + p99, sorted.end());
  step_deadline_ = std::max(options_.retry_floor, sorted[p99] * options_.retry_p99_factor);
}

absl::Status RemoteRoutedMoe::Begin(int layer, const float* x, int64_t tokens) {
  if (in_flight_) return absl::FailedPreconditionError("Begin while a layer is in flight");
  if (tokens <= 0) return absl::InvalidArgumentError("a MoE layer step needs at least one row");
  layer_ = layer;
  x_ = x;
  tokens_ = tokens;
  attempts_.clear();
  tried_.clear();
  const absl::Time now = absl::Now();
  deadline_ = now + options_.timeout;
  if (absl::Status s = SendToNextRouter(); !s.ok()) return s;
  retry_at_ = now + step_deadline_;
  in_flight_ = true;
  return absl::OkStatus();
}

absl::Status RemoteRoutedMoe::SendToNextRouter() {
  MoeRequest request;
  request.layer = layer_;
  request.tokens = tokens_;
  request.width = hidden_size_;
  request.rows.assign(x_, x_ + tokens_ * hidden_size_);
  absl::Status last_error = absl::UnavailableError(
      tried_.empty() ? "no router is connected"
                     : absl::StrCat("no other router is usable (tried: router ",
                                    absl::StrJoin(tried_, ", router "), ")"));
  while (true) {
    // Round-robin from next_router_: the first untried router that is not suspect, else the first
    // untried one.
    PeerId router = 0;
    bool found = false;
    {
      absl::MutexLock lock(&mu_);
      const size_t n = routers_.size();
      for (int pass = 0; pass < 2 && !found; ++pass) {
        for (size_t i = 0; i < n; ++i) {
          const PeerId candidate = routers_[(next_router_ + i) % n];
          if (std::find(tried_.begin(), tried_.end(), candidate) != tried_.end()) continue;
          if (pass == 0 && suspects_.count(candidate) > 0) continue;
          router = candidate;
          next_router_ += i + 1;
          found = true;
          break;
        }
      }
    }
    if (!found) break;
    request.step_id = NextStepId();
    absl::Status sent = transport_->Send(router, Encode(request));
    if (sent.ok()) {
      attempts_.push_back(Attempt{request.step_id, router, absl::Now()});
      tried_.push_back(router);
      last_superseded_ = false;
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

void RemoteRoutedMoe::MaybeRetry(absl::Time now) {
  const PeerId last = tried_.back();
  const bool gone = !last_superseded_ && !Usable(last);
  const bool late = now >= retry_at_;
  if (!gone && !late) return;
  last_superseded_ = true;
  const bool newly_suspect = late && !gone && suspects_.insert(last).second;
  if (absl::Status s = SendToNextRouter(); !s.ok()) {
    // Nobody else to ask now: keep waiting for what is in flight; look again later.
    retry_at_ = now + step_deadline_;
    return;
  }
  retries_.fetch_add(1, std::memory_order_relaxed);
  retry_at_ = now + step_deadline_;
  if (gone) {
    LOG(WARNING) << "router " << last << " is no longer usable; MoE layer " << layer_ << " ("
                 << tokens_ << " rows) goes to router " << tried_.back();
  } else if (newly_suspect) {
    LOG(WARNING) << "router " << last << " did not answer MoE layer " << layer_ << " ("
                 << tokens_ << " rows) within the step deadline of "
                 << absl::FormatDuration(step_deadline_) << "; sending it to router "
                 << tried_.back() << " and no new layers to router " << last
                 << " until it answers";
  }
}

absl::Status RemoteRoutedMoe::Wait(float* out) {
  if (!in_flight_) return absl::FailedPreconditionError("Wait without Begin");
  in_flight_ = false;
  RestKernelThreads();  // nothing to compute until the router answers
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= deadline_) {
      return absl::DeadlineExceededError(
          absl::StrCat("router ", absl::StrJoin(tried_, ", router "), " did not answer MoE layer ",
                       layer_, " (", tokens_, " rows) within ",
                       absl::FormatDuration(options_.timeout)));
    }
    MaybeRetry(now);
    // Wakes at least every kRecheck to notice a router the owner no longer lists.
    absl::StatusOr<Received> received =
        transport_->Receive(std::min({deadline_, retry_at_, now + kRecheck}));
    if (!received.ok()) {
      if (absl::IsDeadlineExceeded(received.status())) continue;
      if (absl::IsCancelled(received.status())) {
        return absl::UnavailableError("the data-plane transport is closed");
      }
      return received.status();
    }
    const PeerId from = received->from;
    if (received->kind == Received::Kind::kPeerFailed) {
      DropRouter(from);
      if (options_.on_router_failed) options_.on_router_failed(from, received->error);
      const size_t before = attempts_.size();
      attempts_.erase(std::remove_if(attempts_.begin(), attempts_.end(),
                                     [from](const Attempt& a) { return a.router == from; }),
                      attempts_.end());
      if (attempts_.size() == before || !attempts_.empty()) continue;
      LOG(WARNING) << "router " << from << " failed during MoE layer " << layer_
                   << ", sending the rows to another router: " << received->error;
      if (absl::Status s = SendToNextRouter(); !s.ok()) {
        return absl::UnavailableError(absl::StrCat(received->error.message(), "; ", s.message()));
      }
      retry_at_ = absl::Now() + step_deadline_;
      continue;
    }
    if (suspects_.erase(from) > 0) {
      LOG(INFO) << "router " << from << " answers again; new MoE layers may go to it";
    }
    absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received->bytes);
    if (!kind.ok() || *kind != MoeMessageKind::kMoeResponse) {
      LOG(WARNING) << "dropping a data-plane message from peer " << from
                   << " that is not a MoeResponse";
      continue;
    }
    MoeResponse response;
    if (absl::Status s = Decode(received->bytes, &response); !s.ok()) {
      LOG(WARNING) << "dropping a malformed MoeResponse from peer " << from << ": " << s;
      continue;
    }
    auto attempt = std::find_if(attempts_.begin(), attempts_.end(), [&](const Attempt& a) {
      return a.step_id == response.step_id;
    });
    if (attempt == attempts_.end()) {
      ++stale_answers_;
      continue;
    }
    const absl::Time sent = attempt->sent;
    if (!response.status.ok()) {
      attempts_.erase(attempt);
      // Another attempt may still answer; the error stands only when none is left.
      if (!attempts_.empty()) continue;
      if (absl::IsAborted(response.status)) {
        // The router cannot serve the layer for a reason of its own: another router may.
        LOG_EVERY_N(WARNING, 20) << "router " << from << " cannot serve MoE layer " << layer_
                                 << " (every 20th logged): " << response.status.message()
                                 << "; trying another router";
        if (SendToNextRouter().ok()) {
          retries_.fetch_add(1, std::memory_order_relaxed);
          retry_at_ = absl::Now() + step_deadline_;
          continue;
        }
      }
      return absl::Status(response.status.code(),
                          absl::StrCat("router ", from, ": ", response.status.message()));
    }
    if (response.tokens != tokens_ || response.width != expert_width_ ||
        response.rows.size() != static_cast<size_t>(tokens_ * expert_width_)) {
      return absl::InternalError(absl::StrCat(
          "router ", from, " answered MoE layer ", layer_, " with ", response.tokens,
          " x ", response.width, " rows; expected ", tokens_, " x ", expert_width_));
    }
    RecordRoundTrip(absl::Now() - sent);
    std::memcpy(out, response.rows.data(), response.rows.size() * sizeof(float));
    return absl::OkStatus();
  }
}

}  // namespace k3
