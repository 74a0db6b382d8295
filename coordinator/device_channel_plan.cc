#include "coordinator/device_channel_plan.h"

#include <algorithm>
#include <map>
#include <utility>

namespace k3 {

namespace pb = k3serve::cluster::v1;

DeviceChannelPlan PlanDeviceChannels(const std::vector<DeviceChannelMember>& alive,
                                     const std::vector<IssuedDeviceChannel>& current,
                                     const std::set<uint64_t>& broken, uint64_t next_id,
                                     const NcclUniqueIdGenerator& generator) {
  DeviceChannelPlan plan;
  plan.next_id = next_id;
  std::map<uint32_t, const DeviceChannelMember*> by_id;
  std::vector<const DeviceChannelMember*> attention, experts;
  for (const DeviceChannelMember& m : alive) {
    by_id[m.node_id] = &m;
    if (m.gpu_uuid.empty()) continue;
    if (m.role == pb::ROLE_ATTENTION) attention.push_back(&m);
    if (m.role == pb::ROLE_EXPERT) experts.push_back(&m);
  }
  auto by_node = [](const DeviceChannelMember* a, const DeviceChannelMember* b) {
    return a->node_id < b->node_id;
  };
  std::sort(attention.begin(), attention.end(), by_node);
  std::sort(experts.begin(), experts.end(), by_node);

  // The ordered pairs that qualify, and the channel each keeps (if any).
  std::map<std::pair<uint32_t, uint32_t>, const IssuedDeviceChannel*> kept;
  auto qualifies = [&](uint32_t a, uint32_t b) {
    auto ia = by_id.find(a), ib = by_id.find(b);
    if (ia == by_id.end() || ib == by_id.end()) return false;
    const DeviceChannelMember& x = *ia->second;
    const DeviceChannelMember& y = *ib->second;
    const bool roles = (x.role == pb::ROLE_ATTENTION && y.role == pb::ROLE_EXPERT) ||
                       (x.role == pb::ROLE_EXPERT && y.role == pb::ROLE_ATTENTION);
    return roles && !x.gpu_uuid.empty() && !y.gpu_uuid.empty() && x.gpu_uuid != y.gpu_uuid;
  };
  if (generator) {
    for (const IssuedDeviceChannel& c : current) {
      if (broken.count(c.id) > 0 || !qualifies(c.sender, c.receiver)) continue;
      if (by_id[c.sender]->incarnation != c.sender_incarnation ||
          by_id[c.receiver]->incarnation != c.receiver_incarnation) {
        continue;  // an end restarted: its communicator is gone
      }
      // One channel per ordered pair; a duplicate (never issued by this function) goes.
      kept.emplace(std::make_pair(c.sender, c.receiver), &c);
    }
    for (const IssuedDeviceChannel& c : current) {
      auto it = kept.find({c.sender, c.receiver});
      if (it != kept.end() && it->second == &c) plan.channels.push_back(c);
    }
    for (const DeviceChannelMember* a : attention) {
      for (const DeviceChannelMember* e : experts) {
        if (!qualifies(a->node_id, e->node_id)) continue;
        for (const auto& [from, to] : {std::make_pair(a, e), std::make_pair(e, a)}) {
          if (kept.count({from->node_id, to->node_id}) > 0) continue;
          absl::StatusOr<std::string> unique_id = generator();
          if (!unique_id.ok()) {
            if (plan.generator_error.ok()) plan.generator_error = unique_id.status();
            continue;
          }
          IssuedDeviceChannel c;
          c.id = plan.next_id++;
          c.sender = from->node_id;
          c.receiver = to->node_id;
          c.nccl_unique_id = *std::move(unique_id);
          c.sender_incarnation = from->incarnation;
          c.receiver_incarnation = to->incarnation;
          plan.channels.push_back(std::move(c));
        }
      }
    }
  }
  std::sort(plan.channels.begin(), plan.channels.end(),
            [](const IssuedDeviceChannel& x, const IssuedDeviceChannel& y) { return x.id < y.id; });
  plan.changed = plan.channels != current;
  return plan;
}

}  // namespace k3
