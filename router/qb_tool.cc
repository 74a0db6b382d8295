#include "router/qb_tool.h"

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the score and bias files are little-endian float32, read in place");

// Reads exactly `count` float32 values from `path`.
absl::StatusOr<std::vector<float>> ReadFloats(const std::string& path, int64_t count,
                                              const char* what) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    int error = errno;
    std::string message =
        absl::StrCat("cannot open ", what, " file ", path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  std::vector<float> values(static_cast<size_t>(count));
  size_t read = std::fread(values.data(), sizeof(float), values.size(), file);
  // One more byte than expected means the file is too long.
  char extra;
  bool longer = std::fread(&extra, 1, 1, file) == 1;
  std::fseek(file, 0, SEEK_END);
  long size = std::ftell(file);
  std::fclose(file);
  if (read != values.size() || longer) {
    return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " holds ", size,
                                                   " bytes; expected ", count * 4, " (", count,
                                                   " float32 values)"));
  }
  return values;
}

}  // namespace

absl::Status RunQbTool(const QbToolOptions& options, std::ostream& out) {
  if (options.scores_path.empty()) return absl::InvalidArgumentError("--scores is required");
  if (options.tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens must be >= 1, got ", options.tokens));
  }
  if (options.top_k < 1 || options.experts <= options.top_k) {
    return absl::InvalidArgumentError(absl::StrCat("need --experts > --top-k >= 1, got --experts ",
                                                   options.experts, " and --top-k ",
                                                   options.top_k));
  }
  if (!options.exact && options.bins < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--bins must be >= 1, got ", options.bins));
  }
  if (options.tokens > std::numeric_limits<int64_t>::max() / 4 / options.experts) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens ", options.tokens, " × --experts ",
                                                   options.experts, " is too large"));
  }
  const int n = options.experts;
  const int64_t t = options.tokens;
  K3_ASSIGN_OR_RETURN(std::vector<float> scores, ReadFloats(options.scores_path, t * n, "scores"));
  for (int64_t i = 0; i < t * n; ++i) {
    float s = scores[i];
    if (!(s >= 0.0f && s <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("scores file ", options.scores_path,
                                                     ": score [", i / n, ", ", i % n, "] = ", s,
                                                     " is not a sigmoid score in [0, 1]"));
    }
  }
  std::vector<float> bias(n, 0.0f);
  if (!options.bias_path.empty()) {
    K3_ASSIGN_OR_RETURN(std::vector<float> read, ReadFloats(options.bias_path, n, "bias"));
    bias = std::move(read);
    for (int j = 0; j < n; ++j) {
      if (!std::isfinite(bias[j])) {
        return absl::InvalidArgumentError(absl::StrCat("bias file ", options.bias_path, ": bias[",
                                                       j, "] = ", bias[j], " is not finite"));
      }
    }
  }

  std::vector<float> estimate;
  double maxvio_old;
  if (options.exact) {
    estimate = ExactQbBias(scores.data(), t, n, options.top_k, bias);
    maxvio_old = MaxVio(RouteLoads(scores.data(), t, n, options.top_k, bias));
  } else {
    K3_ASSIGN_OR_RETURN(QbLayerStatistics stats,
                        QbLayerStatistics::Create(0, options.top_k, bias, options.bins));
    stats.Record(scores.data(), t);
    K3_ASSIGN_OR_RETURN(std::vector<float> hist, stats.EstimateBias());
    estimate = std::move(hist);
    maxvio_old = stats.MaxVio();
  }
  std::vector<float> centred = CenterBias(estimate);
  double maxvio_new = MaxVio(RouteLoads(scores.data(), t, n, options.top_k, centred));

  std::string text;
  // %.9g round-trips a float32.
  for (float b : centred) absl::StrAppendFormat(&text, "%.9g\n", b);
  absl::StrAppendFormat(&text, "maxvio_old %.6f\nmaxvio_new %.6f\n", maxvio_old, maxvio_new);
  out << text;
  return absl::OkStatus();
}

}  // namespace k3
