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

class CliFlags {
 public:
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

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace k3

#endif  // K3SERVE_TOOLS_CLI_FLAGS_H_
