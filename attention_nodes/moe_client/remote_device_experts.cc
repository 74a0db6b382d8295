#include "attention_nodes/moe_client/remote_device_experts.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attention_nodes/moe_client/expert_node_plan.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "moe/moe_layer_map.h"
#include "moe/moe_wire.h"

namespace k3 {

RemoteDeviceExperts::RemoteDeviceExperts(Transport* transport, DeviceChannels* channels,
                                         const ModelConfig& config,
                                         RemoteDeviceExpertsOptions options)
    : transport_(transport), channels_(channels), config_(config), options_(std::move(options)) {}

void RemoteDeviceExperts::SetPlacement(ClusterPlacement placement) {
  absl::MutexLock lock(&mu_);
  placement_ = std::move(placement);
}

absl::Status RemoteDeviceExperts::Run(DeviceRowOps& ops, int layer, const float* z, int64_t rows,
                                      int64_t width, const int32_t* ids, const float* weights,
                                      int32_t top_k, float* out, void* stream) {
  if (channels_->OpenIds().empty()) {
    // The usual state where the expert nodes are not on GPUs: nothing to try, nothing to log.
    return absl::UnavailableError("no device channels are open");
  }
  bool sent = false;
  absl::Status status =
      RunLayer(ops, layer, z, rows, width, ids, weights, top_k, out, stream, &sent);
  if (status.ok()) {
    layers_served_.fetch_add(1, std::memory_order_relaxed);
  } else if (sent) {
    layers_failed_.fetch_add(1, std::memory_order_relaxed);
    LOG_EVERY_N(WARNING, 100) << "MoE layer " << layer
                              << " failed on the device channels (every 100th logged): " << status;
  }
  return status;
}

absl::Status RemoteDeviceExperts::RunLayer(DeviceRowOps& ops, int layer, const float* z,
                                           int64_t rows, int64_t width, const int32_t* ids,
                                           const float* weights, int32_t top_k, float* out,
                                           void* stream, bool* sent_any) {
  *sent_any = false;
  if (width != config_.ExpertWidth() || rows < 1 || top_k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote device experts: ", rows, " rows of width ", width, ", top ", top_k));
  }
  const size_t pairs = static_cast<size_t>(rows * top_k);
  host_ids_.resize(pairs);
  host_weights_.resize(pairs);
  K3_RETURN_IF_ERROR(ops.CopyToHost(ids, host_ids_.data(), pairs * sizeof(int32_t), stream));
  K3_RETURN_IF_ERROR(ops.CopyToHost(weights, host_weights_.data(), pairs * sizeof(float), stream));
  K3_ASSIGN_OR_RETURN(const int moe_layer, MoeLayerIndex(config_, layer));
  ClusterPlacement placement;
  {
    absl::MutexLock lock(&mu_);
    placement = placement_;
  }
  K3_ASSIGN_OR_RETURN(
      std::vector<NodeAssignments> plan,
      PlanExpertNodes(placement, moe_layer, host_ids_.data(), host_weights_.data(), rows, top_k));
  // Every node's channels before anything is sent: a layer that cannot go whole goes elsewhere.
  std::vector<Pending> pending(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    pending[i].node = plan[i].node;
    pending[i].rows_out = channels_->ToPeer(plan[i].node);
    pending[i].answers = channels_->FromPeer(plan[i].node);
    if (pending[i].rows_out == nullptr || pending[i].answers == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("no open device channels with expert node ", plan[i].node));
    }
  }
  K3_RETURN_IF_ERROR(ops.Synchronize(stream));  // z is computed before a channel reads it
  const size_t row_bytes = static_cast<size_t>(rows * width) * sizeof(float);
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Status failure;
  size_t sent = 0;
  for (; sent < plan.size(); ++sent) {
    ExpertRequest request;
    request.step_id = pending[sent].step_id = (uint64_t{1} << 63) | next_step_id_++;
    request.layer = layer;
    request.placement_version = static_cast<uint64_t>(placement.version());
    request.rows_count = rows;
    request.width = static_cast<int32_t>(width);
    request.assignments = std::move(plan[sent].assignments);
    request.rows_on_device = true;
    const uint32_t node = plan[sent].node;
    failure = transport_->Send(node, Encode(request));
    if (!failure.ok()) break;
    *sent_any = true;
    if (failure = pending[sent].rows_out->Send(z, row_bytes); !failure.ok()) {
      channels_->ReportBrokenChannel(pending[sent].rows_out.get(), failure);
      ++sent;  // the node has the request: it answers (with an error, its rows lost)
      break;
    }
  }
  pending.resize(sent);
  K3_RETURN_IF_ERROR(ops.Zero(out, rows * width, stream));
  absl::Status collected = Collect(ops, pending, rows, width, out, stream, deadline);
  if (!failure.ok()) {
    return absl::UnavailableError(
        absl::StrCat("sending MoE layer ", layer, "'s rows: ", failure.message()));
  }
  return collected;
}

