// The protobuf Pull / Push RPCs (payloads inside the messages) and the data
// streams (PullStream / PushStream, payloads in frames) are two encodings of
// one protocol: the same requests, sent to two fresh ps_server processes,
// one through each, get the same answers (outcomes, staleness, versions,
// errors with their codes and messages), read back the same values, and
// leave the same counters.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/payload.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/stream_helpers.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

using google::protobuf::util::MessageDifferencer;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(10));
  return ctx;
}

// "w": 6 values in 2 slices of 3, Adam; "emb": rows of dim 2, Adagrad.
CreateTensorRequest Model() {
  CreateTensorRequest create;
  TensorSpec* w = create.add_tensors();
  w->set_name("w");
  w->add_shape(6);
  w->set_init(INIT_UNIFORM);
  w->set_init_value(0.5f);
  w->set_seed(3);
  w->set_slice_elems(3);
  OptimizerSpec* o = w->mutable_optimizer();
  o->set_type(OPT_ADAM);
  o->set_learning_rate(0.1f);
  o->set_beta1(0.9f);
  o->set_beta2(0.999f);
  o->set_epsilon(1e-8f);
  TableSpec* emb = create.add_tables();
  emb->set_name("emb");
  emb->set_dim(2);
  emb->set_init(INIT_UNIFORM);
  emb->set_init_value(0.05f);
  emb->set_seed(7);
  emb->mutable_optimizer()->set_type(OPT_ADAGRAD);
  emb->mutable_optimizer()->set_learning_rate(0.5f);
  emb->mutable_optimizer()->set_epsilon(1e-6f);
  emb->mutable_optimizer()->set_initial_accumulator(0.1f);
  return create;
}

WorkerRef Ref(int64_t clock) {
  WorkerRef ref;
  ref.set_worker_id(4);
  ref.set_incarnation(9);
  ref.set_clock(clock);
  return ref;
}

PullRequest Pull(int64_t clock, std::vector<uint64_t> ids) {
  PullRequest req;
  *req.mutable_worker() = Ref(clock);
  req.add_tensors("w");
  TableIds* rows = req.add_rows();
  rows->set_table("emb");
  for (uint64_t id : ids) rows->add_ids(id);
  return req;
}

PushRequest Push(uint64_t seq, int64_t clock) {
  PushRequest req;
  *req.mutable_worker() = Ref(clock);
  req.set_seq(seq);
  return req;
}

void AddSlice(PushRequest* req, const std::string& tensor, uint32_t slice,
              uint64_t read_version, std::vector<float> grad) {
  SliceGradient* g = req->add_grads();
  g->set_tensor(tensor);
  g->set_slice(slice);
  g->set_read_version(read_version);
  *g->mutable_grad() = testing::Floats(grad);
}

void AddRows(PushRequest* req, std::vector<uint64_t> ids,
             std::vector<uint64_t> read_versions, std::vector<float> grad) {
  RowsGradient* g = req->add_rows();
  g->set_table("emb");
  for (uint64_t id : ids) g->add_ids(id);
  for (uint64_t v : read_versions) g->add_read_versions(v);
  *g->mutable_grad() = testing::Floats(grad);
}

// One request of the sequence: a pull or a push.
struct Step {
  const char* what;
  bool is_pull;
  PullRequest pull;
  PushRequest push;
};

Step PullStep(const char* what, PullRequest pull) {
  return {what, true, std::move(pull), PushRequest()};
}
Step PushStep(const char* what, PushRequest push) {
  return {what, false, PullRequest(), std::move(push)};
}

// Pulls and pushes of one worker (read versions as the pulls before them
// answer; --max_staleness=1, inverse scaling): dense slices and rows
// applied, scaled and refused as stale, a retried seq, an assign, bad
// input, rows created by a pull.
std::vector<Step> Sequence() {
  std::vector<Step> steps;
  steps.push_back(PullStep("first pull", Pull(0, {1, 2, 3})));
  PushRequest fresh = Push(1, 0);
  AddSlice(&fresh, "w", 0, 0, {0.1f, -0.2f, 0.3f});
  AddSlice(&fresh, "w", 1, 0, {1.0f, 2.0f, -3.0f});
  AddRows(&fresh, {1, 2}, {0, 0}, {0.5f, -0.5f, 0.25f, 1.0f});
  steps.push_back(PushStep("fresh slices and rows", fresh));
  PushRequest scaled = Push(2, 0);
  AddSlice(&scaled, "w", 0, 0, {0.4f, 0.4f, 0.4f});
  AddRows(&scaled, {1, 2, 2}, {0, 0, 1}, {1, 1, 2, 2, 3, 3});
  steps.push_back(PushStep("staleness 1: applied, scaled", scaled));
  PushRequest stale = Push(3, 0);
  AddSlice(&stale, "w", 0, 0, {9, 9, 9});
  AddSlice(&stale, "w", 1, 1, {0.5f, 0.5f, 0.5f});
  AddRows(&stale, {1, 3}, {0, 0}, {9, 9, 0.1f, 0.1f});
  steps.push_back(PushStep("staleness 2: refused as stale", stale));
  steps.push_back(PushStep("a retry of seq 2", scaled));
  PushRequest assign = Push(4, 1);
  assign.set_assign(true);
  AddSlice(&assign, "w", 1, 0, {7, 8, 9});
  AddRows(&assign, {3, 4}, {}, {5, 6, -5, -6});
  steps.push_back(PushStep("an assign of a slice and rows", assign));
  PushRequest short_grad = Push(5, 1);
  AddSlice(&short_grad, "w", 0, 2, {1, 1});
  steps.push_back(PushStep("a wrong-length gradient", short_grad));
  PushRequest unknown = Push(5, 1);
  AddSlice(&unknown, "nope", 0, 0, {1, 1, 1});
  steps.push_back(PushStep("an unknown tensor", unknown));
  PushRequest future = Push(5, 1);
  AddSlice(&future, "w", 0, 99, {1, 1, 1});
  steps.push_back(PushStep("a read version from the future", future));
  steps.push_back(PullStep("last pull", Pull(1, {1, 2, 3, 4, 5})));
  PullRequest missing = Pull(1, {1});
  missing.add_tensors("nope");
  steps.push_back(PullStep("a pull of an unknown tensor", missing));
  return steps;
}

