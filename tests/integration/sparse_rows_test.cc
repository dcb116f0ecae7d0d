// Sparse tables on real ps_server shards (separate processes on port 0):
// PsClient's routed, de-duplicated pulls and pushes on the data streams,
// the plain Pull/Push path, exactly-once pushes and fencing, bad input,
// the memory cap, Status, and rows across a shard restart.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/net.h"
#include "common/row_initializer.h"
#include "common/shard_map.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::ServerProcess;
using testing::StartPsCluster;
using testing::StartPsServer;

TableSpec Table(const std::string& name, int dim, OptimizerType type,
                float lr) {
  TableSpec t;
  t.set_name(name);
  t.set_dim(dim);
  t.set_init(INIT_UNIFORM);
  t.set_init_value(0.1f);
  t.set_seed(11);
  t.mutable_optimizer()->set_type(type);
  t.mutable_optimizer()->set_learning_rate(lr);
  if (type == OPT_ADAGRAD) {
    t.mutable_optimizer()->set_epsilon(1e-6f);
    t.mutable_optimizer()->set_initial_accumulator(0.1f);
  }
  return t;
}

std::vector<float> Initial(const TableSpec& spec, uint64_t id) {
  std::vector<float> v(spec.dim());
  RowInitializer(spec).Fill(id, v.data());
  return v;
}

std::unique_ptr<PsClient> Connect(const std::vector<std::string>& servers,
                                  int32_t worker, uint64_t incarnation = 0,
                                  WireDtype dtype = WIRE_F32) {
  PsClientOptions o;
  o.servers = servers;
  o.worker_id = worker;
  o.incarnation = incarnation;
  o.push_dtype = o.pull_dtype = dtype;
  o.retry.call_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<PsClient>> c = PsClient::Connect(o);
  REQUIRE_OK(c.status());
  return *std::move(c);
}

std::vector<std::string> Addresses(const std::vector<ServerProcess>& cluster) {
  std::vector<std::string> out;
  for (const ServerProcess& s : cluster) out.push_back(s.address);
  return out;
}

std::vector<float> Pull(PsClient* c, const std::string& table,
                        const std::vector<uint64_t>& ids, int dim,
                        ReadSet* read = nullptr, int64_t* created = nullptr) {
  std::vector<float> out(ids.size() * dim, -99.0f);
  auto p = c->StartPullRows(0, 0, {{table, ids, out.data()}});
  REQUIRE_OK(p->Wait());
  if (read != nullptr) *read = p->read();
  if (created != nullptr) *created = p->rows_created();
  return out;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return ctx;
}

