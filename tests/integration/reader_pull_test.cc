// Readers (PsClientOptions::reader, PullRequest.read_only) on real ps_server
// shards: a reader's pull is answered at once under BSP while a worker
// lags, reads the values workers pushed, and changes nothing on the shards
// (no worker registered, no clock moved, no row created); malformed
// read_only requests and a reader's writes are refused.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;
using testing::StartPsCluster;

std::vector<std::string> Addresses(const std::vector<ServerProcess>& cluster) {
  std::vector<std::string> out;
  for (const ServerProcess& s : cluster) out.push_back(s.address);
  return out;
}

std::unique_ptr<PsClient> Connect(const std::vector<std::string>& servers,
                                  int32_t worker, bool reader) {
  PsClientOptions o;
  o.servers = servers;
  o.worker_id = worker;
  o.reader = reader;
  o.retry.call_deadline = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

TensorSpec Weights() {
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(40);
  spec.set_init(INIT_CONSTANT);
  spec.set_init_value(1.0f);
  spec.mutable_optimizer()->set_type(OPT_SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  spec.set_slice_elems(8);
  return spec;
}

TableSpec Rows() {
  TableSpec t;
  t.set_name("emb");
  t.set_dim(2);
  t.set_init(INIT_CONSTANT);
  t.set_init_value(0.5f);
  t.mutable_optimizer()->set_type(OPT_SGD);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  return t;
}

uint64_t TotalRows(const std::vector<StatusResponse>& status) {
  uint64_t rows = 0;
  for (const StatusResponse& s : status) {
    for (const TableStatus& t : s.tables()) rows += t.rows();
  }
  return rows;
}

TEST_CASE("a reader's pull is answered at once and changes nothing",
          "[reader]") {
  auto cluster = StartPsCluster(2, {"--consistency=bsp"});
  REQUIRE_OK(cluster.status());
  const std::vector<std::string> servers = Addresses(*cluster);
  auto worker = Connect(servers, 0, false);
  REQUIRE_OK(worker->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(worker->Register().status());
  REQUIRE_OK(worker->CreateTensors({Weights()}));
  REQUIRE_OK(worker->CreateTables({Rows()}));
  std::vector<float> w(40);
  REQUIRE_OK(worker->Pull(0, {{"w", w.data()}}));
  const std::vector<float> grad(40, 0.25f);
  REQUIRE_OK(worker->Push(0, {{"w", grad.data()}}).status());
  // Worker 1 registers at clock 0: under BSP, worker 0's pull for clock 2
  // waits for it; a reader's does not.
  auto lagging = Connect(servers, 1, false);
  REQUIRE_OK(lagging->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(lagging->Register().status());

  auto reader = Connect(servers, 0, true);
  REQUIRE_OK(reader->WaitForTensors({"w", "emb"}, absl::Seconds(30)));
  absl::StatusOr<std::vector<StatusResponse>> before = reader->Status();
  REQUIRE_OK(before.status());

  std::vector<float> read(40, -1.0f);
  const absl::Time start = absl::Now();
  auto pull = reader->StartPull(7, 9, {{"w", read.data()}});
  REQUIRE_OK(pull->Wait());
  REQUIRE(absl::Now() - start < absl::Seconds(5));
  for (float v : read) REQUIRE(v == 0.75f);
  for (uint64_t version : reader->PulledVersions("w")) REQUIRE(version == 0);
  REQUIRE(pull->read().versions.at("w") ==
          std::vector<uint64_t>(5, uint64_t{1}));

  const std::vector<uint64_t> ids = {3, 99, 3, 1u << 30};
  std::vector<float> rows(ids.size() * 2, -1.0f);
  auto rows_pull =
      reader->StartPullRows(0, 0, {{"emb", ids, rows.data(), true}});
  REQUIRE_OK(rows_pull->Wait());
  for (float v : rows) REQUIRE(v == 0.5f);

  absl::StatusOr<std::vector<StatusResponse>> after = reader->Status();
  REQUIRE_OK(after.status());
  REQUIRE(TotalRows(*after) == 0);
  for (size_t s = 0; s < after->size(); ++s) {
    const StatusResponse& b = (*before)[s];
    const StatusResponse& a = (*after)[s];
    REQUIRE(a.workers_size() == 2);
    REQUIRE(a.workers_size() == b.workers_size());
    for (int i = 0; i < a.workers_size(); ++i) {
      REQUIRE(a.workers(i).worker_id() == b.workers(i).worker_id());
      REQUIRE(a.workers(i).incarnation() == b.workers(i).incarnation());
      REQUIRE(a.workers(i).clock() == b.workers(i).clock());
    }
  }

  // A reader only reads; rows it would create are refused before sending.
  auto push = reader->StartPush(0, {{"w", grad.data()}}, pull->read());
  REQUIRE(push->Wait().status().code() ==
          absl::StatusCode::kFailedPrecondition);
  REQUIRE(reader->Register().status().code() ==
          absl::StatusCode::kFailedPrecondition);
  REQUIRE(reader->Heartbeat(0).code() == absl::StatusCode::kFailedPrecondition);
  auto creating = reader->StartPullRows(0, 0, {{"emb", ids, rows.data()}});
  REQUIRE(creating->Wait().code() == absl::StatusCode::kInvalidArgument);
  std::vector<float> check(40);
  REQUIRE_OK(worker->Pull(1, {{"w", check.data()}}));
  for (float v : check) REQUIRE(v == 0.75f);
}

TEST_CASE("malformed read_only pulls are refused and register nobody",
          "[reader]") {
  auto cluster = StartPsCluster(1);
  REQUIRE_OK(cluster.status());
  auto worker = Connect(Addresses(*cluster), 0, false);
  REQUIRE_OK(worker->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(worker->CreateTables({Rows()}));
  auto channel = grpc::CreateChannel((*cluster)[0].address,
                                     grpc::InsecureChannelCredentials());
  auto stub = ParameterServer::NewStub(channel);
  auto call = [&](const PullRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    PullResponse response;
    return stub->Pull(&ctx, request, &response);
  };

  PullRequest with_worker;
  with_worker.set_read_only(true);
  with_worker.mutable_worker()->set_worker_id(4);
  with_worker.mutable_worker()->set_incarnation(9);
  REQUIRE(call(with_worker).error_code() == grpc::INVALID_ARGUMENT);

  PullRequest ahead;
  ahead.set_read_only(true);
  ahead.set_for_clock(3);
  REQUIRE(call(ahead).error_code() == grpc::INVALID_ARGUMENT);

  PullRequest creating;
  creating.set_read_only(true);
  TableIds* t = creating.add_rows();
  t->set_table("emb");
  t->add_ids(5);
  grpc::Status s = call(creating);
  REQUIRE(s.error_code() == grpc::INVALID_ARGUMENT);
  REQUIRE(s.error_message().find("peek") != std::string::npos);
  t->set_peek(true);
  REQUIRE(call(creating).ok());

  absl::StatusOr<std::vector<StatusResponse>> status = worker->Status();
  REQUIRE_OK(status.status());
  REQUIRE((*status)[0].workers_size() == 0);
  REQUIRE(TotalRows(*status) == 0);
  REQUIRE((*status)[0].counters().rejected_bad_input() >= 3);
}

}  // namespace
}  // namespace asyncps
