// Checkpoints across real ps_server restarts: a shard killed with SIGKILL
// comes back, from the checkpoint in its --checkpoint_dir, with exactly the
// values and versions it held when the checkpoint was taken; SIGTERM writes
// a final checkpoint; a corrupt or foreign checkpoint stops the start with
// a message naming the file (unless --restore=false).

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/payload.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using testing::RunfilePath;
using testing::ServerProcess;
using testing::StartPsServer;
using testing::Subprocess;

constexpr int kShards = 2;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(20));
  return ctx;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string CheckpointFile(const std::string& dir, int shard) {
  return absl::StrCat(dir, "/shard-", shard, "-of-", kShards, ".ckpt");
}

std::vector<TensorSpec> Specs() {
  std::vector<TensorSpec> specs;
  for (const auto& [name, type, elems] :
       std::vector<std::tuple<std::string, OptimizerType, int64_t>>{
           {"w_adam", OPT_ADAM, 400},
           {"w_momentum", OPT_MOMENTUM, 90},
           {"b_sgd", OPT_SGD, 20}}) {
    TensorSpec s;
    s.set_name(name);
    s.add_shape(elems);
    s.set_init(INIT_UNIFORM);
    s.set_init_value(0.1f);
    s.set_seed(3);
    s.set_slice_elems(16);
    OptimizerSpec* o = s.mutable_optimizer();
    o->set_type(type);
    o->set_learning_rate(0.01f);
    o->set_momentum(0.9f);
    o->set_beta1(0.9f);
    o->set_beta2(0.999f);
    o->set_epsilon(1e-8f);
    specs.push_back(s);
  }
  return specs;
}

// (tensor, slice) -> (version, values bytes).
using Snapshot = std::map<std::pair<std::string, uint32_t>,
                          std::pair<uint64_t, std::string>>;

// One shard process and a stub to it, acting as worker `worker` with
// incarnation `incarnation`.
struct Shard {
  ServerProcess server;
  std::unique_ptr<ParameterServer::Stub> stub;
  uint64_t incarnation = 1;
  uint64_t seq = 0;
  int64_t clock = 0;

  WorkerRef Ref() const {
    WorkerRef r;
    r.set_worker_id(0);
    r.set_incarnation(incarnation);
    r.set_clock(clock);
    return r;
  }

