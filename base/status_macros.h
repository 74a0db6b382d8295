// Status propagation (K3_RETURN_IF_ERROR, K3_ASSIGN_OR_RETURN) and message building.
#ifndef K3SERVE_BASE_STATUS_MACROS_H_
#define K3SERVE_BASE_STATUS_MACROS_H_

#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace k3 {

// Debian's Abseil is built with its own string_view class, so absl::StrCat does not take a
// std::string_view; this bridges the two for messages.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace k3

#define K3_BASE_CONCAT_INNER_(a, b) a##b
#define K3_BASE_CONCAT_(a, b) K3_BASE_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define K3_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status k3_status_ = (expr);           \
    if (!k3_status_.ok()) return k3_status_;      \
  } while (0)

// `lhs = *expr` for a StatusOr `expr`, or returns its status.
#define K3_ASSIGN_OR_RETURN(lhs, expr) \
  K3_ASSIGN_OR_RETURN_IMPL_(K3_BASE_CONCAT_(k3_statusor_, __LINE__), lhs, expr)
#define K3_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                              \
  if (!var.ok()) return var.status();             \
  lhs = std::move(*var)

#endif  // K3SERVE_BASE_STATUS_MACROS_H_
