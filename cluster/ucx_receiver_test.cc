// UcxReceiver's three ways in (lent in place, copied, fetched) against ucx_transport.h's
// "Receiving in place" rules. The eager cases call OnMessage the way UCX does, with buffers the
// test owns; the rendezvous cases send through a real worker to itself.
#include "cluster/ucx_receiver.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/ucx_worker.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

constexpr uint64_t kToken = 0x1234567890abcdefull;
constexpr uint32_t kShortHeader = 1;  // not a token: such messages are dropped
constexpr PeerId kPeer = 7;
constexpr unsigned kAmId = 0x51;

// Stands in for UCX's receive buffers: 16-byte aligned.
struct Buffer {
  alignas(16) char bytes[64] = {};
};

ucp_am_recv_param_t Param(uint64_t recv_attr) {
  ucp_am_recv_param_t param = {};
  param.recv_attr = recv_attr;
  return param;
}

// Frees lent buffers after Retire: here, writes down which.
class RecordingRetiree final : public BufferLender::Retiree {
 public:
  explicit RecordingRetiree(std::vector<void*>* released) : released_(released) {}
  void Release(void* buffer) override { released_->push_back(buffer); }

 private:
  std::vector<void*>* const released_;
};

// A worker sending to itself, with every message forced to rendezvous.
class SelfLoop {
 public:
  explicit SelfLoop(UcxReceiver* receiver) {
    absl::StatusOr<UcxWorker> ucx = CreateUcxWorker({}, kAmId, &UcxReceiver::OnMessage, receiver);
    EXPECT_TRUE(ucx.ok()) << ucx.status();
    if (!ucx.ok()) return;
    ucx_ = *ucx;
    receiver->set_worker(ucx_.worker);
    absl::StatusOr<std::string> address = UcxWorkerAddress(ucx_.worker);
    EXPECT_TRUE(address.ok()) << address.status();
    if (!address.ok()) return;
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(address->data());
    EXPECT_EQ(ucp_ep_create(ucx_.worker, &params, &ep_), UCS_OK);
  }

  ~SelfLoop() {
    if (ep_ != nullptr) {
      ucp_request_param_t param = {};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      Wait(ucp_ep_close_nbx(ep_, &param));
    }
    if (ucx_.worker != nullptr) DestroyUcxWorker(ucx_);
  }

  bool ok() const { return ep_ != nullptr; }

  // Sends `data` after `header` by rendezvous; returns once the send completed (the receiver
  // fetched the data).
  void Send(const void* header, size_t header_length, const std::string& data) {
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_RNDV;
    Wait(ucp_am_send_nbx(ep_, kAmId, header, header_length, data.data(), data.size(), &param));
  }

  void Progress() { ucp_worker_progress(ucx_.worker); }

 private:
  void Wait(ucs_status_ptr_t request) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (UCS_PTR_IS_PTR(request) && ucp_request_check_status(request) == UCS_INPROGRESS &&
           absl::Now() < deadline) {
      ucp_worker_progress(ucx_.worker);
    }
    if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  }

  UcxWorker ucx_;
  ucp_ep_h ep_ = nullptr;
};

class UcxReceiverTest : public ::testing::Test {
 protected:
  UcxReceiverTest() { inbox_.Bind(kToken, kPeer); }

  // What UCX's callback would be told about an eager message at `data`.
  ucs_status_t Eager(const void* header, size_t header_length, char* data, size_t length,
                     uint64_t recv_attr) {
    ucp_am_recv_param_t param = Param(recv_attr);
    return UcxReceiver::OnMessage(&receiver_, header, header_length, data, length, &param);
  }

