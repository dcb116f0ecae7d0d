#ifndef ASYNCPS_SERVER_CHECKPOINTER_H_
#define ASYNCPS_SERVER_CHECKPOINTER_H_

// Background checkpoints of one shard: a Checkpointer calls options.capture
// (which copies the state while holding pushes back) and writes the image
// (server/checkpoint.h) on a thread of its own, every `every` and on request.
// PsServer owns one when checkpoints are on.
//
// Example:
//
//   CheckpointerOptions options;
//   options.dir = dir;
//   options.every = absl::Minutes(5);
//   options.capture = [&] {
//     PushGate::Closed closed(&gate);  // no push is applied during the copy
//     return CaptureCheckpoint(store, workers.Export(), absl::Now());
//   };
//   options.logger = logger;  // required
//   absl::StatusOr<std::unique_ptr<Checkpointer>> checkpointer =
//       Checkpointer::Start(std::move(options));
//   if (!checkpointer.ok()) return checkpointer.status();
//   // A Checkpoint RPC: answered once a checkpoint taken after it is on disk.
//   (*checkpointer)->Request([](const absl::StatusOr<CheckpointInfo>& info) {
//     /* answer with *info or the error */
//   });
//   // At shutdown: stop the thread, then write the last one here.
//   (*checkpointer)->Stop();
//   absl::StatusOr<CheckpointInfo> last = (*checkpointer)->WriteNow();

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "proto/asyncps.pb.h"
#include "server/checkpoint.h"
#include "server/checkpoint_delta.h"
#include "server/file_system.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct CheckpointerOptions {
  std::string dir;  // required; created if missing
  // Write a checkpoint this long after the previous one; 0 = only when
  // requested (and by WriteNow at shutdown).
  absl::Duration every = absl::ZeroDuration();
  // Captures the shard's state as one consistent cut (the shard holds its
  // pushes back meanwhile; see server/checkpoint.h). Required.
  std::function<CheckpointImage()> capture;
  // Incremental checkpoints (server/checkpoint_delta.h): every
  // `full_every`-th checkpoint is full and the ones between are deltas;
  // 0 or 1 = every checkpoint is full. A full one is also written first
  // after Start, after a failed full one, and once the chain's deltas
  // together reach `delta_max_fraction` of the full checkpoint's size. After
  // a full checkpoint is written, the deltas of the previous chain are
  // removed.
  int full_every = 1;
  double delta_max_fraction = 0.5;
  // Captures a delta of what changed at or after ChangeEpoch `since`, to
  // continue `chain` (CaptureDelta), as one consistent cut like `capture`.
  // Both set CheckpointImage::epoch. Required when full_every > 1.
  std::function<CheckpointImage(uint32_t since, const DeltaChain& chain)>
      capture_delta;
  // Dates the checkpoints; `every` is timed on the monotonic clock.
  Clock* clock = Clock::Real();            // not owned
  FileSystem* fs = FileSystem::Default();  // not owned; writes go here
  std::shared_ptr<spdlog::logger> logger;  // required
};

// Writes one shard's checkpoints (server/checkpoint.h) on a thread of its
// own, so that no gRPC thread waits on disk: periodically, and when asked.
// Requests that arrive while a checkpoint is being written are served
// together by the next write, which starts after all of them arrived (group
// commit), so every requester gets a checkpoint taken after its request.
// Each write logs one line and counts as written or failed; a failure
// that repeats itself (a full disk) is logged once a minute, with the count
// of the ones held back.
//
// Thread-safe.
class Checkpointer {
 public:
  using Done = std::function<void(const absl::StatusOr<CheckpointInfo>&)>;

  // Validates the options (INVALID_ARGUMENT), creates the directory (through
  // options.fs) if needed and checks that it is writable (errors by errno),
  // starts the thread.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Start(
      CheckpointerOptions options);
  ~Checkpointer();  // Stop()

  // Asks for a checkpoint; done(result) runs on the checkpoint thread once
  // it is written (or failed). After Stop, done(UNAVAILABLE) runs at once on
  // the calling thread.
  void Request(Done done);
  // As Request, and the checkpoint is a full one (not a delta): after a
  // change a delta cannot record, such as slices given away by a slot move.
  void RequestFull(Done done);

  // Stops the thread after serving the requests already made. Idempotent.
  void Stop();

  // Writes a checkpoint on the calling thread (at shutdown, after Stop), once
  // any write in progress has finished.
  absl::StatusOr<CheckpointInfo> WriteNow();

  // The last checkpoint written; empty when none.
  CheckpointInfo last() const;
  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t failed() const { return failed_.load(std::memory_order_relaxed); }
  // Why the last write failed; empty when the last write succeeded (or
  // none was tried).
  std::string last_error() const;

 private:
  // The chain the next delta continues (valid once a full checkpoint was
  // written by this Checkpointer).
  struct Chain {
    bool valid = false;
    DeltaChain next;
    uint32_t since = 0;  // the ChangeEpoch the next delta starts at
    uint64_t full_bytes = 0;
    uint64_t delta_bytes = 0;  // of the chain's deltas so far
    int deltas = 0;
  };

  explicit Checkpointer(CheckpointerOptions options);
  void Loop();
  // Whether the next checkpoint is a delta.
  bool NextIsDelta() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Records a checkpoint written (`crc`: its body's) in the chain; after a
  // full one, removes the previous chain's deltas.
  void Advance(const CheckpointImage& image, const CheckpointInfo& info,
               uint32_t crc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  void LogWritten(const CheckpointInfo& info) const;

  const CheckpointerOptions options_;
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> failed_{0};
  // A failure that lasts (a full disk) is logged once a minute, not at
  // every interval.
  LogLimiter failure_lines_{absl::Minutes(1)};

  // Serializes writes (the thread's and WriteNow's) to the one .tmp file;
  // held across the write's I/O and nothing else waits on it.
  absl::Mutex write_mu_;
  Chain chain_ ABSL_GUARDED_BY(write_mu_);
  // RequestFull calls so far, and the count the last full checkpoint
  // written served.
  std::atomic<uint64_t> full_asked_{0};
  uint64_t full_served_ ABSL_GUARDED_BY(write_mu_) = 0;

  mutable absl::Mutex mu_;
  std::vector<Done> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::condition_variable_any woken_;  // notified (under mu_) as either is
  CheckpointInfo last_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // started last, joined by Stop()
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINTER_H_
