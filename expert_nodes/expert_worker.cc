#include "expert_nodes/expert_worker.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "moe/moe_layer_map.h"

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
    : name_(std::move(name)) {
  AddVersion(std::move(weights), std::move(hosting));
}

void ExpertWorker::AddVersion(std::shared_ptr<const ModelWeights> weights, ExpertHosting hosting) {
  Version version;
  version.weights = std::move(weights);
  version.hosting = std::move(hosting);
  if (version.weights != nullptr) {
    glu_ = GluParamsFor(version.weights->config);
    version.hosted.resize(version.hosting.experts.size());
    for (size_t layer = 0; layer < version.hosting.experts.size(); ++layer) {
      version.hosted[layer].assign(version.weights->config.num_experts, false);
      for (int e : version.hosting.experts[layer]) version.hosted[layer][e] = true;
    }
  }
  if (device_ != nullptr && version.weights != nullptr) {
    version.on_device = device_->Add(*version.weights);
  }
  const int64_t key = version.hosting.placement_version;
  versions_[key] = std::move(version);
  ForgetUnusedOnDevice();
}

absl::Status ExpertWorker::UseDevice(std::unique_ptr<DeviceExperts> device) {
  device_ = std::move(device);
  absl::Status first;
  for (auto& [unused, version] : versions_) {
    version.on_device = device_ != nullptr && version.weights != nullptr
                            ? device_->Add(*version.weights)
                            : absl::OkStatus();
    first.Update(version.on_device);
  }
  return first;
}

absl::Status ExpertWorker::DeviceStatus(int64_t version) const {
  auto it = versions_.find(version);
  return it == versions_.end() ? absl::OkStatus() : it->second.on_device;
}

void ExpertWorker::ForgetUnusedOnDevice() {
  if (device_ == nullptr) return;
  std::set<const ModelWeights*> used;
  for (const auto& [unused, version] : versions_) used.insert(version.weights.get());
  for (auto it = on_device_.begin(); it != on_device_.end();) {
    if (used.contains(it->get())) {
      ++it;
    } else {
      device_->Forget(**it);
      it = on_device_.erase(it);
    }
  }
  for (const auto& [unused, version] : versions_) {
    if (version.weights != nullptr && version.on_device.ok()) on_device_.insert(version.weights);
  }
}

void ExpertWorker::DropVersions(const std::function<bool(int64_t)>& keep) {
  const int64_t newest = versions_.rbegin()->first;
  const bool any_kept = std::any_of(versions_.begin(), versions_.end(),
                                    [&keep](const auto& entry) { return keep(entry.first); });
  for (auto it = versions_.begin(); it != versions_.end();) {
    const bool stays = keep(it->first) || (!any_kept && it->first == newest);
    it = stays ? std::next(it) : versions_.erase(it);
  }
  ForgetUnusedOnDevice();
}

std::vector<int64_t> ExpertWorker::versions() const {
  std::vector<int64_t> held;
  for (const auto& [version, unused] : versions_) held.push_back(version);
  return held;
}

const ExpertHosting* ExpertWorker::FindVersion(int64_t version) const {
  auto it = versions_.find(version);
  return it == versions_.end() ? nullptr : &it->second.hosting;
}

std::shared_ptr<const ModelWeights> ExpertWorker::WeightsWith(
    const std::vector<int>& experts) const {
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    const std::shared_ptr<const ModelWeights>& weights = it->second.weights;
    if (weights == nullptr) continue;
    const bool all = std::all_of(experts.begin(), experts.end(), [&](int e) {
      for (const LayerWeights& layer : weights->layers) {
        if (!layer.is_moe) continue;
        if (e < 0 || e >= static_cast<int>(layer.moe.experts.size()) ||
            layer.moe.experts[e].gate.empty()) {
          return false;
        }
      }
      return true;
    });
    if (all) return weights;
  }
  return nullptr;
}

int64_t ExpertWorker::weight_bytes() const {
  std::set<const ModelWeights*> distinct;
  int64_t bytes = 0;
  for (const auto& [unused, version] : versions_) {
    if (version.weights != nullptr && distinct.insert(version.weights.get()).second) {
      bytes += static_cast<int64_t>(version.weights->selected_bytes);
    }
  }
  return bytes;
}

const ExpertWorker::Version& ExpertWorker::VersionFor(uint64_t requested) const {
  auto it = versions_.upper_bound(static_cast<int64_t>(std::min<uint64_t>(
      requested, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))));
  return it == versions_.begin() ? it->second : std::prev(it)->second;
}

