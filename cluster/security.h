// The security of k3serve's gRPC endpoints: TLS credentials from the TLS flags
// (cluster/command_line.h) for servers and clients, and the public API's optional bearer token.
//
// TLS: without any TLS flag every server and client is plaintext. With them a server serves its
// certificate (--tls-cert, --tls-key) and, given --tls-ca, requires every client to show a
// certificate signed by it (mutual TLS); a client verifies the server's certificate with --tls-ca
// (the system's roots without it) and shows its own certificate when it has one. Files are read
// and checked once, when the credentials are made: a missing or unreadable file, or one that does
// not hold the PEM block its flag needs, is INVALID_ARGUMENT naming the flag and the file.
//
// Bearer token: a client sends "authorization: Bearer <token>" metadata (HTTP/2 headers are lower
// case); the server compares it with its own in time independent of where they differ.
//
// Thread-safety: the functions are thread-safe; a ClientTls is immutable once made and may be
// shared by any number of threads and channels.
#ifndef K3SERVE_CLUSTER_SECURITY_H_
#define K3SERVE_CLUSTER_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/command_line.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace k3 {

// How a gRPC client of the cluster dials: plaintext when default-constructed.
class ClientTls {
 public:
  ClientTls() = default;

  // A channel to `address` with `arguments` (plus the expected server name, if set; else
  // `default_server_name` when not empty, for an address found by resolving that name).
  std::shared_ptr<grpc::Channel> Connect(const std::string& address,
                                         grpc::ChannelArguments arguments = {},
                                         const std::string& default_server_name = "") const;

  bool secure() const { return credentials_ != nullptr; }

 private:
  friend absl::StatusOr<ClientTls> LoadClientTls(const TlsFlags& flags);
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // null: plaintext
  std::string server_name_;
};

// The credentials of a client: plaintext without TLS flags; INVALID_ARGUMENT for a bad file or
// for --tls-cert without --tls-key (or the reverse).
absl::StatusOr<ClientTls> LoadClientTls(const TlsFlags& flags);

// The credentials of a server: plaintext without TLS flags; with any, --tls-cert and --tls-key
// are required (INVALID_ARGUMENT otherwise, or for a bad file), and --tls-ca makes client
// certificates required and verified.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsFlags& flags);

// The metadata key of the bearer token.
inline constexpr char kAuthorizationMetadata[] = "authorization";

// Reads a token file (`flag` names it in errors): its contents without surrounding whitespace.
// INVALID_ARGUMENT when it cannot be read or is empty.
absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path);

// a == b, taking time that depends on the lengths only, not on where the bytes differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// OK when `authorization` is "Bearer <expected>"; UNAUTHENTICATED otherwise, saying whether the
// token was missing or wrong (never echoing it). `expected` empty: always OK.
absl::Status CheckBearer(absl::string_view expected, absl::string_view authorization);

// Adds "authorization: Bearer <token>" to a call; nothing for an empty token.
void AddBearer(const std::string& token, grpc::ClientContext* context);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_SECURITY_H_
