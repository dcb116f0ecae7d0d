#ifndef ASYNCPS_TESTS_STALENESS_HARNESS_H_
#define ASYNCPS_TESTS_STALENESS_HARNESS_H_

// Shared pieces of the staleness tests: a one-shard ps_server started with a
// staleness policy, simulated workers (one PsClient each), raw stubs for what
// PsClient does not expose, and calls that run on their own thread so a test
// can watch a blocking pull. Whether a pull waits is read from the shard's
// Status, never inferred from time passing; every wait has a deadline that
// only bounds a hang (no timing assertions).
//
// Assertions (Catch2) are made only on the test's main thread; background
// threads record statuses and times for the main thread to check.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace staleness {

// A constant-initialized tensor trained by plain SGD with learning rate `lr`:
// after gradients g are applied with scales s the value is
// init - sum(lr * s * g), exactly for values chosen representable.
TensorSpec ConstantSgdSpec(const std::string& name, int64_t elems,
                           float init_value, float lr, int64_t slice_elems);

// Starts one ps_server shard with `flags` (e.g. "--consistency=bsp").
absl::StatusOr<testing::ServerProcess> StartShard(
    const std::vector<std::string>& flags);

// A simulated worker: a PsClient that makes one attempt per call (so that a
// test sees the server's own answer, not a retry) with a generous RPC
// deadline.
absl::StatusOr<std::unique_ptr<PsClient>> ConnectWorker(
    const std::string& address, int32_t worker_id, uint64_t incarnation = 0,
    absl::Duration rpc_timeout = absl::Seconds(20));

// One shard's Status through a raw stub (deadline 10 s).
absl::StatusOr<StatusResponse> GetStatus(ParameterServer::Stub* stub);

// The status of `worker_id` in `status`, or nullptr.
const WorkerStatus* FindWorker(const StatusResponse& status, int32_t worker_id);

// Raw Heartbeat for (worker_id, incarnation) at `clock` (deadline 10 s).
absl::Status RawHeartbeat(ParameterServer::Stub* stub, int32_t worker_id,
                          uint64_t incarnation, int64_t clock);

// Runs `fn` once on its own thread and records when it finished and what it
// returned. The destructor joins the thread, so `fn` must end by itself
// (every call it makes has a deadline).
//
// Thread-safe.
class BackgroundCall {
 public:
  explicit BackgroundCall(std::function<absl::Status()> fn);
  ~BackgroundCall();
  BackgroundCall(const BackgroundCall&) = delete;
  BackgroundCall& operator=(const BackgroundCall&) = delete;

  bool done() const;
  // Waits up to `timeout` for `fn` to return; true if it has.
  bool WaitDone(absl::Duration timeout) const;
  // REQUIRES: done().
  absl::Status status() const;
  absl::Time started() const { return started_; }
  // REQUIRES: done().
  absl::Time finished() const;

 private:
  const absl::Time started_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time finished_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Heartbeats (worker_id, incarnation) at `clock` every `period` until
// destroyed, so that a worker the test keeps waiting (or holds back on
// purpose) is never evicted by its lease. Failures are counted, not fatal.
//
// Thread-safe.
class KeepAlive {
 public:
  KeepAlive(const std::string& address, int32_t worker_id, uint64_t incarnation,
            int64_t clock, absl::Duration period = absl::Milliseconds(100));
  ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  int64_t beats() const { return beats_.load(); }
  int64_t failures() const { return failures_.load(); }

  // Stops the heartbeats (and waits for the thread); idempotent.
  void Stop();
  // When the last heartbeat was sent (before its RPC started); the shard
  // saw the worker no earlier than this. InfinitePast() before the first.
  absl::Time last_beat_started() const;

 private:
  std::unique_ptr<ParameterServer::Stub> stub_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_beat_started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<int64_t> beats_{0};
  std::atomic<int64_t> failures_{0};
  std::thread thread_;
};

// One shard started with a policy, and a raw stub to it. Checks with Catch2
// assertions, so only for use inside a TEST_CASE.
struct Shard {
  testing::ServerProcess server;
  std::unique_ptr<ParameterServer::Stub> stub;

  const std::string& address() const { return server.address; }

  StatusResponse Status();

  // Waits until the shard has counted `n` pulls that had to wait.
  void AwaitPullWaits(uint64_t n);

  // The pulls of `worker_id` the shard holds waiting on the consistency
  // model now (WorkerStatus.waiting_pulls; 0 for an unknown worker). A
  // shard decides whether a clock change releases a waiting pull before it
  // answers the call that changed the clock, so after that call returned
  // this says whether the pull still waits: no time window involved.
  uint32_t WaitingPulls(int32_t worker_id);
  // Waits until WaitingPulls(worker_id) == n.
  void AwaitWaitingPulls(int32_t worker_id, uint32_t n);

  // Ends the shard by PID (SIGTERM, then SIGKILL) and checks that it shut
  // down cleanly (exit 0 within the grace, not SIGKILLed). REQUIRES: every
  // other client of the shard is closed (its graceful shutdown waits for
  // connected clients to hang up).
  void Stop();
};

// StartShard(flags) plus a stub; REQUIREs that it started.
Shard StartOneShard(const std::vector<std::string>& flags);

}  // namespace staleness
}  // namespace asyncps

#endif  // ASYNCPS_TESTS_STALENESS_HARNESS_H_