absl::Status ExpertWorker::Check(const ExpertRequest& request, const Version& version) const {
  const ExpertHosting& hosting = version.hosting;
  if (version.weights == nullptr || hosting.worker < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " hosts no experts (placement version ", hosting.placement_version,
                     " gives it no worker slot; the router used version ",
                     request.placement_version, ")"));
  }
  const ModelConfig& config = version.weights->config;
  K3_ASSIGN_OR_RETURN(int moe_layer, MoeLayerIndex(config, request.layer));
  if (moe_layer >= static_cast<int>(version.hosted.size())) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " has no placement for MoE layer ",
                                                      moe_layer, " (model layer ", request.layer,
                                                      ")"));
  }
  if (request.width != config.ExpertWidth()) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertRequest rows have width ", request.width,
                                                   "; the experts take ", config.ExpertWidth()));
  }
  const std::vector<bool>& hosted = version.hosted[moe_layer];
  for (const ExpertAssignment& a : request.assignments) {
    if (a.expert < 0 || a.expert >= config.num_experts || !hosted[a.expert]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", a.expert, " of MoE layer ", moe_layer, " (model layer ", request.layer,
          ") is not hosted by ", name_, " (worker ", hosting.worker, " of placement version ",
          hosting.placement_version, "; the router used version ", request.placement_version, ")"));
    }
  }
  return absl::OkStatus();
}

void ExpertWorker::CountServed(const ExpertRequest& request) {
  rows_processed_ += request.rows_count;
  if (assignments_per_layer_.size() <= static_cast<size_t>(request.layer)) {
    assignments_per_layer_.resize(request.layer + 1);
  }
  assignments_per_layer_[request.layer] += static_cast<int64_t>(request.assignments.size());
}

absl::Status ExpertWorker::ComputeDeviceRows(PeerId from, const ExpertRequest& request,
                                             const float** answer, bool* took_rows) {
  *took_rows = false;
  if (channels_ == nullptr || device_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        name_, " takes no device rows (", device_ == nullptr ? "it computes on the CPU" : "",
        channels_ == nullptr ? " it has no device channels" : "", ")"));
  }
  const auto peer = static_cast<uint32_t>(from);
  std::shared_ptr<DeviceChannel> in = channels_->FromPeer(peer);
  if (in == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(name_, " has no device channel from node ", peer, " (not open yet)"));
  }
  // Decode bounded rows_count and width below by 0; a request this large cannot be real, and its
  // rows cannot be taken off the channel, so the channel is given up.
  constexpr int64_t kMaxFloats = int64_t{1} << 31;
  if (request.width > 0 && request.rows_count > kMaxFloats / request.width) {
    absl::Status too_large = absl::InvalidArgumentError(absl::StrCat(
        "ExpertRequest of ", request.rows_count, " device rows of width ", request.width));
    channels_->ReportBrokenChannel(in.get(), too_large);
    return too_large;
  }
  const int64_t floats = request.rows_count * request.width;
  absl::StatusOr<DeviceExperts::RowBuffers> buffers = device_->ReserveRowBuffers(floats);
  absl::Status received = buffers.status();
  if (received.ok()) received = in->Recv(buffers->rows, static_cast<size_t>(floats) * 4);
  if (!received.ok()) {
    channels_->ReportBrokenChannel(in.get(), received);
    return absl::UnavailableError(absl::StrCat(name_, ": the rows from node ", peer,
                                               " did not arrive on the device channel: ",
                                               received.message()));
  }
  *took_rows = true;
  const Version& version = VersionFor(request.placement_version);
  K3_RETURN_IF_ERROR(Check(request, version));
  K3_RETURN_IF_ERROR(version.on_device);
  K3_RETURN_IF_ERROR(device_->RunDeviceRows(*version.weights, request.layer, buffers->rows,
                                            request.rows_count, request.width,
                                            request.assignments, buffers->answer));
  CountServed(request);
  *answer = buffers->answer;
  return absl::OkStatus();
}

absl::Status ExpertWorker::ServeDeviceRows(Transport* transport, PeerId from,
                                           const ExpertRequest& request) {
  ExpertResponse response;
  response.step_id = request.step_id;
  response.rows_on_device = true;
  const float* answer = nullptr;
  bool took_rows = false;
  response.status = ComputeDeviceRows(from, request, &answer, &took_rows);
  std::shared_ptr<DeviceChannel> out;
  if (response.status.ok()) {
    out = channels_->ToPeer(static_cast<uint32_t>(from));
    if (out == nullptr) {
      response.status = absl::UnavailableError(
          absl::StrCat(name_, " has no device channel to node ", from, " (not open yet)"));
    }
  }
  // An error answer's rows_count says whether the rows were taken off the channel (see
  // ExpertResponse::rows_on_device): if not, the sender gives its channel up.
  response.rows_count = took_rows ? request.rows_count : 0;
  response.width = request.width;
  if (absl::Status sent = transport->Send(from, Encode(response)); !sent.ok()) {
    // The sender will not take the partial sums off the channel: they are not sent.
    LOG_EVERY_N(WARNING, 100) << name_ << ": cannot answer peer " << from << ": " << sent;
    return response.status;
  }
  if (!response.status.ok()) return response.status;
  const size_t bytes = static_cast<size_t>(request.rows_count * request.width) * sizeof(float);
  if (absl::Status sent = out->Send(answer, bytes); !sent.ok()) {
    channels_->ReportBrokenChannel(out.get(), sent);
    return sent;
  }
  return absl::OkStatus();
}

