#include "cluster/security.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "grpcpp/create_channel.h"

namespace k3 {
namespace {

constexpr char kBearer[] = "Bearer ";

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read the file (", std::strerror(errno), ")"));
  }
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// The file's contents when it holds a PEM block whose label ends with `label` ("CERTIFICATE",
// "PRIVATE KEY": RSA, EC and PKCS#8 keys alike).
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path,
                                    const std::string& label) {
  K3_ASSIGN_OR_RETURN(std::string pem, ReadFile(flag, path));
  const size_t begin = pem.find("-----BEGIN ");
  const size_t end = pem.find(absl::StrCat(label, "-----"), begin == std::string::npos ? 0 : begin);
  if (begin == std::string::npos || end == std::string::npos ||
      pem.find("-----END ", end) == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM file with a ", label, " block"));
  }
  return pem;
}

// --tls-cert and --tls-key, both or neither.
absl::Status CheckPair(const TlsFlags& flags) {
  if (flags.cert.empty() != flags.key.empty()) {
    return absl::InvalidArgumentError(flags.cert.empty() ? "--tls-key needs --tls-cert"
                                                         : "--tls-cert needs --tls-key");
  }
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<grpc::Channel> ClientTls::Connect(const std::string& address,
                                                  grpc::ChannelArguments arguments,
                                                  const std::string& default_server_name) const {
  if (credentials_ == nullptr) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
  }
  const std::string& name = server_name_.empty() ? default_server_name : server_name_;
  if (!name.empty()) arguments.SetSslTargetNameOverride(name);
  return grpc::CreateCustomChannel(address, credentials_, arguments);
}

absl::StatusOr<ClientTls> LoadClientTls(const TlsFlags& flags) {
  ClientTls tls;
  if (!flags.enabled()) return tls;
  K3_RETURN_IF_ERROR(CheckPair(flags));
  grpc::SslCredentialsOptions options;
  if (!flags.ca.empty()) {
    K3_ASSIGN_OR_RETURN(std::string ca, ReadPem("--tls-ca", flags.ca, "CERTIFICATE"));
    options.pem_root_certs = std::move(ca);
  }
  if (!flags.cert.empty()) {
    K3_ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls-cert", flags.cert, "CERTIFICATE"));
    K3_ASSIGN_OR_RETURN(std::string key, ReadPem("--tls-key", flags.key, "PRIVATE KEY"));
    options.pem_cert_chain = std::move(cert);
    options.pem_private_key = std::move(key);
  }
  tls.credentials_ = grpc::SslCredentials(options);
  tls.server_name_ = flags.server_name;
  return tls;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsFlags& flags) {
  if (!flags.enabled()) return nullptr;  // GrpcServerOptions: null is plaintext
  K3_RETURN_IF_ERROR(CheckPair(flags));
  if (flags.cert.empty()) {
    return absl::InvalidArgumentError("--tls-ca on a server needs --tls-cert and --tls-key");
  }
  K3_ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls-cert", flags.cert, "CERTIFICATE"));
  K3_ASSIGN_OR_RETURN(std::string key, ReadPem("--tls-key", flags.key, "PRIVATE KEY"));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!flags.ca.empty()) {
    K3_ASSIGN_OR_RETURN(std::string ca, ReadPem("--tls-ca", flags.ca, "CERTIFICATE"));
    options.pem_root_certs = std::move(ca);
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string contents, ReadFile(flag, path));
  std::string token(absl::StripAsciiWhitespace(contents));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is empty"));
  return token;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of the longer one is read whatever the contents; only the lengths leak.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  return diff == 0;
}

absl::Status CheckBearer(absl::string_view expected, absl::string_view authorization) {
  if (expected.empty()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError("missing token: send 'authorization: Bearer <token>'");
  }
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, kBearer) || !ConstantTimeEquals(token, expected)) {
    return absl::UnauthenticatedError("incorrect token");
  }
  return absl::OkStatus();
}

void AddBearer(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata(kAuthorizationMetadata, absl::StrCat(kBearer, token));
}

}  // namespace k3
