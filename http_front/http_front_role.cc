// The HTTP front as a node role (cluster/node_runtime.h): RunHttpFront.
#include <iostream>
#include <memory>
#include <utility>

#include "cluster/node_runtime.h"
#include "http_front/http_front.h"

namespace k3 {
namespace {

class HttpFrontRole final : public RoleHooks {
 public:
  explicit HttpFrontRole(HttpFrontOptions options) : options_(std::move(options)) {}
  absl::Status Start() override {
    absl::StatusOr<std::unique_ptr<HttpFront>> front = HttpFront::Start(options_);
    if (!front.ok()) return front.status();
    front_ = *std::move(front);
    // Launchers and people read the address from this line.
    std::cout << "http address: " << options_.host << ":" << front_->port() << std::endl;
    return absl::OkStatus();
  }
  void Shutdown() override {
    if (front_) front_->Stop();
  }

 private:
  const HttpFrontOptions options_;
  std::unique_ptr<HttpFront> front_;
};

}  // namespace

int RunHttpFront(const HttpFrontOptions& options) {
  return RunNode("http front", std::make_unique<HttpFrontRole>(options));
}

}  // namespace k3