absl::Status RemoteDeviceExperts::Collect(DeviceRowOps& ops, std::vector<Pending>& pending,
                                          int64_t rows, int64_t width, float* out, void* stream,
                                          absl::Time deadline) {
  absl::Status failure;
  auto all_answered = [&pending] {
    return std::all_of(pending.begin(), pending.end(), [](const Pending& p) { return p.answered; });
  };
  while (!all_answered()) {
    absl::StatusOr<Received> received = transport_->Receive(deadline);
    if (!received.ok()) {
      // Late nodes' sums would arrive out of step with later layers: their channels go.
      for (const Pending& p : pending) {
        if (p.answered) continue;
        const absl::Status late = absl::DeadlineExceededError(
            absl::StrCat("expert node ", p.node, " did not answer within ",
                         absl::FormatDuration(options_.timeout)));
        channels_->ReportBrokenChannel(p.answers.get(), late);
        if (failure.ok()) failure = late;
      }
      if (!absl::IsDeadlineExceeded(received.status())) failure = received.status();
      return failure;
    }
    if (!Take(ops, *received, pending, rows, width, out, stream, &failure) &&
        options_.others != nullptr) {
      options_.others(*std::move(received));
    }
  }
  return failure;
}

bool RemoteDeviceExperts::Take(DeviceRowOps& ops, const Received& received,
                               std::vector<Pending>& pending, int64_t rows, int64_t width,
                               float* out, void* stream, absl::Status* failure) {
  auto record = [failure](absl::Status s) {
    if (failure->ok()) *failure = std::move(s);
  };
  if (received.kind == Received::Kind::kPeerFailed) {
    bool ours = false;
    for (Pending& p : pending) {
      if (p.answered || p.node != received.from) continue;
      p.answered = ours = true;
      channels_->ReportBrokenChannel(p.answers.get(), received.error);
      record(received.error);
    }
    return ours;
  }
  absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received.bytes);
  if (!kind.ok() || *kind != MoeMessageKind::kDeviceExpertResponse) return false;
  ExpertResponse response;
  if (absl::Status s = Decode(received.bytes, &response); !s.ok()) {
    LOG(WARNING) << "dropping a malformed ExpertResponse from peer " << received.from << ": " << s;
    return true;
  }
  Pending* mine = nullptr;
  for (Pending& p : pending) {
    if (!p.answered && p.step_id == response.step_id && p.node == received.from) mine = &p;
  }
  if (mine == nullptr) return true;  // a late answer of a failed layer: its channel is broken
  mine->answered = true;
  if (!response.status.ok()) {
    if (response.rows_count != rows) {
      // The node could not take the rows off its channel: the channel is out of step.
      channels_->ReportBrokenChannel(mine->rows_out.get(), response.status);
    }
    record(absl::Status(response.status.code(),
                        absl::StrCat("expert node ", mine->node, ": ", response.status.message())));
    return true;
  }
  if (response.rows_count != rows || response.width != width) {
    const absl::Status wrong = absl::InternalError(
        absl::StrCat("expert node ", mine->node, " answered ", response.rows_count, " x ",
                     response.width, " rows; expected ", rows, " x ", width));
    channels_->ReportBrokenChannel(mine->answers.get(), wrong);  // its sums are the wrong size
    record(wrong);
    return true;
  }
  const int index = static_cast<int>(mine - pending.data());
  absl::StatusOr<float*> partial = ops.Scratch(index, rows * width);
  absl::Status taken = partial.status();
  if (taken.ok()) {
    taken = mine->answers->Recv(*partial, static_cast<size_t>(rows * width) * sizeof(float));
  }
  if (!taken.ok()) {
    channels_->ReportBrokenChannel(mine->answers.get(), taken);
    record(absl::UnavailableError(absl::StrCat("the partial sums of expert node ", mine->node,
                                               " did not arrive: ", taken.message())));
    return true;
  }
  if (absl::Status added = ops.Add(*partial, out, rows * width, stream); !added.ok()) {
    record(added);
  }
  return true;
}

}  // namespace k3
