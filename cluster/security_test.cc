// TLS credentials and bearer tokens (cluster/security.h), and a node's gRPC endpoint with TLS
// (NodeEndpoints, as every role starts it), against certificates made with openssl here.
#include "cluster/security.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/grpc_server.h"
#include "cluster/node_runtime.h"
#include "cluster/test_certs.h"
#include "gtest/gtest.h"

namespace k3 {
namespace {

std::string TmpDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  return base != nullptr ? base : "/tmp";
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = TmpDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestCerts> certs = MakeTestCerts(TmpDir() + "/certs");
    if (absl::IsUnavailable(certs.status())) GTEST_SKIP() << certs.status().message();
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
  }

  // A node's endpoints (no coordinator) on loopback with `tls`.
  absl::StatusOr<std::unique_ptr<NodeEndpoints>> StartNode(const TlsFlags& tls) {
    NodeEndpointsOptions options;
    options.flags.host = "127.0.0.1";
    options.flags.tls = tls;
    return NodeEndpoints::Start(std::move(options));
  }

  // The node's liveness through a client with `tls`.
  absl::StatusOr<bool> Check(const NodeEndpoints& node, const TlsFlags& tls) {
    absl::StatusOr<ClientTls> client = LoadClientTls(tls);
    if (!client.ok()) return client.status();
    return CheckServing(client->Connect(absl::StrCat("127.0.0.1:", node.port())), "",
                        absl::Seconds(5));
  }

  TestCerts certs_;
};

TEST(BearerTest, ComparesWholeTokens) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(CheckBearer("", "").ok());
  EXPECT_TRUE(CheckBearer("tok", "Bearer tok").ok());
  EXPECT_TRUE(absl::IsUnauthenticated(CheckBearer("tok", "")));
  EXPECT_TRUE(absl::IsUnauthenticated(CheckBearer("tok", "Bearer tok2")));
  EXPECT_TRUE(absl::IsUnauthenticated(CheckBearer("tok", "tok")));
  const absl::Status wrong = CheckBearer("tok", "Bearer guess");
  EXPECT_FALSE(absl::StrContains(wrong.message(), "guess")) << wrong;
}

TEST(BearerTest, TokenFiles) {
  absl::StatusOr<std::string> token = ReadTokenFile("--auth-token-file",
                                                    WriteFile("token", "  abc\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc");
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReadTokenFile("--auth-token-file", WriteFile("empty", "\n")).status()));
  const absl::Status missing = ReadTokenFile("--auth-token-file", "/nonexistent/t").status();
  EXPECT_TRUE(absl::StrContains(missing.message(), "--auth-token-file /nonexistent/t"))
      << missing;
}

TEST(TlsFlagsTest, NoFlagsIsPlaintext) {
  absl::StatusOr<ClientTls> client = LoadClientTls(TlsFlags());
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE(client->secure());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server =
      LoadServerCredentials(TlsFlags());
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(*server, nullptr);  // GrpcServer::Start reads null as plaintext
}

TEST_F(SecurityTest, BadFilesAreNamed) {
  TlsFlags missing = certs_.Mutual();
  missing.key = "/nonexistent/node.key";
  for (const absl::Status& s :
       {LoadClientTls(missing).status(), LoadServerCredentials(missing).status(),
        StartNode(missing).status()}) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "--tls-key /nonexistent/node.key")) << s;
  }
  TlsFlags not_pem = certs_.Mutual();
  not_pem.ca = WriteFile("garbage.pem", "not a certificate\n");
  const absl::Status s = StartNode(not_pem).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--tls-ca " + not_pem.ca)) << s;
  // A key in place of the certificate.
  TlsFlags swapped = certs_.Mutual();
  swapped.cert = certs_.key;
  EXPECT_TRUE(absl::StrContains(StartNode(swapped).status().message(), "--tls-cert")) << s;
  TlsFlags half = certs_.Mutual();
  half.key.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(StartNode(half).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LoadServerCredentials({"", "", certs_.ca, ""}).status()));
}

TEST_F(SecurityTest, KeyOfAnotherCertificateIsAnErrorNotACrash) {
  TlsFlags mismatched = certs_.Mutual();
  mismatched.key = certs_.dir + "/ca.key";
  absl::StatusOr<std::unique_ptr<NodeEndpoints>> node = StartNode(mismatched);
  ASSERT_FALSE(node.ok());
  EXPECT_TRUE(absl::StrContains(node.status().message(), "--tls-key")) << node.status();
}

TEST_F(SecurityTest, TlsServerWantsTheCa) {
  absl::StatusOr<std::unique_ptr<NodeEndpoints>> node =
      StartNode({certs_.cert, certs_.key, "", ""});
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(*Check(**node, {"", "", certs_.ca, ""}));
  // Plaintext, the system's roots, or another CA: no connection.
  EXPECT_TRUE(absl::IsUnavailable(Check(**node, TlsFlags()).status()));
  EXPECT_TRUE(absl::IsUnavailable(Check(**node, {"", "", certs_.other_ca, ""}).status()));
  // The expected name must be in the certificate.
  EXPECT_TRUE(*Check(**node, {"", "", certs_.ca, "localhost"}));
  EXPECT_TRUE(absl::IsUnavailable(Check(**node, {"", "", certs_.ca, "k3serve-other"}).status()));
}

TEST_F(SecurityTest, MutualTlsWantsAClientCertificate) {
  absl::StatusOr<std::unique_ptr<NodeEndpoints>> node = StartNode(certs_.Mutual());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(*Check(**node, certs_.Mutual()));
  EXPECT_TRUE(absl::IsUnavailable(Check(**node, {"", "", certs_.ca, ""}).status()));
  EXPECT_TRUE(absl::IsUnavailable(Check(**node, TlsFlags()).status()));
}

}  // namespace
}  // namespace k3
