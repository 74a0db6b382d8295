// Writing a small whole file (a config.json, a checkpoint index, a tokenizer's files) in one call.
//
// Thread-safety: a pure function of its arguments and the file system.
#ifndef K3SERVE_BASE_TEXT_FILE_H_
#define K3SERVE_BASE_TEXT_FILE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace k3 {

// Writes `contents` to `path` byte for byte, replacing any file there (not atomically: a failed
// write can leave part of it). InternalError "cannot write <path>" when the file cannot be opened
// or written.
absl::Status WriteTextFile(const std::string& path, std::string_view contents);

}  // namespace k3

#endif  // K3SERVE_BASE_TEXT_FILE_H_
