// Where this build has NCCL (the CUDA Toolkit was found), a source of fresh NCCL unique ids
// (NcclTransport::NewUniqueId) for the coordinator's device channels; without it, null. Kept
// apart from cluster/nccl_transport.h, which exists in CUDA builds only, so that its callers
// build either way.
#ifndef K3SERVE_CLUSTER_NCCL_UNIQUE_ID_H_
#define K3SERVE_CLUSTER_NCCL_UNIQUE_ID_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace k3 {

// NcclTransport::NewUniqueId in a CUDA build (works without a GPU); null otherwise.
std::function<absl::StatusOr<std::string>()> NcclUniqueIdSource();

}  // namespace k3

#endif  // K3SERVE_CLUSTER_NCCL_UNIQUE_ID_H_
