// A benchmark's scratch folder for checkpoints and logs.
#ifndef K3SERVE_BENCH_WORK_DIR_H_
#define K3SERVE_BENCH_WORK_DIR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace k3 {

// Creates a new folder $TMPDIR/<prefix>-XXXXXX (/tmp without TMPDIR) and returns its path; the
// caller removes it when done.
absl::StatusOr<std::string> MakeBenchWorkDir(std::string_view prefix);

}  // namespace k3

#endif  // K3SERVE_BENCH_WORK_DIR_H_
