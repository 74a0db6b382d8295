// CliFlags: the `--name value` / `--name=value` / `--switch` flags of one k3serve subcommand.
// Every flag a subcommand reads must be declared; anything else is an error naming the flag, so a
// typo never silently falls back to a default.
#ifndef K3SERVE_TOOLS_CLI_FLAGS_H_
#define K3SERVE_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

// The flags every tier's node process takes: --coordinator HOST:PORT and --model DIR (required),
// --host, --port (0 picks a free one) and --metrics-port (-1: no metrics endpoint).
struct NodeFlags {
  std::string coordinator;
  std::string model;
  std::string host;
  int port = 0;
  int metrics_port = -1;
};

class CliFlags {
 public:
  // The names ReadNodeFlags reads, to add to a node subcommand's accepted flags.
  static std::set<std::string> WithNodeFlags(std::set<std::string> valued);
  // `valued` flags take a value; `switches` take none. args excludes the program and subcommand.
  static absl::StatusOr<CliFlags> Parse(const std::vector<std::string>& args,
                                        const std::set<std::string>& valued,
                                        const std::set<std::string>& switches = {});

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  absl::StatusOr<std::string> String(const std::string& name) const;  // required
  std::string StringOr(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;
  // Comma-separated integers, e.g. "1,2,3".
  absl::StatusOr<std::vector<int32_t>> IntList(const std::string& name) const;
  // Fills `node` from the node flags; `node->host` keeps its value when --host is absent.
  absl::Status ReadNodeFlags(NodeFlags* node) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace k3

#endif  // K3SERVE_TOOLS_CLI_FLAGS_H_
