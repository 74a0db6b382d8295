// Conversions between absl::Status (used inside k3serve) and grpc::Status (on the wire). The two
// share their numeric codes, so a code survives a round trip unchanged.
#ifndef K3SERVE_CLUSTER_GRPC_STATUS_H_
#define K3SERVE_CLUSTER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace k3 {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace k3

#endif  // K3SERVE_CLUSTER_GRPC_STATUS_H_
