#include "cluster/nccl_unique_id.h"

#ifdef K3SERVE_CUDA
#include "cluster/nccl_transport.h"
#endif

namespace k3 {

std::function<absl::StatusOr<std::string>()> NcclUniqueIdSource() {
#ifdef K3SERVE_CUDA
  return [] { return NcclTransport::NewUniqueId(); };
#else
  return nullptr;
#endif
}

}  // namespace k3
