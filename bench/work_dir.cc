#include "bench/work_dir.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace k3 {

absl::StatusOr<std::string> MakeBenchWorkDir(std::string_view prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", std::string(prefix), "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a work folder ", pattern, ": ", std::strerror(errno)));
  }
  return pattern;
}

}  // namespace k3
