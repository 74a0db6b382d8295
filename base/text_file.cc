#include "base/text_file.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace k3 {

absl::Status WriteTextFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace k3
