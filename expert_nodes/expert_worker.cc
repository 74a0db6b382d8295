#include "expert_nodes/expert_worker.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/moe_layer_map.h"

namespace k3 {

std::vector<int> ExpertHosting::Union() const {
  std::set<int> all;
  for (const std::vector<int>& layer : experts) all.insert(layer.begin(), layer.end());
  return std::vector<int>(all.begin(), all.end());
}

int64_t ExpertHosting::TotalExperts() const {
  int64_t total = 0;
  for (const std::vector<int>& layer : experts) total += static_cast<int64_t>(layer.size());
  return total;
}

ExpertHosting HostingFor(const ClusterPlacement& placement, uint32_t node) {
  ExpertHosting hosting;
  hosting.placement_version = placement.version();
  for (size_t w = 0; w < placement.worker_nodes.size(); ++w) {
    if (placement.worker_nodes[w] == node) hosting.worker = static_cast<int>(w);
  }
  if (hosting.worker < 0) return hosting;
  for (int layer = 0; layer < placement.experts.num_layers(); ++layer) {
    hosting.experts.push_back(placement.experts.ExpertsOn(hosting.worker, layer));
  }
  return hosting;
}

ExpertWorker::ExpertWorker(std::shared_ptr<const ModelWeights> weights, ExpertHosting hosting,
                           std::string name)
    : weights_(std::move(weights)), hosting_(std::move(hosting)), name_(std::move(name)) {
  if (weights_ == nullptr) return;
  glu_ = GluParamsFor(weights_->config);
  hosted_.resize(hosting_.experts.size());
  for (size_t layer = 0; layer < hosting_.experts.size(); ++layer) {
    hosted_[layer].assign(weights_->config.num_experts, false);
    for (int e : hosting_.experts[layer]) hosted_[layer][e] = true;
  }
}

absl::Status ExpertWorker::Check(const ExpertRequest& request) const {
  if (weights_ == nullptr || hosting_.worker < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " hosts no experts (placement version ", hosting_.placement_version,
                     " gives it no worker slot)"));
  }
  const ModelConfig& config = weights_->config;
  absl::StatusOr<int> moe_layer = MoeLayerIndex(config, request.layer);
  if (!moe_layer.ok()) return moe_layer.status();
  if (*moe_layer >= static_cast<int>(hosted_.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, " has no placement for MoE layer ", *moe_layer, " (model layer ", request.layer,
        ")"));
  }
  if (request.width != config.ExpertWidth()) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertRequest rows have width ", request.width,
                                                   "; the experts take ", config.ExpertWidth()));
  }
  const std::vector<bool>& hosted = hosted_[*moe_layer];
  for (const ExpertAssignment& a : request.assignments) {
    if (a.expert < 0 || a.expert >= config.num_experts || !hosted[a.expert]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", a.expert, " of MoE layer ", *moe_layer, " (model layer ", request.layer,
          ") is not hosted by ", name_, " (worker ", hosting_.worker, " of placement version ",
          hosting_.placement_version, "; the router used version ", request.placement_version,
          ")"));
    }
  }
  return absl::OkStatus();
}

ExpertResponse ExpertWorker::Serve(const ExpertRequest& request) {
  ExpertResponse response;
  response.step_id = request.step_id;
  response.status = Check(request);
  if (response.status.ok()) {
    response.rows.resize(request.rows.size());
    response.status = RunExperts(weights_->layers[request.layer].moe.experts, glu_,
                                 request.rows.data(), request.rows_count, request.width,
                                 request.assignments, response.rows.data(), &scratch_);
  }
  if (!response.status.ok()) {
    response.rows.clear();
    return response;
  }
  response.rows_count = request.rows_count;
  response.width = request.width;
  rows_processed_ += request.rows_count;
  return response;
}

ExpertWorker::Outcome ExpertWorker::Handle(Transport* transport, const Received& received,
                                           bool may_defer) {
  Outcome outcome;
  if (received.kind != Received::Kind::kMessage) return outcome;
  absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received.bytes);
  if (!kind.ok() || *kind != MoeMessageKind::kExpertRequest) {
    LOG(WARNING) << name_ << ": dropping a message from peer " << received.from << " that is not "
                 << "an ExpertRequest"
                 << (kind.ok() ? "" : absl::StrCat(" (", kind.status().message(), ")"));
    return outcome;
  }
  ExpertRequest request;
  ExpertResponse response;
  if (absl::Status decoded = Decode(received.bytes, &request); !decoded.ok()) {
    // Decode reads the step id first, so the router can still match the answer when it got that far.
    response.step_id = request.step_id;
    response.status = decoded;
  } else if (may_defer && request.placement_version > static_cast<uint64_t>(hosting_.placement_version) &&
             !Check(request).ok()) {
    outcome.deferred = true;
    return outcome;
  } else {
    response = Serve(request);
  }
  outcome.answer = response.status;
  if (!response.status.ok()) {
    LOG_EVERY_N(WARNING, 100) << name_ << ": step " << response.step_id << " from peer "
                              << received.from << " failed: " << response.status;
  }
  if (absl::Status sent = transport->Send(received.from, Encode(response)); !sent.ok()) {
    LOG_EVERY_N(WARNING, 100) << name_ << ": cannot answer peer " << received.from << ": " << sent;
  }
  return outcome;
}

}  // namespace k3
