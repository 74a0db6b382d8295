#include "expert_nodes/device_experts.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifdef K3SERVE_CUDA
#include "expert_nodes/gpu_device_experts.h"
#endif

namespace k3 {

absl::StatusOr<ExpertDevice> ParseExpertDevice(const std::string& text) {
  if (text == "cpu") return ExpertDevice{};
  if (text == "cuda") return ExpertDevice{0};
  const std::string prefix = "cuda:";
  const std::string index = text.substr(0, prefix.size()) == prefix ? text.substr(prefix.size())
                                                                    : std::string();
  int device = -1;
  if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos &&
      absl::SimpleAtoi(index, &device)) {
    return ExpertDevice{device};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", text, "' is not cpu, cuda or cuda:N"));
}

std::string ExpertDeviceName(const ExpertDevice& device) {
  return device.cuda < 0 ? "cpu" : absl::StrCat("cuda:", device.cuda);
}

absl::StatusOr<std::unique_ptr<DeviceExperts>> MakeDeviceExperts(const ExpertDevice& device) {
  if (device.cuda < 0) return std::unique_ptr<DeviceExperts>();
#ifdef K3SERVE_CUDA
  return MakeGpuDeviceExperts(device.cuda);
#else
  return absl::UnavailableError(absl::StrCat(
      "--device ", ExpertDeviceName(device),
      ": this k3serve was built without the CUDA Toolkit (docs/GPU.md)"));
#endif
}

}  // namespace k3
