#include "tests/integration/ledger_trainer.h"

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

TensorSpec LedgerTensor() {
  TensorSpec w;
  w.set_name("w");
  w.add_shape(kLedgerElems);
  w.set_slice_elems(16);
  w.mutable_optimizer()->set_type(OPT_SGD);
  w.mutable_optimizer()->set_learning_rate(1.0f);
  return w;
}

TableSpec LedgerTable() {
  TableSpec t;
  t.set_name("emb");
  t.set_dim(kLedgerDim);
  t.mutable_optimizer()->set_type(OPT_SGD);
  t.mutable_optimizer()->set_learning_rate(1.0f);
  return t;
}

std::vector<uint64_t> LedgerIds() {
  std::vector<uint64_t> ids;
  for (int i = 0; i < kLedgerRows; ++i) ids.push_back(uint64_t{7919} * i + 3);
  return ids;
}

std::unique_ptr<PsClient> ConnectClient(
    const std::vector<ServerProcess>& cluster) {
  std::vector<std::string> addresses;
  for (const ServerProcess& s : cluster) addresses.push_back(s.address);
  return ConnectClient(addresses);
}

std::unique_ptr<PsClient> ConnectClient(
    const std::vector<std::string>& addresses) {
  PsClientOptions o;
  o.servers = addresses;
  o.retry.call_deadline = absl::Seconds(60);
  std::unique_ptr<PsClient> c = PsClient::Connect(o).value();
  REQUIRE_OK(c->WaitForShards(absl::Seconds(30)));
  REQUIRE_OK(c->Register().status());
  return c;
}

std::pair<int, std::string> Psctl(const std::vector<std::string>& args) {
  absl::StatusOr<ToolRun> run =
      RunTool("tools/psctl", args, absl::Seconds(120));
  REQUIRE_OK(run.status());
  return {run->exit_code, run->output};
}

TableSpec AdagradTable(int dim) {
  TableSpec t;
  t.set_name("emb");
  t.set_dim(dim);
  t.set_init(INIT_UNIFORM);
  t.set_init_value(0.1f);
  t.set_seed(5);
  t.mutable_optimizer()->set_type(OPT_ADAGRAD);
  t.mutable_optimizer()->set_learning_rate(0.05f);
  t.mutable_optimizer()->set_epsilon(1e-8f);
  return t;
}

void LedgerTrainer::Start(PsClient* c) {
  REQUIRE_OK(c->CreateTables({LedgerTable()}));
  REQUIRE_OK(c->CreateTensors({LedgerTensor()}));
  client = c;
  thread = std::thread([this] { Run(); });
  REQUIRE(warmed.WaitForNotificationWithTimeout(absl::Seconds(60)));
  if (ended.load(std::memory_order_acquire)) REQUIRE_OK(error);
}

void LedgerTrainer::Stop() {
  stop = true;
  if (thread.joinable()) thread.join();
}

void LedgerTrainer::Run() {
  // Ended (an error, or stopped): whoever waits sees `ended`, and `error`
  // written before it.
  struct End {
    LedgerTrainer* t;
    ~End() {
      t->ended.store(true, std::memory_order_release);
      if (!t->warmed.HasBeenNotified()) t->warmed.Notify();
    }
  } end{this};
  std::vector<float> w(kLedgerElems), rows(ids.size() * kLedgerDim);
  const std::vector<float> gw(kLedgerElems, -1.0f), grows(rows.size(), -1.0f);
  for (int64_t step = 1; !stop.load() && step < 100000; ++step) {
    auto pull = client->StartPull(
        step, step, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data()}}});
    if (absl::Status s = pull->Wait(); !s.ok()) {
      error = s;
      return;
    }
    auto push = client->StartPush(
        step, PushSet{{{"w", gw.data()}}, {{"emb", ids, grows.data()}}},
        pull->read());
    absl::StatusOr<PushSummary> done = push->Wait();
    if (!done.ok()) {
      error = done.status();
      return;
    }
    stale += done->refused_stale + done->refused_restored;
    acked.fetch_add(1);
    if (step == 10) warmed.Notify();
  }
}

void LedgerTrainer::WaitForPushes(int64_t from, int64_t more) const {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (acked.load() < from + more && absl::Now() < until &&
         !ended.load(std::memory_order_acquire)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
}

int LedgerWrong(PsClient* reader, const std::vector<uint64_t>& ids,
                int64_t acked) {
  std::vector<float> w(kLedgerElems), rows(ids.size() * kLedgerDim);
  auto pull = reader->StartPull(
      1, 1, PullSet{{{"w", w.data()}}, {{"emb", ids, rows.data(), true}}});
  if (!pull->Wait().ok()) return -1;
  const float n = static_cast<float>(acked);
  int wrong = 0;
  for (float v : w) wrong += v != n;
  for (float v : rows) wrong += v != n;
  return wrong;
}

}  // namespace testing
}  // namespace asyncps
