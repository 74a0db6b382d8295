#include "cluster/ucx_receiver.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "glog/logging.h"

namespace k3 {
namespace {

// Received buffers are lent only at addresses aligned for any scalar a message holds.
constexpr uintptr_t kLentAlignment = alignof(double);

}  // namespace

struct UcxReceiver::Fetch {
  UcxReceiver* receiver;
  Inbox::Slot slot;  // null for a malformed message, dropped once fetched
  std::string data;
};

ucs_status_t UcxReceiver::OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxReceiver*>(arg);
  uint64_t token = 0;
  const bool valid = header_length == sizeof(token);
  if (valid) memcpy(&token, header, sizeof(token));
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    self->StartFetch(valid, token, data, length);
    return UCS_OK;
  }
  if (!valid) {
    LOG(WARNING) << "UCX transport: dropped a message with a " << header_length << "-byte header";
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0 &&
      reinterpret_cast<uintptr_t>(data) % kLentAlignment == 0) {
    // Read where UCX put it (ucx_transport.h, "Receiving in place").
    self->inbox_->Deliver(token, self->lender_.Lend(static_cast<const char*>(data), length));
    return UCS_INPROGRESS;
  }
  self->inbox_->Deliver(token, std::string(static_cast<const char*>(data), length));
  return UCS_OK;
}

void UcxReceiver::StartFetch(bool valid, uint64_t token, void* data, size_t length) {
  // The data is still at the sender: fetch it into a buffer of its size. Malformed messages are
  // fetched too (the sender's request completes) and then dropped.
  auto* fetch =
      new Fetch{this, valid ? inbox_->Reserve(token) : nullptr, std::string(length, '\0')};
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = &UcxReceiver::OnFetched;
  param.user_data = fetch;
  ucs_status_ptr_t request =
      ucp_am_recv_data_nbx(worker_, data, fetch->data.data(), length, &param);
  if (UCS_PTR_IS_PTR(request)) {
    fetches_.insert(fetch);
    return;
  }
  if (fetch->slot != nullptr) {
    if (request == nullptr) {
      inbox_->Fill(fetch->slot, std::move(fetch->data));
    } else {
      inbox_->Drop(fetch->slot);
    }
  }
  delete fetch;
}

void UcxReceiver::OnFetched(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* fetch = static_cast<Fetch*>(user_data);
  UcxReceiver* self = fetch->receiver;
  self->fetches_.erase(fetch);
  ucp_request_free(request);
  if (fetch->slot != nullptr) {
    if (status == UCS_OK) {
      fetch->data.resize(length);
      self->inbox_->Fill(fetch->slot, std::move(fetch->data));
    } else {
      self->inbox_->Drop(fetch->slot);
    }
  }
  delete fetch;
}

void UcxReceiver::ReleaseReturned() {
  if (!lender_.AnyReturned()) return;
  for (void* data : lender_.TakeReturned()) ucp_am_data_release(worker_, data);
}

void UcxReceiver::Retire(std::unique_ptr<BufferLender::Retiree> retiree) {
  lender_.Retire(std::move(retiree));
}

void UcxReceiver::ForgetFetches() {
  for (Fetch* fetch : fetches_) delete fetch;
  fetches_.clear();
}

}  // namespace k3
