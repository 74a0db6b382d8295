// MakeTestCerts: a throw-away PKI for TLS tests, made with the `openssl` command at test time:
// a CA, a certificate for 127.0.0.1 and localhost signed by it (usable as server and as client
// certificate, as every node of a cluster uses one), and an unrelated CA that signed nothing
// the servers trust. Keys are P-256 (fast to make).
#ifndef K3SERVE_CLUSTER_TEST_CERTS_H_
#define K3SERVE_CLUSTER_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "cluster/command_line.h"

namespace k3 {

struct TestCerts {
  std::string dir;
  std::string ca;        // PEM, the CA that signed `cert`
  std::string cert;      // PEM, CN=localhost, SAN IP:127.0.0.1 and DNS:localhost
  std::string key;       // PEM, `cert`'s key
  std::string other_ca;  // PEM, a CA that signed none of these

  // The TLS flags of a cluster node (mutual TLS): cert, key and ca.
  TlsFlags Mutual() const { return {cert, key, ca, ""}; }
};

// Writes the files under `dir` (created if missing). UNAVAILABLE when `openssl` is not on the
// PATH (tests then GTEST_SKIP with that message); INTERNAL naming the command when it fails.
absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir);

}  // namespace k3

#endif  // K3SERVE_CLUSTER_TEST_CERTS_H_