  Received ReceiveNow() {
    absl::StatusOr<Received> received = inbox_.Receive(absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(received.ok()) << received.status();
    return received.ok() ? *std::move(received) : Received();
  }

  Inbox inbox_;
  UcxReceiver receiver_{&inbox_};
};

TEST_F(UcxReceiverTest, AnAlignedBufferUcxLetsUsKeepIsLentInPlace) {
  Buffer buffer;
  memcpy(buffer.bytes, "in place", 8);
  // UCS_INPROGRESS: UCX must not reuse the buffer until it is released.
  EXPECT_EQ(Eager(&kToken, sizeof(kToken), buffer.bytes, 8, UCP_AM_RECV_ATTR_FLAG_DATA),
            UCS_INPROGRESS);
  Received received = ReceiveNow();
  EXPECT_EQ(received.from, kPeer);
  EXPECT_TRUE(received.bytes.lent());
  EXPECT_EQ(received.bytes.data(), buffer.bytes);
  EXPECT_EQ(received.bytes.size(), 8u);
  // Given back once the borrower lets go (to a retiree: there is no worker to release it to).
  std::vector<void*> released;
  receiver_.Retire(std::make_unique<RecordingRetiree>(&released));
  EXPECT_TRUE(released.empty());
  received = Received();
  EXPECT_EQ(released, std::vector<void*>{buffer.bytes});
}

TEST_F(UcxReceiverTest, AMisalignedOrBorrowedBufferIsCopied) {
  Buffer buffer;
  memcpy(buffer.bytes + 4, "four off", 8);
  memcpy(buffer.bytes + 32, "borrowed", 8);
  // Aligned to 4 only: lending needs 8.
  EXPECT_EQ(Eager(&kToken, sizeof(kToken), buffer.bytes + 4, 8, UCP_AM_RECV_ATTR_FLAG_DATA),
            UCS_OK);
  // Aligned, but UCX takes the buffer back when the callback returns (no FLAG_DATA).
  EXPECT_EQ(Eager(&kToken, sizeof(kToken), buffer.bytes + 32, 8, 0), UCS_OK);
  memset(buffer.bytes, 'x', sizeof(buffer.bytes));  // the copies do not see this
  Received first = ReceiveNow();
  EXPECT_FALSE(first.bytes.lent());
  EXPECT_EQ(first.bytes, "four off");
  Received second = ReceiveNow();
  EXPECT_FALSE(second.bytes.lent());
  EXPECT_EQ(second.bytes, "borrowed");
}

TEST_F(UcxReceiverTest, AMessageWithoutATokenHeaderIsDropped) {
  Buffer buffer;
  EXPECT_EQ(Eager(&kShortHeader, sizeof(kShortHeader), buffer.bytes, 8, UCP_AM_RECV_ATTR_FLAG_DATA),
            UCS_OK);
  EXPECT_EQ(inbox_.Queued(), 0u);
  EXPECT_EQ(inbox_.Receive(absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(UcxReceiverTest, ARendezvousMessageIsFetchedWhole) {
  SelfLoop loop(&receiver_);
  ASSERT_TRUE(loop.ok());
  std::string message(300000, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 7 + i / 256);
  loop.Send(&kToken, sizeof(kToken), message);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((receiver_.Fetching() || inbox_.Queued() == 0) && absl::Now() < deadline) {
    loop.Progress();
  }
  EXPECT_FALSE(receiver_.Fetching());
  Received received = ReceiveNow();
  EXPECT_EQ(received.from, kPeer);
  EXPECT_FALSE(received.bytes.lent());
  EXPECT_TRUE(received.bytes == message);
}

TEST_F(UcxReceiverTest, ARendezvousMessageWithoutATokenIsFetchedAndDropped) {
  SelfLoop loop(&receiver_);
  ASSERT_TRUE(loop.ok());
  loop.Send(&kShortHeader, sizeof(kShortHeader), std::string(300000, 'm'));
  for (int i = 0; i < 100; ++i) loop.Progress();
  EXPECT_FALSE(receiver_.Fetching());
  EXPECT_EQ(inbox_.Queued(), 0u);
}

}  // namespace
}  // namespace k3
