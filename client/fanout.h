#ifndef ASYNCPS_CLIENT_FANOUT_H_
#define ASYNCPS_CLIENT_FANOUT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/driven_queue.h"
#include "common/clock.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// How a call to the shards rides out failures.
struct RetryPolicy {
  // Every call (all its attempts on all shards) ends at most this long after
  // it started, with DEADLINE_EXCEEDED: long enough to ride out a shard
  // restart, bounded so that nothing waits forever.
  absl::Duration call_deadline = absl::Minutes(5);
  // Deadline of one attempt of a unary RPC. Stream requests have none: their
  // connection is watched by HTTP/2 keepalive (common/net.h).
  absl::Duration attempt_timeout = absl::Minutes(2);
  // Backoff before retry n: initial_backoff * 2^(n-1), capped at max_backoff,
  // times a random factor in [0.5, 1.5). With gRPC's reconnect backoff
  // capped at 500 ms (common/net.h), a restarted shard is reached again
  // within about half a second; a shard that stays away costs a few failed
  // connection attempts per second.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Milliseconds(250);
  // While a shard keeps failing, one log line this often.
  absl::Duration report_every = absl::Seconds(5);
  // Attempts per shard at most; 0 = as many as the deadline allows.
  int max_attempts = 0;
  // When set, the call gives up (CANCELLED, "stopped") within about 100 ms
  // of *stop turning true: for waits a signal must be able to end (pulls
  // that wait for slower workers, waiting for shards or tensors), not for
  // pushes, which a stopping worker drains. Not owned.
  const std::atomic<bool>* stop = nullptr;
  // With `stop`: called on the waiting thread before it reads `stop`, about
  // every 100 ms while a call waits (never for a call answered sooner); it
  // may turn `stop` true. For a stop that only the waiting thread can see
  // (the Python binding looks for signals on Python's main thread here).
  std::function<void()> poll;
};

// True for the failures a call retries: the shard is out of reach, restarting
// or shutting down (UNAVAILABLE, DEADLINE_EXCEEDED of an attempt, CANCELLED
// by the shard).
bool IsRetriable(const absl::Status& s);

// What a FanOut needs from its owner. Pointers are not owned.
struct FanOutEnv {
  // Times deadlines, backoffs and reports (monotonic: see PsClientOptions).
  Clock* clock = Clock::Monotonic();
  std::shared_ptr<spdlog::logger> logger;  // required
  // "shard 1 (10.0.0.2:7000)", for messages.
  std::function<std::string(int shard)> shard_name;
  // The queue every attempt completes on (DataStream::queue(),
  // DrivenQueue::StartUnary): the waiting thread drives it. Null: attempts
  // complete on gRPC's threads (the callback API).
  DrivenQueue* queue = nullptr;
};

// One call to a set of shards: one attempt per shard at a time, all shards
// concurrently, each retried on its own with backoff while its failure is
// retriable, until it succeeds, fails for good, or the call's deadline
// passes. The one retry engine of asyncps: PsClient's unary RPCs and stream
// requests, and psctl's queries, all run through it.
//
// A call that waits long says so: one info line per report_every while an
// attempt has been in flight that long without an answer (e.g. a pull held
// back by slower workers under SSP/BSP), so no wait is silent.
//
// Thread-compatible: one thread starts and waits; attempts complete on any
// thread. Everything but recording completions (retries, on_ok) happens on
// the waiting thread.
class FanOut {
 public:
  using Done = std::function<void(absl::Status)>;

  struct Call {
    int shard = 0;
    // Starts one attempt; it ends with done(status) exactly once, on any
    // thread. `ctx` is a fresh context carrying the attempt's deadline, for
    // unary RPCs; null for a call with a `cancel` (a stream request).
    std::function<void(grpc::ClientContext* ctx, Done done)> start;
    // Aborts an attempt in flight of a call that uses no context (a stream
    // request): called when the call is given up. Set for stream requests
    // only; such a call's attempts get no context.
    std::function<void()> cancel;
    // Runs on the waiting thread after a successful attempt; an error is
    // final. Optional.
    std::function<absl::Status()> on_ok;
  };

  // `stop_on_error`: the first final failure cancels the other shards'
  // attempts (PsClient); false: every shard runs to its own end (psctl).
  FanOut(FanOutEnv env, std::string method, RetryPolicy policy,
         bool stop_on_error = true);
  ~FanOut();  // waits for attempts still in flight
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // Starts the first attempt of every call. Once only.
  void Start(std::vector<Call> calls);

  // Waits for every call to end (retrying on this thread) and returns the
  // first final error, annotated with the method and shard; OK when all
  // succeeded.
  absl::Status Wait();
  // Waits likewise and returns each call's outcome, in call order.
  std::vector<absl::Status> WaitAll();

 private:
  struct Shared;
  struct Slot;

  void StartAttempt(int i);
  // Cancels every attempt in flight (their callbacks still run).
  void CancelInFlight();
  void Fail(int i, const absl::Status& s);
  // The loop that starts, retries, abandons and settles the attempts, on
  // the waiting thread.
  void Run();
  // Starts the attempts that are due and finishes the slots given up;
  // returns when the loop must look again.
  absl::Time TendSlots(bool gave_up, absl::Time now);
  // An attempt of slot i ended with `status`: finished, failed or retried.
  void Settle(int i, absl::Status status, bool gave_up);
  // Schedules another attempt of slot i after a backoff, when `status` is
  // retriable and time and attempts are left; false otherwise.
  bool ScheduleRetry(int i, const absl::Status& status, bool gave_up,
                     const std::string& where);

  const FanOutEnv env_;
  const std::string method_;
  const RetryPolicy policy_;
  const bool stop_on_error_;
  absl::Time deadline_;
  std::vector<Call> calls_;
  std::vector<Slot> slots_;
  std::vector<absl::Status> results_;
  absl::Status first_error_;
  int unfinished_ = 0;
  bool waited_ = false;
  std::shared_ptr<Shared> shared_;  // completions, shared with callbacks
  absl::BitGen rng_;                // backoff jitter
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_FANOUT_H_