TEST_CASE(
    "rows are routed, de-duplicated, created on first touch and "
    "updated exactly",
    "[rows]") {
  auto cluster = StartPsCluster(2);
  REQUIRE_OK(cluster.status());
  const std::vector<std::string> servers = Addresses(*cluster);
  auto c = Connect(servers, 0);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  const TableSpec sgd = Table("sgd", 3, OPT_SGD, 0.5f);
  const TableSpec ada = Table("ada", 4, OPT_ADAGRAD, 0.1f);
  REQUIRE_OK(c->CreateTables({sgd, ada}));
  REQUIRE_OK(c->CreateTables({sgd}));  // idempotent

  // Another worker finds the tables by name.
  auto other = Connect(servers, 1);
  REQUIRE_OK(other->WaitForTensors({"sgd", "ada"}, absl::Seconds(30)));
  REQUIRE(other->FindTableSpec("ada") != nullptr);
  REQUIRE(other->FindTableSpec("ada")->dim() == 4);

  // Ids spread over both shards, with repeats and the extremes of the id
  // space.
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 300; ++i) ids.push_back(i * 7919);
  ids.push_back(~uint64_t{0});
  ids.push_back(5);
  ids.push_back(0);
  ids.push_back(5);
  ReadSet read;
  int64_t created = -1;
  const std::vector<float> before =
      Pull(c.get(), "sgd", ids, 3, &read, &created);
  REQUIRE(created == 302);  // distinct ids, on both shards
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<float> init = Initial(sgd, ids[i]);
    for (int d = 0; d < 3; ++d) REQUIRE(before[i * 3 + d] == init[d]);
  }
  // The gradient of id i is (i % 5) per element; repeated ids add up.
  std::vector<float> grads(ids.size() * 3);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int d = 0; d < 3; ++d) grads[i * 3 + d] = static_cast<float>(i % 5);
  }
  auto push = c->StartPushRows(0, {{"sgd", ids, grads.data()}}, read);
  absl::StatusOr<PushSummary> summary = push->Wait();
  REQUIRE_OK(summary.status());
  REQUIRE(summary->applied == 302);  // distinct ids
  REQUIRE(summary->refused_stale == 0);
  REQUIRE(summary->rows_created == 0);  // the pull created them
  ReadSet after_read;
  const std::vector<float> after =
      Pull(c.get(), "sgd", ids, 3, &after_read, &created);
  REQUIRE(created == 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    float sum = 0;
    for (size_t j = 0; j < ids.size(); ++j) {
      if (ids[j] == ids[i]) sum += static_cast<float>(j % 5);
    }
    const std::vector<float> init = Initial(sgd, ids[i]);
    for (int d = 0; d < 3; ++d) {
      REQUIRE(after[i * 3 + d] == init[d] - 0.5f * sum);
    }
    REQUIRE(after_read.VersionOf("sgd", ids[i]) == 1);
  }

  // Status: every distinct row on its home shard, once.
  absl::StatusOr<std::vector<StatusResponse>> status = c->Status();
  REQUIRE_OK(status.status());
  uint64_t held = 0;
  for (int s = 0; s < 2; ++s) {
    const StatusResponse& st = (*status)[s];
    REQUIRE(st.tables_size() == 2);
    REQUIRE(st.tables(1).name() == "sgd");
    uint64_t home = 0;
    for (uint64_t id : {uint64_t{0}, uint64_t{5}, ~uint64_t{0}}) {
      home += ShardMap::Static(2)->RowHome("sgd", id) == s;
    }
    for (uint64_t i = 0; i < 300; ++i)
      home += ShardMap::Static(2)->RowHome("sgd", i * 7919) == s;
    REQUIRE(st.tables(1).rows() ==
            home - (s == ShardMap::Static(2)->RowHome("sgd", 0)));
    REQUIRE(st.tables(1).pushes() == 1);
    held += st.tables(1).rows();
  }
  REQUIRE(held == 302);

  // bf16 on the wire: values within bf16's precision.
  auto narrow = Connect(servers, 2, 0, WIRE_BF16);
  REQUIRE_OK(narrow->WaitForTensors({"ada"}, absl::Seconds(30)));
  const std::vector<float> b = Pull(narrow.get(), "ada", {1, 2, 3}, 4);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> init = Initial(ada, i + 1);
    for (int d = 0; d < 4; ++d) {
      REQUIRE(b[i * 4 + d] == Approx(init[d]).epsilon(1e-2).margin(1e-3));
    }
  }

  // Unknown table and null buffers are refused before anything is sent.
  std::vector<float> out(3);
  REQUIRE(absl::IsNotFound(
      c->StartPullRows(0, 0, {{"nope", ids, out.data()}})->Wait()));
  REQUIRE(absl::IsInvalidArgument(
      c->StartPushRows(0, {{"sgd", ids, nullptr}}, read)->Wait().status()));
  // A NaN in any row is refused before anything is sent to any shard.
  std::vector<float> nan(grads.size(), 1.0f);
  nan.back() = std::nanf("");
  const absl::Status refused =
      c->StartPushRows(0, {{"sgd", ids, nan.data()}}, read)->Wait().status();
  REQUIRE(absl::IsInvalidArgument(refused));
  REQUIRE(refused.message().find("nothing was sent") != std::string::npos);
  REQUIRE(Pull(c.get(), "sgd", ids, 3) == after);
}