  Snapshot Take() {
    PullRequest req;
    *req.mutable_worker() = Ref();
    for (const TensorSpec& s : Specs()) req.add_tensors(s.name());
    PullResponse resp;
    const grpc::Status s = stub->Pull(Context().get(), req, &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    Snapshot out;
    for (const SliceData& d : resp.slices()) {
      out[{d.tensor(), d.slice()}] = {d.version(), d.values()};
    }
    return out;
  }

  // Pushes a gradient (depending on the round) to every slice it holds.
  PushResponse PushRound(int round) {
    PushRequest req;
    *req.mutable_worker() = Ref();
    req.set_seq(++seq);
    for (const auto& [key, slice] : Take()) {
      SliceGradient* g = req.add_grads();
      g->set_tensor(key.first);
      g->set_slice(key.second);
      g->set_read_version(slice.first);
      std::vector<float> grad(slice.second.size() / sizeof(float));
      for (size_t i = 0; i < grad.size(); ++i) {
        grad[i] =
            std::cos(0.3f * static_cast<float>(i) + static_cast<float>(round));
      }
      EncodeFloats(grad.data(), grad.size(), g->mutable_grad());
    }
    PushResponse resp;
    const grpc::Status s = stub->Push(Context().get(), req, &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    for (const SliceResult& r : resp.results()) REQUIRE(r.outcome() == APPLIED);
    ++clock;
    return resp;
  }

  StatusResponse Status() {
    StatusResponse resp;
    REQUIRE(stub->Status(Context().get(), StatusRequest(), &resp).ok());
    return resp;
  }
};

Shard StartShard(int index, const std::vector<std::string>& args) {
  absl::StatusOr<ServerProcess> server = StartPsServer(index, kShards, args);
  REQUIRE_OK(server.status());
  Shard shard;
  shard.server = *std::move(server);
  shard.stub = ParameterServer::NewStub(MakeChannel(shard.server.address));
  return shard;
}

void CreateTensors(Shard& shard) {
  CreateTensorRequest req;
  for (const TensorSpec& s : Specs()) *req.add_tensors() = s;
  CreateTensorResponse resp;
  REQUIRE(shard.stub->CreateTensor(Context().get(), req, &resp).ok());
}

// Runs tools/psctl with `args`: its exit status and output.
std::pair<int, std::string> Psctl(const std::vector<std::string>& args) {
  absl::StatusOr<testing::ToolRun> run =
      testing::RunTool("tools/psctl", args, absl::Seconds(60));
  REQUIRE_OK(run.status());
  return {run->exit_code, run->output};
}

// Starts a shard that is expected to exit at once; returns (exit status,
// log).
std::pair<int, std::string> StartFailing(int index,
                                         const std::vector<std::string>& args) {
  std::vector<std::string> argv = {absl::StrCat("--shard_index=", index),
                                   absl::StrCat("--num_shards=", kShards),
                                   "--port=0"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(RunfilePath("server/ps_server"), argv);
  REQUIRE_OK(p.status());
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(30));
  REQUIRE_OK(code.status());
  return {*code, (*p)->ReadLog()};
}

TEST_CASE("a shard killed with SIGKILL restarts from its last checkpoint",
          "[checkpoint][integration]") {
  const std::string dir = testing::MakeTmpDir("ckpt-kill");
  const std::vector<std::string> args = {
      absl::StrCat("--checkpoint_dir=", dir)};
  std::vector<Shard> shards;
  for (int i = 0; i < kShards; ++i) shards.push_back(StartShard(i, args));
  for (Shard& s : shards) CreateTensors(s);
  for (int round = 0; round < 3; ++round) {
    for (Shard& s : shards) s.PushRound(round);
  }

  // Both shards at once through psctl; a row per shard with path and size.
  auto [code, out] =
      Psctl({"checkpoint", absl::StrCat("--servers=", shards[0].server.address,
                                        ",", shards[1].server.address)});
  INFO(out);
  REQUIRE(code == 0);
  CHECK(absl::StrContains(out, "2/2 shards wrote a checkpoint"));
  for (int i = 0; i < kShards; ++i) {
    CHECK(absl::StrContains(out, CheckpointFile(dir, i)));
  }
  std::vector<Snapshot> at_checkpoint;
  for (Shard& s : shards) {
    at_checkpoint.push_back(s.Take());
    const StatusResponse st = s.Status();
    CHECK(st.last_checkpoint().path() == CheckpointFile(dir, st.shard_index()));
    CHECK(st.last_checkpoint().bytes() > 0);
    CHECK(st.counters().checkpoints_written() == 1);
  }
  for (const auto& [key, slice] : at_checkpoint[1]) REQUIRE(slice.first == 3);

  // Updates after the checkpoint are lost with the process.
  for (Shard& s : shards) s.PushRound(3);
  REQUIRE(shards[1].server.process->Signal(SIGKILL).ok());
  absl::StatusOr<int> killed =
      shards[1].server.process->Wait(absl::Seconds(10));
  REQUIRE_OK(killed.status());
  CHECK(*killed == -SIGKILL);

  Shard restarted = StartShard(1, args);
  INFO(restarted.server.process->LogTail());
  // The worker registry is part of the checkpoint: the worker, its clock
  // and the pushes it had applied then (seqs 1 to 3) are known again.
  const StatusResponse st = restarted.Status();
  CHECK(st.restored_from().path() == CheckpointFile(dir, 1));
  CHECK(st.restored_from().workers() == 1);
  CHECK(st.restored_from().slice_updates() == 3 * at_checkpoint[1].size());
  CHECK(st.last_checkpoint().path().empty());
  REQUIRE(st.workers_size() == 1);
  CHECK(st.workers(0).incarnation() == 1);
  CHECK(st.workers(0).clock() == 3);
  CHECK(st.workers(0).pushes() == 3);
  REQUIRE(restarted.Take() == at_checkpoint[1]);
  CHECK(absl::StrContains(restarted.server.process->ReadLog(),
                          "restored checkpoint"));

  // A push acknowledged before the checkpoint and retried after the
  // restore is acknowledged again and not applied twice.
  restarted.seq = 1;  // resend seq 2
  CHECK(restarted.PushRound(1).duplicate());
  REQUIRE(restarted.Take() == at_checkpoint[1]);
  // The push of round 3 (seq 4) was acknowledged after the checkpoint and
  // is lost with the process: resent, it is applied (once).
  restarted.seq = 3;
  const PushResponse resent = restarted.PushRound(3);
  CHECK_FALSE(resent.duplicate());
  CHECK(resent.results_size() == static_cast<int>(at_checkpoint[1].size()));

  // Training goes on: a worker with a new incarnation pushes to it.
  restarted.incarnation = 2;
  restarted.PushRound(4);
  for (const auto& [key, slice] : restarted.Take()) CHECK(slice.first == 5);
  // The shard that stayed up is untouched.
  for (const auto& [key, slice] : shards[0].Take()) CHECK(slice.first == 4);
}

// A 300-element tensor in slices of 64 (SGD, lr 0.5) with init `init`.
TensorSpec Spec300(const std::string& name, Initializer init) {
  TensorSpec spec;
  spec.set_name(name);
  spec.add_shape(300);
  spec.set_init(init);
  spec.set_init_value(0.25f);
  spec.set_slice_elems(64);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  return spec;
}

// SIGKILL (no final checkpoint), then a restart on the same port.
void KillAndRestart(Shard& shard, const std::vector<std::string>& args) {
  const int port = std::stoi(
      shard.server.address.substr(shard.server.address.rfind(':') + 1));
  REQUIRE_OK(shard.server.process->Signal(SIGKILL));
  REQUIRE_OK(shard.server.process->Wait(absl::Seconds(10)).status());
  absl::StatusOr<ServerProcess> back =
      StartPsServer(0, kShards, args, absl::Seconds(30), port);
  REQUIRE_OK(back.status());
  shard.server = *std::move(back);
  shard.stub = ParameterServer::NewStub(MakeChannel(shard.server.address));
  ++shard.incarnation;
}

// Pulls Spec300 tensor `name` and checks its slices against `expected`
// (all 300 values) and `version`; returns the slices the shard holds.
std::vector<uint32_t> CheckPulled(Shard& shard, const std::string& name,
                                  const std::vector<float>& expected,
                                  uint64_t version) {
  PullRequest pull;
  *pull.mutable_worker() = shard.Ref();
  pull.add_tensors(name);
  PullResponse pulled;
  REQUIRE(shard.stub->Pull(Context().get(), pull, &pulled).ok());
  REQUIRE(pulled.slices_size() > 0);
  std::vector<uint32_t> held;
  for (const SliceData& d : pulled.slices()) {
    held.push_back(d.slice());
    CHECK(d.version() == version);
    std::vector<float> values(d.values().size() / sizeof(float));
    DecodeFloats(d.values(), values.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      INFO("slice " << d.slice() << " element " << i);
      CHECK(values[i] == expected[d.slice() * 64 + i]);
    }
  }
  return held;
}

TEST_CASE(
    "values given at creation (INIT_VALUES) survive a SIGKILL right after "
    "the creation answered",
    "[checkpoint][integration]") {
  const std::vector<std::string> args = {
      absl::StrCat("--checkpoint_dir=", testing::MakeTmpDir("ckpt-values"))};
  Shard shard = StartShard(0, args);
  std::vector<float> given(300);
  for (int i = 0; i < 300; ++i) given[i] = std::sin(0.1f * i) + 2.0f;
  CreateTensorRequest req;
  *req.add_tensors() = Spec300("given", INIT_VALUES);
  TensorValues* v = req.add_values();
  v->set_tensor("given");
  EncodeFloats(given.data(), given.size(), v->mutable_values());
  CreateTensorResponse resp;
  REQUIRE(shard.stub->CreateTensor(Context().get(), req, &resp).ok());
  // Answered: a checkpoint holds the values (no --checkpoint_every_s).
  KillAndRestart(shard, args);
  CheckPulled(shard, "given", given, 0);
}

TEST_CASE("an assign survives a SIGKILL right after it was answered",
          "[checkpoint][integration]") {
  const std::vector<std::string> args = {
      absl::StrCat("--checkpoint_dir=", testing::MakeTmpDir("ckpt-assign"))};
  Shard shard = StartShard(0, args);
  CreateTensorRequest create;
  *create.add_tensors() = Spec300("loaded", INIT_CONSTANT);
  CreateTensorResponse created;
  REQUIRE(shard.stub->CreateTensor(Context().get(), create, &created).ok());
  // Every slice this shard holds (a pull says which) is assigned.
  const std::vector<uint32_t> held =
      CheckPulled(shard, "loaded", std::vector<float>(300, 0.25f), 0);
  std::vector<float> given(300);
  for (int i = 0; i < 300; ++i) given[i] = std::cos(0.05f * i) - 3.0f;
  PushRequest assign;
  *assign.mutable_worker() = shard.Ref();
  assign.set_seq(1);
  assign.set_assign(true);
  for (uint32_t slice : held) {
    SliceGradient* g = assign.add_grads();
    g->set_tensor("loaded");
    g->set_slice(slice);
    const size_t n = std::min<size_t>(64, 300 - slice * 64);
    EncodeFloats(given.data() + slice * 64, n, g->mutable_grad());
  }
  PushResponse answered;
  REQUIRE(shard.stub->Push(Context().get(), assign, &answered).ok());
  REQUIRE(answered.results_size() == static_cast<int>(held.size()));
  // Answered: a checkpoint holds the assigned values (no
  // --checkpoint_every_s), so the restart does not go back to 0.25.
  KillAndRestart(shard, args);
  REQUIRE(CheckPulled(shard, "loaded", given, 1) == held);
}

TEST_CASE("SIGTERM writes a final checkpoint that the restart restores",
          "[checkpoint][integration]") {
  const std::string dir = testing::MakeTmpDir("ckpt-term");
  const std::vector<std::string> args = {
      absl::StrCat("--checkpoint_dir=", dir)};
  Shard shard = StartShard(0, args);
  CreateTensors(shard);
  for (int round = 0; round < 4; ++round) shard.PushRound(round);
  const Snapshot before = shard.Take();

  absl::StatusOr<int> code = shard.server.process->Kill(absl::Seconds(20));
  REQUIRE_OK(code.status());
  const std::string log = shard.server.process->ReadLog();
  INFO(log);
  CHECK(*code == 0);
  CHECK(
      absl::StrContains(log, "checkpoint written: " + CheckpointFile(dir, 0)));

  Shard restarted = StartShard(0, args);
  CHECK(restarted.Take() == before);
}

TEST_CASE("a corrupt or foreign checkpoint stops the start, naming the file",
          "[checkpoint][integration]") {
  const std::string dir = testing::MakeTmpDir("ckpt-bad");
  const std::vector<std::string> args = {
      absl::StrCat("--checkpoint_dir=", dir)};
  {
    Shard shard = StartShard(0, args);
    CreateTensors(shard);
    shard.PushRound(0);
    REQUIRE_OK(shard.server.process->Kill(absl::Seconds(20)).status());
  }
  const std::string path = CheckpointFile(dir, 0);
  const std::string good = ReadFile(path);
  REQUIRE(good.size() > 100);

  std::string corrupt = good;
  corrupt[corrupt.size() / 2] ^= 0x01;
  WriteFile(path, corrupt);
  {
    auto [code, log] = StartFailing(0, args);
    INFO(log);
    CHECK(code == 1);
    CHECK(absl::StrContains(log, "DATA_LOSS"));
    CHECK(absl::StrContains(log, path));
  }
  WriteFile(path, good.substr(0, good.size() - 10));
  {
    auto [code, log] = StartFailing(0, args);
    INFO(log);
    CHECK(code == 1);
    CHECK(absl::StrContains(log, "DATA_LOSS"));
    CHECK(absl::StrContains(log, path));
  }
  // Shard 0's intact file under shard 1's name.
  WriteFile(CheckpointFile(dir, 1), good);
  {
    auto [code, log] = StartFailing(1, args);
    INFO(log);
    CHECK(code == 1);
    CHECK(absl::StrContains(log, "FAILED_PRECONDITION"));
    CHECK(absl::StrContains(log, CheckpointFile(dir, 1)));
  }

  // --restore=false starts empty and serves.
  std::vector<std::string> no_restore = args;
  no_restore.push_back("--restore=false");
  Shard fresh = StartShard(0, no_restore);
  ListTensorsResponse list;
  REQUIRE(fresh.stub->ListTensors(Context().get(), ListTensorsRequest(), &list)
              .ok());
  CHECK(list.tensors_size() == 0);
}

TEST_CASE("Checkpoint RPC: off without a directory, periodic with one",
          "[checkpoint][integration]") {
  {
    Shard off = StartShard(0, {});
    CheckpointResponse resp;
    const grpc::Status s =
        off.stub->Checkpoint(Context().get(), CheckpointRequest(), &resp);
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(absl::StrContains(s.error_message(), "--checkpoint_dir"));
    auto [code, out] =
        Psctl({"checkpoint", absl::StrCat("--servers=", off.server.address)});
    INFO(out);
    CHECK(code == 1);
    CHECK(absl::StrContains(out, "FAILED"));
  }
  const std::string dir = testing::MakeTmpDir("ckpt-every");
  Shard shard = StartShard(
      0, {absl::StrCat("--checkpoint_dir=", dir), "--checkpoint_every_s=1"});
  CreateTensors(shard);
  const absl::Status periodic = testing::WaitFor(
      [&] { return shard.Status().counters().checkpoints_written() >= 2; },
      absl::Seconds(20), "two periodic checkpoints", absl::Milliseconds(100));
  REQUIRE_OK(periodic);

  // Concurrent requests are all answered, each by a write that started
  // after it arrived.
  std::vector<std::thread> callers;
  std::vector<grpc::Status> statuses(4);
  std::vector<CheckpointResponse> answers(4);
  const int64_t asked_ms = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&, i] {
      statuses[i] = shard.stub->Checkpoint(Context().get(), CheckpointRequest(),
                                           &answers[i]);
    });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < 4; ++i) {
    INFO(statuses[i].error_message());
    REQUIRE(statuses[i].ok());
    CHECK(answers[i].checkpoint().path() == CheckpointFile(dir, 0));
    CHECK(answers[i].checkpoint().unix_time_ms() >= asked_ms);
    CHECK(answers[i].checkpoint().tensors() == 3);
  }
}

