// The Transport between processes, over UCX active messages (UCX 1.13): shared memory between
// processes on one host, TCP across hosts (whatever UCX_TLS allows; its default picks both).
// Messages of any size go through ucp_am_send_nbx; large ones arrive by rendezvous
// (ucp_am_recv_data_nbx into a buffer of the announced size).
//
// Liveness. Every Transport listens on a plain TCP socket, and each Connect opens one to the peer
// (one more per direction when both sides connect). The kernel closes it the moment a process dies,
// even on SIGKILL, so its EOF without a goodbye is the failure signal; it works for shared memory,
// where UCX 1.13 refuses peer-failure mode (UCP_ERR_HANDLING_MODE_PEER) on posix endpoints
// (the socket's frames and calls: liveness_socket.h).
// Keepalive probes (about 5 s) cover a host that vanishes. Endpoints to peers that cannot be on
// shared memory (another host or network namespace, or UCX_TLS without shared memory) are created
// in peer-failure mode, so UCX reports a broken link too and cancels pending sends.
//
// Graceful close is a handshake on the same socket, so neither side reports a failure: the closer
// flushes its endpoint (everything it sent has arrived), sends BYE; the other side stops sending,
// flush-closes its endpoint and answers BYE_ACK; then the closer closes its endpoint.
//
// Progress. One thread at a time drives the UCX worker and the sockets ("holds the baton"):
// UCP_FEATURE_WAKEUP's event fd and the sockets go to poll(), so an idle Transport sleeps (after
// at most `busy_poll` of polling). A thread blocked in Receive drives itself, so the message it
// waits for wakes it directly; otherwise a progress thread drives (it steps aside while receivers
// drive, and for a couple of milliseconds after, so a receive loop keeps the baton: drive_baton.h).
// Every UCX call is made under one mutex (worker in UCS_THREAD_MODE_SERIALIZED, ucx_worker.h);
// Send calls ucp_am_send_nbx directly, so a small message costs no thread hop on the sending side
// either.
//
// Receiving in place. A message that arrived eagerly (UCX copied it into its own receive buffer)
// is handed out where it lies: Received::bytes borrows UCX's buffer, and destroying it gives the
// buffer back (ucp_am_data_release, done by the next thread that drives UCX). So a message's bytes
// are copied once, by UCX on the sending side, and token rows are not copied out of the transport.
// What UCX cannot lend (messages of a few dozen bytes, which take its short protocol; one-fragment
// messages over TCP) or hands out at an address that is not 8-byte aligned (moe_wire's in-place
// decoding needs 4) is copied into a std::string, and a rendezvous message is fetched straight into
// one. A buffer still borrowed when the Transport is destroyed keeps UCX's worker alive until it
// is given back; the last one destroys the worker (ucx_receiver.h; the books: buffer_lender.h).
//
// Memory. Sent messages are std::strings, so with glibc's default malloc every buffer of 128 KiB or
// more is a fresh mmap whose page faults cost more than the copy (3-10x slower rounds at 256 KiB on
// the CI VM). Processes that move large messages should raise the thresholds at start, before
// threads: mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30) (or the
// environment MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824), as
// bench/transport_bench does. Sends still in flight to a peer that died on shared memory are never
// completed by UCX 1.13 (a forced close does not cancel them there); their buffers are freed by
// Close.
//
// Thread-safety: all methods, from any threads (see transport.h).
#ifndef K3SERVE_CLUSTER_UCX_TRANSPORT_H_
#define K3SERVE_CLUSTER_UCX_TRANSPORT_H_

#include <poll.h>
#include <ucp/api/ucp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cluster/drive_baton.h"
#include "cluster/inbox.h"
#include "cluster/transport.h"
#include "cluster/ucx_address.h"
#include "cluster/ucx_peer_table.h"
#include "cluster/ucx_receiver.h"

namespace k3 {

struct UcxTransportOptions {
  // UCX transports, in UCX_TLS syntax ("posix,cma,self", "tcp", "^sysv"). Empty: UCX's own
  // setting (the UCX_TLS environment variable, else all).
  std::string tls;
  // Network devices for tcp, in UCX_NET_DEVICES syntax ("lo", "eth0"). Empty: UCX's own setting.
  // UCX otherwise uses every interface at once, which is several times slower on loopback.
  std::string net_devices;
  // IPv4 addresses advertised for the liveness socket. Empty: every IPv4 address of an interface
  // that is up (loopback is used only by peers in the same host and network namespace).
  std::vector<std::string> advertise_ips;
  // Connect's budget to reach the peer's liveness socket and shake hands.
  absl::Duration connect_timeout = absl::Seconds(3);
  // How long a graceful close waits for the peer's answer before closing anyway.
  absl::Duration close_timeout = absl::Seconds(2);
  // A thread waiting in Receive polls UCX this long before it sleeps in poll(): trades CPU time
  // for the wake-up latency (a sleeping receiver costs some 5-50 us a message on a VM). After the
  // first 5 us the spinning thread yields its core between polls, so it does not starve peers
  // when processes outnumber cores; it still burns an idle core for up to this long after each
  // message. Zero: sleep at once.
  absl::Duration busy_poll = absl::ZeroDuration();
  // Messages up to this size (UCX memory units: "256k", "1m"; empty: UCX's own choice) go
  // eagerly, copied through UCX's buffers, instead of by rendezvous (a handshake, then a
  // zero-copy transfer). The handshake is a round trip that needs the receiver to poll: on shared
  // memory a 32 KiB / 256 KiB ping-pong took 2.2x / 2.6x less time eager (bench/
  // run_transport_bench.sh). The UCX_RNDV_THRESH environment variable, when set, wins.
  std::string eager_limit;
};

class UcxTransport final : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(
      const UcxTransportOptions& options = UcxTransportOptions());
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string LocalAddress() const override;
  absl::Status Connect(PeerId peer, const std::string& address) override;
  void Disconnect(PeerId peer) override;
  absl::Status Send(PeerId peer, std::string message) override;
  absl::StatusOr<Received> Receive(absl::Time deadline) override;
  void Close() override;

