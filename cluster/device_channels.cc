#include "cluster/device_channels.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "glog/logging.h"

namespace k3 {

namespace pb = k3serve::cluster::v1;

DeviceChannels::DeviceChannels(Opener opener) : opener_(std::move(opener)) {
  thread_ = std::thread([this] { Run(); });
  pthread_setname_np(thread_.native_handle(), "k3-dev-channels");
}

DeviceChannels::~DeviceChannels() {
  std::vector<std::shared_ptr<DeviceChannel>> to_abort;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, entry] : entries_) {
      if (entry.channel != nullptr) to_abort.push_back(std::move(entry.channel));
    }
    entries_.clear();
  }
  for (auto& channel : to_abort) channel->Abort();
  thread_.join();
}

void DeviceChannels::Apply(const pb::ClusterState& state, uint32_t self_node) {
  if (state.recovering()) return;
  std::map<uint64_t, DeviceChannelSpec> listed;
  for (const pb::DeviceChannel& c : state.device_channels()) {
    if (c.sender() == c.receiver()) continue;  // never issued; it would be its own peer
    if (c.sender() != self_node && c.receiver() != self_node) continue;
    listed[c.id()] = DeviceChannelSpec{c.id(), c.sender(), c.receiver(), c.nccl_unique_id()};
  }
  std::vector<std::shared_ptr<DeviceChannel>> to_abort;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto found = listed.find(it->first);
      const bool keep = found != listed.end() &&
                        found->second.nccl_unique_id == it->second.spec.nccl_unique_id &&
                        found->second.sender == it->second.spec.sender &&
                        found->second.receiver == it->second.spec.receiver;
      if (keep) {
        listed.erase(found);
        ++it;
        continue;
      }
      if (it->second.phase != Phase::kBroken) {
        VLOG(1) << "device channel " << it->first << " is no longer issued; dropping it";
      }
      // An entry in kOpening is erased too: the opener thread finds it gone and aborts what it
      // opened.
      if (it->second.channel != nullptr) to_abort.push_back(std::move(it->second.channel));
      it = entries_.erase(it);
    }
    for (auto& [id, spec] : listed) {
      Entry& entry = entries_[id];
      entry.as_sender = spec.sender == self_node;
      entry.spec = std::move(spec);
    }
  }
  for (auto& channel : to_abort) channel->Abort();
}

std::shared_ptr<DeviceChannel> DeviceChannels::Find(bool sending, uint32_t peer) const {
  absl::MutexLock lock(&mu_);
  // Highest id first: a replacement beats the channel it replaces.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    const Entry& entry = it->second;
    if (entry.phase != Phase::kOpen || entry.as_sender != sending) continue;
    if ((sending ? entry.spec.receiver : entry.spec.sender) == peer) return entry.channel;
  }
  return nullptr;
}

std::shared_ptr<DeviceChannel> DeviceChannels::ToPeer(uint32_t peer) const {
  return Find(/*sending=*/true, peer);
}

std::shared_ptr<DeviceChannel> DeviceChannels::FromPeer(uint32_t peer) const {
  return Find(/*sending=*/false, peer);
}

std::shared_ptr<DeviceChannel> DeviceChannels::BreakLocked(std::map<uint64_t, Entry>::iterator it,
                                                           const absl::Status& why) {
  Entry& entry = it->second;
  LOG(WARNING) << "device channel " << it->first << " (node " << entry.spec.sender << " -> node "
               << entry.spec.receiver << ") is broken: " << why
               << "; asking the coordinator for a new one";
  entry.phase = Phase::kBroken;
  if (std::find(broken_.begin(), broken_.end(), it->first) == broken_.end()) {
    broken_.push_back(it->first);
  }
  return std::move(entry.channel);
}

void DeviceChannels::ReportBroken(uint64_t channel_id, const absl::Status& why) {
  std::shared_ptr<DeviceChannel> channel;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(channel_id);
    if (it == entries_.end() || it->second.phase != Phase::kOpen) return;
    channel = BreakLocked(it, why);
  }
  if (channel != nullptr) channel->Abort();
}

void DeviceChannels::ReportBrokenChannel(const DeviceChannel* channel, const absl::Status& why) {
  if (channel == nullptr) return;
  std::shared_ptr<DeviceChannel> held;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.phase == Phase::kOpen && it->second.channel.get() == channel) {
        held = BreakLocked(it, why);
        break;
      }
    }
  }
  if (held != nullptr) held->Abort();
}

std::vector<uint64_t> DeviceChannels::TakeBroken() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    ids.swap(broken_);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<uint64_t> DeviceChannels::OpenIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, entry] : entries_) {
    if (entry.phase == Phase::kOpen) ids.push_back(id);
  }
  return ids;
}

void DeviceChannels::Run() {
  for (;;) {
    DeviceChannelSpec spec;
    bool as_sender = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        for (const auto& [id, entry] : entries_) {
          if (entry.phase == Phase::kPending) return true;
        }
        return false;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      // Lowest id first (see the header: every node opens in the same order).
      for (auto& [id, entry] : entries_) {
        if (entry.phase != Phase::kPending) continue;
        entry.phase = Phase::kOpening;
        spec = entry.spec;
        as_sender = entry.as_sender;
        break;
      }
    }
    VLOG(1) << "opening device channel " << spec.id << " (node " << spec.sender << " -> node "
            << spec.receiver << ") as its " << (as_sender ? "sender" : "receiver");
    absl::StatusOr<std::unique_ptr<DeviceChannel>> opened = opener_(spec, as_sender);
    std::shared_ptr<DeviceChannel> unwanted;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(spec.id);
      const bool still_wanted = !stopping_ && it != entries_.end() &&
                                it->second.phase == Phase::kOpening &&
                                it->second.spec.nccl_unique_id == spec.nccl_unique_id;
      if (!opened.ok()) {
        if (still_wanted) {
          BreakLocked(it, opened.status());
        } else {
          VLOG(1) << "device channel " << spec.id
                  << " failed to open after it was dropped: " << opened.status();
        }
      } else if (still_wanted) {
        it->second.channel = std::shared_ptr<DeviceChannel>(std::move(*opened));
        it->second.phase = Phase::kOpen;
        LOG(INFO) << "device channel " << spec.id << " (node " << spec.sender << " -> node "
                  << spec.receiver << ") is open";
      } else {
        unwanted = std::shared_ptr<DeviceChannel>(std::move(*opened));
      }
    }
    if (unwanted != nullptr) unwanted->Abort();
  }
}

}  // namespace k3