std::string ExpertWorker::Serve(const ExpertRequest& request, absl::Span<const float> rows,
                                absl::Status* status) {
  ExpertResponse response;
  response.step_id = request.step_id;
  const Version& version = VersionFor(request.placement_version);
  response.status = Check(request, version);
  if (response.status.ok() &&
      rows.size() != static_cast<size_t>(request.rows_count) * static_cast<size_t>(request.width)) {
    response.status = absl::InvalidArgumentError(
        absl::StrCat("ExpertRequest has ", rows.size(), " floats for ", request.rows_count,
                     " rows of width ", request.width));
  }
  std::string message;
  if (response.status.ok()) {
    // The partial sums are computed straight into the answer's message.
    response.rows_count = request.rows_count;
    response.width = request.width;
    float* out = EncodeLeavingRows(response, &message);
    if (device_ == nullptr) {
      response.status = RunExperts(version.weights->layers[request.layer].moe.experts, glu_,
                                   rows.data(), request.rows_count, request.width,
                                   request.assignments, out, &scratch_);
    } else if (!version.on_device.ok()) {
      response.status = version.on_device;
    } else {
      response.status = device_->Run(*version.weights, request.layer, rows.data(),
                                     request.rows_count, request.width, request.assignments, out);
    }
    if (response.status.ok()) {
      CountServed(request);
      *status = absl::OkStatus();
      return message;
    }
  }
  response.rows_count = 0;
  response.width = 0;
  *status = response.status;
  return Encode(response);
}

ExpertWorker::Outcome ExpertWorker::Handle(Transport* transport, const Received& received,
                                           bool may_defer) {
  Outcome outcome;
  if (received.kind != Received::Kind::kMessage) return outcome;
  absl::StatusOr<MoeMessageKind> kind = PeekMoeMessageKind(received.bytes);
  if (!kind.ok() || (*kind != MoeMessageKind::kExpertRequest &&
                     *kind != MoeMessageKind::kDeviceExpertRequest)) {
    LOG(WARNING) << name_ << ": dropping a message from peer " << received.from << " that is not "
                 << "an ExpertRequest"
                 << (kind.ok() ? "" : absl::StrCat(" (", kind.status().message(), ")"));
    return outcome;
  }
  ExpertRequest request;
  absl::Span<const float> rows;  // read in place, inside received.bytes
  std::string answer;
  if (absl::Status decoded = DecodeInPlace(received.bytes, &request, &rows); !decoded.ok()) {
    // Decode reads the step id first: the router can still match the answer when it got that far.
    ExpertResponse response;
    response.step_id = request.step_id;
    response.status = decoded;
    outcome.answer = decoded;
    answer = Encode(response);
  } else if (may_defer && !request.rows_on_device &&
             request.placement_version > static_cast<uint64_t>(versions_.rbegin()->first) &&
             !Check(request, VersionFor(request.placement_version)).ok()) {
    outcome.deferred = true;
    return outcome;
  } else {
    const absl::Time start = absl::Now();
    if (request.rows_on_device) {
      outcome.answer = ServeDeviceRows(transport, received.from, request);
    } else {
      answer = Serve(request, rows, &outcome.answer);
    }
    for (const TraceContext& trace : request.traces) {
      if (spans_ == nullptr) break;
      Span span;
      span.name = "k3.experts";
      span.context = trace.WithSpan(NewSpanId());
      span.parent = trace.span_id;
      span.start = start;
      span.end = absl::Now();
      span.attributes = {{"k3.layer", static_cast<double>(request.layer)},
                         {"k3.rows", static_cast<double>(request.rows_count)},
                         {"k3.assignments", static_cast<double>(request.assignments.size())}};
      spans_->Record(span);
    }
  }
  if (!outcome.answer.ok()) {
    LOG_EVERY_N(WARNING, 100) << name_ << ": step " << request.step_id << " from peer "
                              << received.from << " failed: " << outcome.answer;
  }
  if (answer.empty()) return outcome;  // ServeDeviceRows answered
  if (absl::Status sent = transport->Send(received.from, std::move(answer)); !sent.ok()) {
    LOG_EVERY_N(WARNING, 100) << name_ << ": cannot answer peer " << received.from << ": " << sent;
  }
  return outcome;
}

}  // namespace k3
