#include "membership/etcd_flags.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/security.h"

ABSL_FLAG(std::string, etcd_endpoints, "",
          "etcd host:port,... holding the shard map of --run_id (a "
          "replicated run, under /asyncps/<run_id>). ps_server: registers "
          "there with a lease and takes its place in its shard's group "
          "(needed by --replicas > 1). Clients: the shards and their "
          "primaries come from the map, followed through failovers; "
          "--servers is then optional (if given, its count must match the "
          "map's).");
ABSL_FLAG(std::string, etcd_ca, "",
          "PEM CA bundle that etcd's certificate (its --cert-file) is "
          "checked with; turns TLS to etcd on.");
ABSL_FLAG(std::string, etcd_cert, "",
          "PEM client certificate presented to etcd (with --etcd_key), for "
          "an etcd started with --client-cert-auth; turns TLS to etcd on.");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd_cert.");
ABSL_FLAG(std::string, etcd_user, "",
          "User of an etcd with authentication enabled (etcdctl auth "
          "enable), with --etcd_password_file; it needs read and write on "
          "the prefix /asyncps/. Use TLS too: the password goes to etcd in "
          "the clear otherwise.");
ABSL_FLAG(std::string, etcd_password_file, "",
          "File holding --etcd_user's password (chmod 600; surrounding "
          "whitespace is stripped).");

namespace asyncps {

std::string EtcdEndpointsFlag() { return absl::GetFlag(FLAGS_etcd_endpoints); }

absl::StatusOr<EtcdAccess> EtcdAccessFlags(std::vector<std::string>* warnings) {
  SecurityFlagValues v;
  v.tls_ca = absl::GetFlag(FLAGS_etcd_ca);
  v.tls_cert = absl::GetFlag(FLAGS_etcd_cert);
  v.tls_key = absl::GetFlag(FLAGS_etcd_key);
  v.flag_prefix = "--etcd_";
  absl::StatusOr<SecurityOptions> tls =
      SecurityOptionsFromFlagValues(v, /*server=*/false);
  if (!tls.ok()) return tls.status();
  EtcdAccess access;
  access.tls = *std::move(tls);
  access.user = absl::GetFlag(FLAGS_etcd_user);
  const std::string password_file = absl::GetFlag(FLAGS_etcd_password_file);
  if (access.user.empty() != password_file.empty()) {
    return absl::InvalidArgumentError(
        access.user.empty() ? "--etcd_password_file needs --etcd_user"
                            : "--etcd_user needs --etcd_password_file");
  }
  if (!password_file.empty()) {
    absl::StatusOr<std::string> password =
        ReadPemFile(password_file, "--etcd_password_file");
    if (!password.ok()) {
      return absl::InvalidArgumentError(password.status().message());
    }
    access.password = std::string(absl::StripAsciiWhitespace(*password));
    if (access.password.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd_password_file: ", password_file,
                       " is empty (or only whitespace)"));
    }
    std::string warning =
        TokenFileWarning(password_file, "--etcd_password_file");
    if (!warning.empty()) warnings->push_back(std::move(warning));
  }
  return access;
}

absl::Status AddEtcdFlags(ShardAddressingOptions* a,
                          std::vector<std::string>* warnings) {
  a->etcd_endpoints = EtcdEndpointsFlag();
  absl::StatusOr<EtcdAccess> access = EtcdAccessFlags(warnings);
  if (!access.ok()) return access.status();
  a->router.etcd_access = *std::move(access);
  return absl::OkStatus();
}

}  // namespace asyncps