TEST_CASE(
    "row pushes are applied once per seq, fenced, and bad ones change "
    "nothing",
    "[rows][bad_input]") {
  auto cluster = StartPsCluster(1);
  REQUIRE_OK(cluster.status());
  auto stub = ParameterServer::NewStub(MakeChannel((*cluster)[0].address));
  const TableSpec sgd = Table("t", 2, OPT_SGD, 1.0f);
  {
    CreateTensorRequest req;
    *req.add_tables() = sgd;
    CreateTensorResponse resp;
    REQUIRE(stub->CreateTensor(Context().get(), req, &resp).ok());
  }
  auto push = [&](uint64_t incarnation, uint64_t seq, const std::string& table,
                  std::vector<uint64_t> ids, std::vector<float> g,
                  PushResponse* resp) {
    PushRequest req;
    req.mutable_worker()->set_worker_id(0);
    req.mutable_worker()->set_incarnation(incarnation);
    req.set_seq(seq);
    RowsGradient* r = req.add_rows();
    r->set_table(table);
    for (uint64_t id : ids) r->add_ids(id);
    r->set_grad(std::string(reinterpret_cast<const char*>(g.data()),
                            g.size() * sizeof(float)));
    return stub->Push(Context().get(), req, resp);
  };
  auto value = [&](uint64_t id) {
    PullRequest req;
    req.mutable_worker()->set_worker_id(3);
    req.mutable_worker()->set_incarnation(3);
    TableIds* t = req.add_rows();
    t->set_table("t");
    t->add_ids(id);
    PullResponse resp;
    REQUIRE(stub->Pull(Context().get(), req, &resp).ok());
    REQUIRE(resp.rows_size() == 1);
    REQUIRE(resp.rows(0).values().size() == 8);
    float v[2];
    std::memcpy(v, resp.rows(0).values().data(), sizeof(v));
    return std::make_pair(v[0], resp.rows(0).versions(0));
  };
  const float init = Initial(sgd, 9)[0];
  PushResponse resp;
  REQUIRE(push(100, 1, "t", {9}, {1.0f, 1.0f}, &resp).ok());
  REQUIRE_FALSE(resp.duplicate());
  REQUIRE(resp.row_results(0).applied() == 1);
  REQUIRE(push(100, 1, "t", {9}, {1.0f, 1.0f}, &resp).ok());  // a retry
  REQUIRE(resp.duplicate());
  REQUIRE(value(9) == std::make_pair(init - 1.0f, uint64_t{1}));

  // Bad input: nothing changes, and the seq may be used again.
  REQUIRE(push(100, 2, "unknown", {9}, {1, 1}, &resp).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  REQUIRE(push(100, 2, "t", {9}, {1, 1, 1}, &resp).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);  // wrong dimension
  REQUIRE(push(100, 2, "t", {9, 10}, {1, 1, std::nanf(""), 1}, &resp)
              .error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(push(100, 2, "t", {}, {}, &resp).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);  // no ids
  REQUIRE(value(9) == std::make_pair(init - 1.0f, uint64_t{1}));
  REQUIRE(push(100, 2, "t", {9}, {1, 1}, &resp).ok());
  REQUIRE_FALSE(resp.duplicate());

  // A new incarnation of worker 0 fences the old one.
  REQUIRE(push(200, 1, "t", {9}, {1, 1}, &resp).ok());
  REQUIRE_FALSE(resp.duplicate());
  REQUIRE(push(100, 3, "t", {9}, {1, 1}, &resp).error_code() ==
          grpc::StatusCode::FAILED_PRECONDITION);
  REQUIRE(value(9) == std::make_pair(init - 3.0f, uint64_t{3}));
}

TEST_CASE(
    "a table larger than one shard's cap trains on two; a full shard "
    "refuses new rows",
    "[rows][memory]") {
  // Room for about 3000 rows of dim 8 (SGD: 32 + 64 bytes each) per shard.
  const std::string cap = "300K";
  auto cluster = StartPsCluster(2, {"--max_parameter_bytes=" + cap});
  REQUIRE_OK(cluster.status());
  auto c = Connect(Addresses(*cluster), 0);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->CreateTables({Table("big", 8, OPT_SGD, 0.1f)}));
  // 5000 rows: more than one shard holds, fine on two.
  std::vector<uint64_t> ids(5000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 1000003;
  std::vector<float> out(ids.size() * 8);
  REQUIRE_OK(c->StartPullRows(0, 0, {{"big", ids, out.data()}})->Wait());
  absl::StatusOr<std::vector<StatusResponse>> st = c->Status();
  REQUIRE_OK(st.status());
  const uint64_t a = (*st)[0].tables(0).rows(), b = (*st)[1].tables(0).rows();
  REQUIRE(a + b == 5000);
  REQUIRE(std::abs(static_cast<double>(a) - b) / 2500 < 0.05);

  // Another 5000 do not fit: RESOURCE_EXHAUSTED, and no new rows.
  std::vector<uint64_t> more(5000);
  for (size_t i = 0; i < more.size(); ++i) more[i] = i * 1000003 + 1;
  std::vector<float> out2(more.size() * 8);
  const absl::Status s =
      c->StartPullRows(0, 0, {{"big", more, out2.data()}})->Wait();
  INFO(s.ToString());
  REQUIRE(absl::IsResourceExhausted(s));
  REQUIRE(s.message().find("max_parameter_bytes") != std::string::npos);
  st = c->Status();
  REQUIRE_OK(st.status());
  REQUIRE((*st)[0].tables(0).rows() + (*st)[1].tables(0).rows() == 5000);
}

TEST_CASE("rows come back identical after a shard restarts",
          "[rows][restart]") {
  const std::string dir = testing::UniqueTmpPath("rows_restart");
  ::mkdir(dir.c_str(), 0755);
  const std::vector<std::string> args = {"--checkpoint_dir=" + dir};
  absl::StatusOr<ServerProcess> shard = StartPsServer(0, 1, args);
  REQUIRE_OK(shard.status());
  const TableSpec ada = Table("ada", 4, OPT_ADAGRAD, 0.1f);
  std::vector<float> trained;
  const std::vector<uint64_t> ids = {1, 2, 3, 1000};
  {
    auto c = Connect({shard->address}, 0);
    REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
    REQUIRE_OK(c->CreateTables({ada}));
    ReadSet read;
    Pull(c.get(), "ada", {1, 2, 3}, 4, &read);
    std::vector<float> g(12, 0.5f);
    REQUIRE_OK(c->StartPushRows(0, {{"ada", {1, 2, 3}, g.data()}}, read)
                   ->Wait()
                   .status());
    trained = Pull(c.get(), "ada", {1, 2, 3}, 4);
  }
  // SIGTERM writes the final checkpoint; the new process restores it.
  REQUIRE(*shard->process->Kill() == 0);  // a clean shutdown
  shard = StartPsServer(0, 1, args);
  REQUIRE_OK(shard.status());
  auto c = Connect({shard->address}, 0);
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->WaitForTensors({"ada"}, absl::Seconds(30)));
  ReadSet read;
  const std::vector<float> again = Pull(c.get(), "ada", ids, 4, &read);
  REQUIRE(std::vector<float>(again.begin(), again.begin() + 12) == trained);
  REQUIRE(read.VersionOf("ada", 1) == 1);
  // A row first touched after the restart has its initial values.
  const std::vector<float> init = Initial(ada, 1000);
  REQUIRE(std::vector<float>(again.begin() + 12, again.end()) == init);
}

}  // namespace
}  // namespace asyncps
