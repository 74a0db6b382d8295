#include "tools/cli_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace k3 {

absl::StatusOr<CliFlags> CliFlags::Parse(const std::vector<std::string>& args,
                                         const std::set<std::string>& valued,
                                         const std::set<std::string>& switches) {
  CliFlags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (switches.count(name)) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      flags.values_[name] = "true";
      continue;
    }
    if (!valued.count(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!has_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    flags.values_[name] = value;
  }
  return flags;
}

absl::StatusOr<std::string> CliFlags::String(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return it->second;
}

std::string CliFlags::StringOr(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> CliFlags::Int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t value;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " wants an integer, got '", it->second, "'"));
  }
  return value;
}

absl::StatusOr<double> CliFlags::Double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double value;
  if (!absl::SimpleAtod(it->second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " wants a number, got '", it->second, "'"));
  }
  return value;
}

absl::StatusOr<std::vector<int32_t>> CliFlags::IntList(const std::string& name) const {
  absl::StatusOr<std::string> text = String(name);
  if (!text.ok()) return text.status();
  std::vector<int32_t> values;
  for (absl::string_view part : absl::StrSplit(*text, ',', absl::SkipWhitespace())) {
    int32_t value;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", part, "' is not an integer"));
    }
    values.push_back(value);
  }
  if (values.empty()) return absl::InvalidArgumentError(absl::StrCat("--", name, " is empty"));
  return values;
}

std::set<std::string> CliFlags::WithNodeFlags(std::set<std::string> valued) {
  valued.insert({"coordinator", "model", "host", "port", "metrics-port"});
  return valued;
}

absl::Status CliFlags::ReadNodeFlags(NodeFlags* node) const {
  absl::StatusOr<std::string> coordinator = String("coordinator");
  if (!coordinator.ok()) return coordinator.status();
  absl::StatusOr<std::string> model = String("model");
  if (!model.ok()) return model.status();
  absl::StatusOr<int64_t> port = Int("port", 0);
  if (!port.ok()) return port.status();
  absl::StatusOr<int64_t> metrics_port = Int("metrics-port", -1);
  if (!metrics_port.ok()) return metrics_port.status();
  if (*port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port is ", *port, "; must be in [0, 65535]"));
  }
  if (*metrics_port < -1 || *metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port is ", *metrics_port, "; must be -1 (none) or in [0, 65535]"));
  }
  node->coordinator = *coordinator;
  node->model = *model;
  node->host = StringOr("host", node->host);
  node->port = static_cast<int>(*port);
  node->metrics_port = static_cast<int>(*metrics_port);
  return absl::OkStatus();
}

}  // namespace k3
