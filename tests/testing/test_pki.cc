#include "tests/testing/test_pki.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::trunc);
  out << contents;
  REQUIRE(out.good());
}

void Shell(const std::string& command) {
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

namespace {

// Makes a key and a certificate `name` signed by CA `ca` (its .pem/.key).
void SignedCert(const std::string& dir, const std::string& name,
                const std::string& ca, const std::string& cn,
                const std::string& ext) {
  const std::string p = absl::StrCat(dir, "/", name);
  WriteFile(p + ".ext", ext);
  Shell(absl::StrCat("openssl req -newkey rsa:2048 -nodes -keyout ", p,
                     ".key -out ", p, ".csr -subj /CN=", cn, " 2>/dev/null"));
  Shell(absl::StrCat("openssl x509 -req -in ", p, ".csr -CA ", dir, "/", ca,
                     ".pem -CAkey ", dir, "/", ca, ".key -CAcreateserial -out ",
                     p, ".pem -days 2 -extfile ", p, ".ext 2>/dev/null"));
}

// A client certificate signed by the CA whose validity ended in 2021
// (`openssl ca` takes explicit dates, `openssl x509 -req` does not).
void ExpiredCert(const std::string& dir) {
  const std::string p = dir + "/expired";
  WriteFile(dir + "/index.txt", "");
  WriteFile(dir + "/serial", "1000\n");
  WriteFile(p + ".cnf", absl::StrCat("[ca]\ndefault_ca = d\n[d]\ndatabase = ",
                                     dir, "/index.txt\nnew_certs_dir = ", dir,
                                     "\nserial = ", dir,
                                     "/serial\ndefault_md = sha256\npolicy = "
                                     "p\n[p]\ncommonName = supplied\n"));
  WriteFile(p + ".ext", "extendedKeyUsage=clientAuth\n");
  Shell(absl::StrCat("openssl req -newkey rsa:2048 -nodes -keyout ", p,
                     ".key -out ", p, ".csr -subj /CN=old 2>/dev/null"));
  Shell(absl::StrCat("openssl ca -batch -config ", p, ".cnf -cert ", dir,
                     "/ca.pem -keyfile ", dir, "/ca.key -in ", p, ".csr -out ",
                     p,
                     ".pem -startdate 20200101000000Z -enddate 20210101000000Z "
                     "-extfile ",
                     p, ".ext 2>/dev/null"));
}

}  // namespace

const Pki& TestPki() {
  static const Pki* pki = [] {
    auto* k = new Pki;
    k->dir = testing::UniqueTmpPath("pki");
    Shell("mkdir -p " + k->dir);
    for (const char* ca : {"ca", "rogue_ca"}) {
      Shell(absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -keyout ",
                         k->dir, "/", ca, ".key -out ", k->dir, "/", ca,
                         ".pem -days 2 -subj /CN=asyncps-test-", ca,
                         " 2>/dev/null"));
    }
    SignedCert(k->dir, "server", "ca", "localhost",
               "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
               "extendedKeyUsage=serverAuth\n");
    SignedCert(k->dir, "client", "ca", "worker",
               "extendedKeyUsage=clientAuth\n");
    SignedCert(k->dir, "rogue", "rogue_ca", "worker",
               "extendedKeyUsage=clientAuth\n");
    k->ca = k->dir + "/ca.pem";
    k->server_cert = k->dir + "/server.pem";
    k->server_key = k->dir + "/server.key";
    k->client_cert = k->dir + "/client.pem";
    k->client_key = k->dir + "/client.key";
    ExpiredCert(k->dir);
    k->expired_cert = k->dir + "/expired.pem";
    k->expired_key = k->dir + "/expired.key";
    k->rogue_cert = k->dir + "/rogue.pem";
    k->rogue_key = k->dir + "/rogue.key";
    k->token_file = k->dir + "/token";
    k->wrong_token_file = k->dir + "/wrong_token";
    k->empty_token_file = k->dir + "/empty_token";
    WriteFile(k->token_file, absl::StrCat(kClusterToken, "\n"));
    Shell("chmod 600 " + k->token_file);
    WriteFile(k->wrong_token_file, "not-the-token\n");
    WriteFile(k->empty_token_file, " \n\t\n");
    return k;
  }();
  return *pki;
}

}  // namespace testing
}  // namespace asyncps
