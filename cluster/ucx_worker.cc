#include "cluster/ucx_worker.h"

#include <cstdlib>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

// UCX's configuration (from its environment) with `settings` applied; the caller releases it.
absl::StatusOr<ucp_config_t*> ReadUcxConfig(const UcxWorkerSettings& settings) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    return absl::InternalError(absl::StrCat("ucp_config_read: ", ucs_status_string(status)));
  }
  if (!settings.tls.empty()) status = ucp_config_modify(config, "TLS", settings.tls.c_str());
  if (status == UCS_OK && !settings.net_devices.empty()) {
    status = ucp_config_modify(config, "NET_DEVICES", settings.net_devices.c_str());
  }
  if (status == UCS_OK && !settings.eager_limit.empty() && getenv("UCX_RNDV_THRESH") == nullptr) {
    status = ucp_config_modify(config, "RNDV_THRESH", settings.eager_limit.c_str());
  }
  if (status != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX options tls='", settings.tls, "' net_devices='", settings.net_devices,
        "' eager_limit='", settings.eager_limit, "': ", ucs_status_string(status)));
  }
  return config;
}

// Makes `worker` hand active messages `am_id` to `on_message` and reads its event fd.
ucs_status_t SetUpWorker(UcxWorker& ucx, unsigned am_id, ucp_am_recv_callback_t on_message,
                         void* arg) {
  ucp_am_handler_param_t handler = {};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = am_id;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  handler.cb = on_message;
  handler.arg = arg;
  ucs_status_t status = ucp_worker_set_am_recv_handler(ucx.worker, &handler);
  if (status == UCS_OK) status = ucp_worker_get_efd(ucx.worker, &ucx.event_fd);
  return status;
}

}  // namespace

absl::StatusOr<UcxWorker> CreateUcxWorker(const UcxWorkerSettings& settings, unsigned am_id,
                                          ucp_am_recv_callback_t on_message, void* arg) {
  K3_ASSIGN_OR_RETURN(ucp_config_t * config, ReadUcxConfig(settings));
  UcxWorker ucx;
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t status = ucp_init(&params, config, &ucx.context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    return absl::UnavailableError(
        absl::StrCat("ucp_init (tls='", settings.tls, "'): ", ucs_status_string(status)));
  }
  ucp_worker_params_t worker_params = {};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  worker_params.events = UCP_WAKEUP_RX | UCP_WAKEUP_TX;
  status = ucp_worker_create(ucx.context, &worker_params, &ucx.worker);
  if (status != UCS_OK) {
    ucp_cleanup(ucx.context);
    return absl::UnavailableError(absl::StrCat("ucp_worker_create: ", ucs_status_string(status)));
  }
  status = SetUpWorker(ucx, am_id, on_message, arg);
  if (status != UCS_OK) {
    DestroyUcxWorker(ucx);
    return absl::InternalError(absl::StrCat("UCX worker setup: ", ucs_status_string(status)));
  }
  return ucx;
}

void DestroyUcxWorker(const UcxWorker& ucx) {
  if (ucx.worker != nullptr) ucp_worker_destroy(ucx.worker);
  if (ucx.context != nullptr) ucp_cleanup(ucx.context);
}

absl::StatusOr<std::string> UcxWorkerAddress(ucp_worker_h worker) {
  ucp_address_t* address = nullptr;
  size_t size = 0;
  ucs_status_t status = ucp_worker_get_address(worker, &address, &size);
  if (status != UCS_OK) {
    return absl::InternalError(absl::StrCat("ucp_worker_get_address: ", ucs_status_string(status)));
  }
  std::string bytes(reinterpret_cast<const char*>(address), size);
  ucp_worker_release_address(worker, address);
  return bytes;
}

bool SharedMemoryEnabled(std::string tls) {
  if (tls.empty()) {
    const char* env = getenv("UCX_TLS");
    tls = env == nullptr ? "" : env;
  }
  if (tls.empty()) return true;
  bool exclude = tls[0] == '^';
  if (exclude) tls.erase(0, 1);
  std::set<std::string> names;
  for (absl::string_view name : absl::StrSplit(tls, ',')) names.insert(std::string(name));
  if (exclude)
    return !(names.count("sm") || names.count("shm") ||
             (names.count("posix") && names.count("sysv")));
  for (const char* name : {"all", "sm", "shm", "posix", "sysv"}) {
    if (names.count(name)) return true;
  }
  return false;
}

}  // namespace k3
