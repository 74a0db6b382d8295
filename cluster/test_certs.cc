#include "cluster/test_certs.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace k3 {
namespace {

absl::Status Run(const std::string& dir, const std::string& command) {
  const std::string full = absl::StrCat("cd '", dir, "' && ", command, " >>openssl.log 2>&1");
  if (std::system(full.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' failed; see ", dir, "/openssl.log"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    return absl::UnavailableError("openssl is not installed (tools/install_deps.sh installs it)");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  {
    std::ofstream ext(dir + "/leaf.ext");
    ext << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
           "basicConstraints=critical,CA:FALSE\n"
           "keyUsage=critical,digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=serverAuth,clientAuth\n";
  }
  const std::string new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string ca_ext =
      "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign";
  for (const std::string& command : {
           absl::StrCat("openssl req -x509 ", new_key, " -keyout ca.key -out ca.pem -days 2 ",
                        "-subj /CN=k3serve-test-ca ", ca_ext),
           absl::StrCat("openssl req -x509 ", new_key, " -keyout other_ca.key -out other_ca.pem ",
                        "-days 2 -subj /CN=k3serve-other-ca ", ca_ext),
           absl::StrCat("openssl req ", new_key, " -keyout node.key -out node.csr ",
                        "-subj /CN=localhost"),
           std::string("openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key "
                       "-CAcreateserial -out node.pem -days 2 -extfile leaf.ext"),
       }) {
    K3_RETURN_IF_ERROR(Run(dir, command));
  }
  TestCerts certs;
  certs.dir = dir;
  certs.ca = dir + "/ca.pem";
  certs.cert = dir + "/node.pem";
  certs.key = dir + "/node.key";
  certs.other_ca = dir + "/other_ca.pem";
  return certs;
}

}  // namespace k3