// An answer as the two paths can be compared: the call's status, and the
// response without the fields of one encoding (request_id, status,
// wire_dtype) or of one process (shard_epoch, waited_us).
struct Answer {
  int code = 0;
  std::string message;
  PushResponse push;
  PullResponse pull;
};

Answer Unary(ParameterServer::Stub* stub, const Step& step) {
  Answer a;
  grpc::Status s = step.is_pull
                       ? stub->Pull(Context().get(), step.pull, &a.pull)
                       : stub->Push(Context().get(), step.push, &a.push);
  a.code = s.error_code();
  a.message = s.error_message();
  a.pull.clear_shard_epoch();
  a.pull.clear_waited_us();
  return a;
}

Answer Streamed(testing::ShardStreams* streams, const Step& step) {
  Answer a;
  const CallStatus status = [&] {
    if (step.is_pull) {
      a.pull = streams->Pull(step.pull);
      return a.pull.status();
    }
    a.push = streams->Push(step.push);
    return a.push.status();
  }();
  a.code = status.code();
  a.message = status.message();
  a.push.clear_request_id();
  a.push.clear_status();
  a.pull.clear_request_id();
  a.pull.clear_status();
  a.pull.clear_wire_dtype();
  a.pull.clear_shard_epoch();
  a.pull.clear_waited_us();
  return a;
}

TEST_CASE(
    "the unary Push / Pull answer every request exactly as the streams do",
    "[stream][unary]") {
  const std::vector<std::string> flags = {
      "--log_level=warn", "--max_staleness=1", "--staleness_lr=inverse"};
  auto unary_shard = testing::StartPsServer(0, 1, flags);
  auto stream_shard = testing::StartPsServer(0, 1, flags);
  REQUIRE_OK(unary_shard.status());
  REQUIRE_OK(stream_shard.status());
  auto unary = ParameterServer::NewStub(MakeChannel(unary_shard->address));
  auto stream_stub =
      ParameterServer::NewStub(MakeChannel(stream_shard->address));
  testing::ShardStreams streams(MakeChannel(stream_shard->address));
  for (ParameterServer::Stub* stub : {unary.get(), stream_stub.get()}) {
    CreateTensorResponse created;
    REQUIRE(stub->CreateTensor(Context().get(), Model(), &created).ok());
  }

  std::vector<Answer> answers;
  for (const Step& step : Sequence()) {
    INFO(step.what);
    const Answer u = Unary(unary.get(), step);
    const Answer s = Streamed(&streams, step);
    CHECK(u.code == s.code);
    CHECK(u.message == s.message);
    std::string diff;
    MessageDifferencer differ;
    differ.ReportDifferencesToString(&diff);
    CHECK(differ.Compare(u.push, s.push));
    CHECK(differ.Compare(u.pull, s.pull));
    CHECK(diff.empty());
    answers.push_back(u);
  }

  // The sequence did what it says: the answers compared above include
  // every outcome.
  REQUIRE(answers.size() == 11);
  CHECK(answers[0].pull.slices_size() == 2);
  CHECK(answers[0].pull.rows(0).values().size() == 3 * 2 * sizeof(float));
  CHECK(answers[1].push.results(1).outcome() == APPLIED);
  CHECK(answers[1].push.row_results(0).applied() == 2);
  CHECK(answers[2].push.results(0).lr_scale() == 0.5f);
  CHECK(answers[2].push.row_results(0).scaled() == 2);
  CHECK(answers[3].push.results(0).outcome() == REFUSED_STALE);
  CHECK(answers[3].push.results(1).outcome() == APPLIED);
  CHECK(answers[3].push.row_results(0).refused_stale() == 1);
  CHECK(answers[4].push.duplicate());
  CHECK(answers[5].push.results(0).new_version() == 3);
  CHECK(answers[5].push.row_results(0).rows_created() == 1);
  CHECK(answers[6].code == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(answers[7].code == grpc::StatusCode::NOT_FOUND);
  CHECK(answers[8].code == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(answers[9].pull.rows(0).versions_size() == 5);
  CHECK(answers[10].code == grpc::StatusCode::NOT_FOUND);

  // The same counters, staleness histogram and tables on both shards.
  StatusResponse by_unary, by_stream;
  REQUIRE(unary->Status(Context().get(), StatusRequest(), &by_unary).ok());
  REQUIRE(
      stream_stub->Status(Context().get(), StatusRequest(), &by_stream).ok());
  CHECK(by_unary.counters().pushes() == 5);
  CHECK(by_unary.counters().rejected_bad_input() == 4);
  std::string diff;
  MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  CHECK(differ.Compare(by_unary.counters(), by_stream.counters()));
  CHECK(differ.Compare(by_unary.staleness(), by_stream.staleness()));
  REQUIRE(by_unary.tables_size() == 1);
  CHECK(differ.Compare(by_unary.tables(0), by_stream.tables(0)));
  REQUIRE(by_unary.workers_size() == 1);
  CHECK(by_unary.workers(0).clock() == by_stream.workers(0).clock());
  CHECK(by_unary.workers(0).pushes() == by_stream.workers(0).pushes());
  CHECK(diff.empty());
}

}  // namespace
}  // namespace asyncps
