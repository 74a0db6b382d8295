#include "cluster/inproc_device_channel.h"

#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace k3 {

struct InProcDeviceChannels::Pipe {
  absl::Mutex mu;
  std::deque<std::string> sent ABSL_GUARDED_BY(mu);
  bool aborted ABSL_GUARDED_BY(mu) = false;
};

namespace {

class InProcEnd : public DeviceChannel {
 public:
  InProcEnd(std::shared_ptr<InProcDeviceChannels::Pipe> pipe, uint64_t id, bool sender,
            absl::Duration recv_timeout)
      : pipe_(std::move(pipe)), id_(id), sender_(sender), recv_timeout_(recv_timeout) {}

  absl::Status Send(const void* data, size_t bytes) override {
    if (!sender_) return absl::FailedPreconditionError("Send on a channel's receiving end");
    absl::MutexLock lock(&pipe_->mu);
    if (pipe_->aborted) return Aborted();
    pipe_->sent.emplace_back(static_cast<const char*>(data), bytes);
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, size_t bytes) override {
    if (sender_) return absl::FailedPreconditionError("Recv on a channel's sending end");
    InProcDeviceChannels::Pipe& pipe = *pipe_;
    absl::MutexLock lock(&pipe.mu);
    auto ready = [&pipe]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipe.mu) {
      return pipe.aborted || !pipe.sent.empty();
    };
    if (!pipe.mu.AwaitWithTimeout(absl::Condition(&ready), recv_timeout_)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "device channel ", id_, ": nothing sent within ", absl::FormatDuration(recv_timeout_)));
    }
    if (pipe.aborted) return Aborted();
    std::string next = std::move(pipe.sent.front());
    pipe.sent.pop_front();
    if (next.size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("device channel ", id_, ": ", next.size(),
                                                     " bytes sent, ", bytes, " expected"));
    }
    std::memcpy(data, next.data(), bytes);
    return absl::OkStatus();
  }

  void Abort() override {
    absl::MutexLock lock(&pipe_->mu);
    pipe_->aborted = true;
  }

 private:
  absl::Status Aborted() const {
    return absl::FailedPreconditionError(absl::StrCat("device channel ", id_, " was aborted"));
  }

  const std::shared_ptr<InProcDeviceChannels::Pipe> pipe_;
  const uint64_t id_;
  const bool sender_;
  const absl::Duration recv_timeout_;
};

}  // namespace

std::shared_ptr<InProcDeviceChannels::Pipe> InProcDeviceChannels::PipeFor(uint64_t id) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Pipe>& pipe = pipes_[id];
  if (pipe == nullptr) pipe = std::make_shared<Pipe>();
  return pipe;
}

DeviceChannels::Opener InProcDeviceChannels::Opener() {
  return [this](const DeviceChannelSpec& spec,
                bool as_sender) -> absl::StatusOr<std::unique_ptr<DeviceChannel>> {
    return std::make_unique<InProcEnd>(PipeFor(spec.id), spec.id, as_sender, recv_timeout_);
  };
}

}  // namespace k3
