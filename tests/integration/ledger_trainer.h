#ifndef ASYNCPS_TESTS_INTEGRATION_LEDGER_TRAINER_H_
#define ASYNCPS_TESTS_INTEGRATION_LEDGER_TRAINER_H_

// The exact ledger of the tests that change where keys live while a worker
// trains (live moves, psctl scale): a dense tensor and a sparse table under
// SGD with learning rate 1, and gradients of -1 for every element and row,
// so that every value equals the number of pushes acknowledged; an update
// lost or applied twice shows.
//
// Example:
//
//   std::unique_ptr<PsClient> c = ConnectClient(addresses);
//   LedgerTrainer t;
//   t.Start(c.get());          // creates the ledger, trains 10 steps
//   ... move slots ...
//   t.Stop();
//   REQUIRE_OK(t.error);
//   CHECK(LedgerWrong(ConnectClient(addresses).get(), t.ids,
//                     t.acked.load()) == 0);

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "client/ps_client.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace testing {

constexpr int kLedgerDim = 4;          // of the table's rows
constexpr int kLedgerElems = 64 * 16;  // 64 slices of 16
constexpr int kLedgerRows = 300;       // ids LedgerIds() gives

// A table with state beyond its values (uniform init, Adagrad), for the
// tests that check a move or a reshard carries every byte of it.
TableSpec AdagradTable(int dim);

TensorSpec LedgerTensor();  // "w"
TableSpec LedgerTable();    // "emb"
std::vector<uint64_t> LedgerIds();

// A client of the shards at `addresses` (60 s call deadline), waited for
// and registered; the test fails (REQUIRE) when they do not answer.
std::unique_ptr<PsClient> ConnectClient(
    const std::vector<std::string>& addresses);
std::unique_ptr<PsClient> ConnectClient(
    const std::vector<ServerProcess>& cluster);

// Runs tools/psctl with `args` (120 s at most): its exit status and output.
std::pair<int, std::string> Psctl(const std::vector<std::string>& args);

// Trains until told to stop: every step pulls everything and pushes -1 for
// every element and row. Counts the pushes acknowledged; the first error
// ends it.
struct LedgerTrainer {
  PsClient* client = nullptr;
  std::vector<uint64_t> ids = LedgerIds();
  std::atomic<int64_t> acked{0};
  std::atomic<bool> stop{false};
  // Written by the training thread only as it ends (read it once `ended`,
  // or after Stop).
  absl::Status error;
  std::atomic<bool> ended{false};
  int64_t stale = 0;
  absl::Notification warmed;  // 10 steps done, or ended
  std::thread thread;         // Start's

  // Creates the ledger's table and tensor through `c`, then trains on a
  // thread of its own; returns once 10 steps are done (the test fails,
  // REQUIRE, when that takes over 60 s or the training fails).
  void Start(PsClient* c);
  // Ends the training and joins its thread (also on destruction).
  void Stop();
  ~LedgerTrainer() { Stop(); }

  void Run();
  // Until `more` pushes beyond `from` are acknowledged, an error, or 30 s.
  void WaitForPushes(int64_t from, int64_t more) const;
};

// How many values of "w" and of `ids`' rows (peeked by `reader`) differ
// from `acked`; -1 when the pull fails.
int LedgerWrong(PsClient* reader, const std::vector<uint64_t>& ids,
                int64_t acked);

}  // namespace testing
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_INTEGRATION_LEDGER_TRAINER_H_
