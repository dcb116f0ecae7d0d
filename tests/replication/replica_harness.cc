#include "tests/replication/replica_harness.h"

#include <catch2/catch.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "membership/shard_addressing.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/faults/harness.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace testing {

std::vector<std::string> ReplicaArgs(const EtcdProcess& etcd,
                                     const std::string& run) {
  std::vector<std::string> args = {
      "--host=127.0.0.1", absl::StrCat("--run_id=", run), "--replicas=2",
      absl::StrCat("--etcd_endpoints=", etcd.endpoint), "--lease_ms=1000"};
  for (std::string& flag : EtcdClientFlags(etcd)) {
    args.push_back(std::move(flag));
  }
  return args;
}

ServerProcess StartReplica(const EtcdProcess& etcd, const std::string& run,
                           const std::vector<std::string>& extra, int shard,
                           int num_shards) {
  std::vector<std::string> args = ReplicaArgs(etcd, run);
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<ServerProcess> s = StartPsServer(shard, num_shards, args);
  REQUIRE_OK(s.status());
  return *std::move(s);
}

std::pair<int, std::string> RunServer(const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(RunfilePath("server/ps_server"), args);
  REQUIRE_OK(p.status());
  absl::StatusOr<int> exit = (*p)->Wait(absl::Seconds(30));
  REQUIRE_OK(exit.status());
  return {*exit, (*p)->ReadLog()};
}

std::pair<int, std::string> Psctl(const EtcdProcess& etcd,
                                  const std::string& run,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "status", absl::StrCat("--etcd_endpoints=", etcd.endpoint),
      absl::StrCat("--run_id=", run)};
  for (std::string& flag : EtcdClientFlags(etcd)) {
    args.push_back(std::move(flag));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(RunfilePath("tools/psctl"), args);
  REQUIRE_OK(p.status());
  absl::StatusOr<int> exit = (*p)->Wait(absl::Seconds(30));
  REQUIRE_OK(exit.status());
  return {*exit, (*p)->ReadLog()};
}

void StartReplicaPair(const EtcdProcess& etcd, const std::string& run,
                      ServerProcess* primary, ServerProcess* backup,
                      const std::vector<std::string>& extra) {
  *primary = StartReplica(etcd, run, extra);
  WaitForRole(primary->address, "primary");
  *backup = StartReplica(etcd, run, extra);
  WaitForRole(backup->address, "backup");
  WaitForCounted(primary->address, 1);
}

absl::StatusOr<StatusResponse> ReplicaStatus(const std::string& address,
                                             bool digest,
                                             const SecurityOptions& security) {
  const bool plain = security.tls_ca.empty() && security.tls_cert.empty() &&
                     security.cluster_token.empty();
  if (!digest && plain) return ShardStatus(address);
  auto stub = ParameterServer::NewStub(MakeChannel(address, 0, security));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  StatusRequest request;
  request.set_state_digest(true);
  StatusResponse response;
  grpc::Status s = stub->Status(&ctx, request, &response);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return response;
}

void WaitForRole(const std::string& address, const std::string& role,
                 absl::Duration timeout, const SecurityOptions& security) {
  REQUIRE_OK(WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> s =
            ReplicaStatus(address, false, security);
        return s.ok() && s->replica().role() == role;
      },
      timeout, absl::StrCat(address, " becomes ", role)));
}

void WaitForCounted(const std::string& primary, int n,
                    const SecurityOptions& security) {
  REQUIRE_OK(WaitFor(
      [&] {
        absl::StatusOr<StatusResponse> s =
            ReplicaStatus(primary, false, security);
        if (!s.ok()) return false;
        int counted = 0;
        for (const auto& b : s->replica().backups()) {
          counted += b.counted() && b.caught_up();
        }
        return counted == n;
      },
      absl::Seconds(30), absl::StrCat(primary, " counts ", n, " backups")));
}

void ExpectSameState(const std::string& a, const std::string& b,
                     const SecurityOptions& security) {
  absl::StatusOr<StatusResponse> sa, sb;
  REQUIRE_OK(WaitFor(
      [&] {
        sa = ReplicaStatus(a, true, security);
        sb = ReplicaStatus(b, true, security);
        return sa.ok() && sb.ok() &&
               sa->replica().log_index() == sb->replica().log_index();
      },
      absl::Seconds(20), "both replicas at the same entry"));
  INFO("entry " << sa->replica().log_index());
  CHECK(sa->replica().log_index() > 0);
  CHECK(sa->replica().state_digest() == sb->replica().state_digest());
}

TensorSpec UnitTensor(int elems) {
  TensorSpec w;
  w.set_name("w");
  w.add_shape(elems);
  w.set_init(INIT_CONSTANT);
  w.set_init_value(1.0f);
  w.mutable_optimizer()->set_learning_rate(1.0f);
  return w;
}

void PushOnes(PsClient* c, int elems, int first_step, int n) {
  const std::vector<float> ones(elems, 1.0f);
  for (int i = 0; i < n; ++i) {
    REQUIRE_OK(c->Push(first_step + i, {{"w", ones.data()}}).status());
  }
}

void ExpectEvery(PsClient* c, int elems, int64_t step, float expected) {
  std::vector<float> values(elems, -1e9f);
  REQUIRE_OK(c->Pull(step, {{"w", values.data()}}));
  int wrong = 0;
  for (float v : values) wrong += v != expected;
  INFO("expected every element " << expected << ", first " << values[0]);
  CHECK(wrong == 0);
}

std::unique_ptr<PsClient> MapClient(const EtcdProcess& etcd,
                                    const std::string& run, bool reader,
                                    const SecurityOptions& security) {
  ShardAddressingOptions a;
  a.etcd_endpoints = etcd.endpoint;
  a.router.etcd_access = EtcdClientAccess(etcd);
  a.run_id = run;
  absl::StatusOr<ShardAddressing> shards = ResolveShardAddressing(a);
  REQUIRE_OK(shards.status());
  PsClientOptions o;
  o.servers = shards->servers;
  o.router = shards->router;
  o.run_id = run;
  o.reader = reader;
  o.security = security;
  o.retry.call_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  REQUIRE_OK((*c)->WaitForShards(absl::Seconds(30)));
  if (!reader) REQUIRE_OK((*c)->Register().status());
  return *std::move(c);
}

}  // namespace testing
}  // namespace asyncps