  // Messages and events in the Inbox that Receive has not handed out yet (for tests).
  size_t QueuedForReceive() const { return inbox_.Queued(); }

 private:
  struct Conn;
  struct SendOp;
  struct CloseOp;

  explicit UcxTransport(const UcxTransportOptions& options);
  absl::Status Init();

  // Connect's steps. Whether `peer` may be bound to the process `token`; OK with *done when it
  // already is (checked before dialing and again after, since the lock is not held between).
  absl::Status CheckBindingLocked(PeerId peer, uint64_t token, bool* done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the liveness socket to `address` (the caller owns it); *where: the ip:port reached.
  absl::StatusOr<int> DialPeer(PeerId peer, const UcxAddress& address, bool same_host,
                               std::string* where);
  // Creates the endpoint and binds `peer` to it; takes `fd` (the liveness socket) only on success.
  absl::Status BindLocked(PeerId peer, const UcxAddress& address, bool same_host, int fd,
                          const std::string& where) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ProgressLoop();
  // Takes the baton for a Receive caller unless another thread keeps it; then drives once.
  bool TryDrive(absl::Time deadline);
  // Waits (poll) until something happens or `until`, and handles it; `spin` first polls UCX
  // without sleeping that long. Needs the baton.
  void DriveOnce(absl::Time until, absl::Duration spin);
  // Runs UCX until it has nothing to do, then closes endpoints of peers that failed meanwhile.
  // Returns whether anything happened.
  bool ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();
  void AcceptLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReadConnLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleFrameLocked(Conn& conn, uint32_t type, uint64_t token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ConnLostLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseConnLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseConnsOfLocked(uint64_t token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers a peer's BYE: stops sending, flush-closes the endpoint, then acknowledges.
  void PeerClosingLocked(UcxRemote& remote) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AcknowledgeByeLocked(UcxRemote& remote) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(UcxRemote& remote, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseEndpointLocked(UcxRemote& remote, bool force, bool acknowledge_when_done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts closing `ep` (force: without flushing, for an endpoint UCX reported or a failed peer).
  // True when UCX finishes later (OnCloseDone, which then answers `remote_to_acknowledge`'s BYE
  // unless it is null); false when the close is done already.
  bool StartEndpointCloseLocked(ucp_ep_h ep, bool force, UcxRemote* remote_to_acknowledge)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The graceful close handshake, as the closing side, with every remote in `remotes` at once.
  void CloseGracefully(const std::vector<UcxRemote*>& remotes);

  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnFlushDone(void* request, ucs_status_t status, void* user_data);
  static void OnCloseDone(void* request, ucs_status_t status, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const UcxTransportOptions options_;
  const uint64_t token_;
  std::string host_key_;
  std::string address_;
  Inbox inbox_;

  mutable absl::Mutex mu_;
  ucp_context_h context_ ABSL_GUARDED_BY(mu_) = nullptr;
  ucp_worker_h worker_ ABSL_GUARDED_BY(mu_) = nullptr;
  int worker_fd_ = -1;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  bool shared_memory_enabled_ = true;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Every remote process ever seen and the PeerIds bound to them (entries stay: endpoint
  // callbacks point at them).
  UcxPeerTable peers_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  uint64_t next_conn_serial_ ABSL_GUARDED_BY(mu_) = 1;
  // Operations UCX still owns; what is left at shutdown is freed here.
  std::set<SendOp*> sends_ ABSL_GUARDED_BY(mu_);
  int pending_closes_ ABSL_GUARDED_BY(mu_) = 0;
  // Turns the worker's active messages into inbox_'s deliveries; keeps the books of the receive
  // buffers it lends out as Received::bytes.
  UcxReceiver receiver_ ABSL_GUARDED_BY(mu_);
  // Endpoints of failed peers, force-closed after the current progress call returns.
  std::vector<ucp_ep_h> eps_to_force_close_ ABSL_GUARDED_BY(mu_);
  std::thread progress_thread_;

  // Who drives UCX and the sockets now (its lock is never held together with mu_).
  DriveBaton baton_;
  // Used only by the baton holder.
  std::vector<pollfd> poll_fds_;
  std::vector<uint64_t> poll_serials_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_UCX_TRANSPORT_H_
