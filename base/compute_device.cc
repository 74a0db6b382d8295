#include "base/compute_device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace k3 {

absl::StatusOr<ComputeDevice> ParseComputeDevice(const std::string& text) {
  if (text == "cpu") return ComputeDevice{};
  if (text == "cuda") return ComputeDevice{0};
  const std::string prefix = "cuda:";
  const std::string index =
      text.substr(0, prefix.size()) == prefix ? text.substr(prefix.size()) : std::string();
  int device = -1;
  if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos &&
      absl::SimpleAtoi(index, &device)) {
    return ComputeDevice{device};
  }
  return absl::InvalidArgumentError(absl::StrCat("device '", text, "' is not cpu, cuda or cuda:N"));
}

std::string ComputeDeviceName(const ComputeDevice& device) {
  return device.cuda < 0 ? "cpu" : absl::StrCat("cuda:", device.cuda);
}

}  // namespace k3