TEST_CASE(
    "with --checkpoint_full_every a killed shard restores its full "
    "checkpoint and the deltas after it",
    "[checkpoint][delta][integration]") {
  const std::string dir = testing::MakeTmpDir("ckpt-delta");
  // Every round pushes every slice, so a delta is as large as a full
  // checkpoint: the fraction must not force full ones.
  const std::vector<std::string> args = {absl::StrCat("--checkpoint_dir=", dir),
                                         "--checkpoint_full_every=4",
                                         "--checkpoint_delta_max_fraction=10"};
  Shard shard = StartShard(1, args);
  CreateTensors(shard);
  // A checkpoint after each round: a full one, then deltas 1 and 2.
  std::vector<CheckpointInfo> written;
  for (int round = 0; round < 3; ++round) {
    shard.PushRound(round);
    CheckpointResponse answer;
    REQUIRE(
        shard.stub->Checkpoint(Context().get(), CheckpointRequest(), &answer)
            .ok());
    written.push_back(answer.checkpoint());
  }
  CHECK_FALSE(written[0].delta());
  CHECK(written[0].path() == CheckpointFile(dir, 1));
  CHECK(written[2].delta());
  CHECK(written[2].delta_sequence() == 2);
  CHECK(written[2].path() == absl::StrCat(dir, "/shard-1-of-2.delta-2"));
  const Snapshot at_checkpoint = shard.Take();
  shard.PushRound(3);  // after the last delta: lost with the process
  REQUIRE(shard.server.process->Signal(SIGKILL).ok());
  REQUIRE_OK(shard.server.process->Wait(absl::Seconds(10)).status());

  Shard restarted = StartShard(1, args);
  INFO(restarted.server.process->LogTail());
  const StatusResponse st = restarted.Status();
  CHECK(st.restored_from().path() == CheckpointFile(dir, 1));
  CHECK(st.restored_from().deltas_applied() == 2);
  CHECK(st.restored_from().deltas_ignored() == 0);
  REQUIRE(st.workers_size() == 1);
  CHECK(st.workers(0).clock() == 3);
  CHECK(st.workers(0).pushes() == 3);
  REQUIRE(restarted.Take() == at_checkpoint);

  // The restarted shard's first checkpoint is a full one; the old chain's
  // deltas are removed.
  CheckpointResponse answer;
  REQUIRE(
      restarted.stub->Checkpoint(Context().get(), CheckpointRequest(), &answer)
          .ok());
  CHECK_FALSE(answer.checkpoint().delta());
  struct stat st_buf;
  CHECK(::stat(absl::StrCat(dir, "/shard-1-of-2.delta-1").c_str(), &st_buf) !=
        0);
}

}  // namespace
}  // namespace asyncps
