#ifndef ASYNCPS_SERVER_FOLLOWER_H_
#define ASYNCPS_SERVER_FOLLOWER_H_

// A backup's end of the Follow stream (proto/replication.proto): it opens
// the stream to its primary, receives a snapshot when it needs one (into a
// checkpoint directory, written as checkpoints are: a temporary file,
// synced, renamed; restored by PsServer::Start as any checkpoint),
// then acknowledges every entry as it receives it, on the gRPC thread that
// read it, and applies the entries in order on a thread of its own through
// the same steps the primary ran (PsService::ApplyEntry), keeping them in
// its own log (so that, promoted, it can feed the others). An entry's
// acknowledgement waits neither for the entries before it to be applied
// nor for a thread to wake (each such wait, on a loaded machine, delayed
// every answer of the primary). Stop returns once every entry received is
// applied: every entry acknowledged is applied before a promotion.
//
// Example (a spare joining its group):
//
//   auto follower = Follower::Connect(o);     // snapshot written to o.dir
//   server = PsServer::Start(...restore from o.dir, epoch of the snapshot)
//   follower->Start(server->service());       // applies and acknowledges
//   ...
//   follower->Stop();                          // promoted, or moving on

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/security.h"
#include "proto/replication.pb.h"
#include "server/file_system.h"
#include "server/ps_service.h"
#include "server/replication_log.h"
#include "spdlog/spdlog.h"

namespace asyncps {

struct FollowerOptions {
  std::string primary;    // host:port
  FollowRequest request;  // run, shard, own address; last entry from `log`
  // Where a snapshot's file goes; when empty, a snapshot is refused
  // (FAILED_PRECONDITION: a running replica cannot load one).
  std::string snapshot_dir;
  // Where the snapshot is written (not owned); FileSystem::Default() when
  // null.
  FileSystem* fs = nullptr;
  ReplicationLog* log = nullptr;  // not owned
  SecurityOptions security;       // as the workers' channels
  std::shared_ptr<spdlog::logger> logger;
};

class Follower {
 public:
  // Opens the stream and reads up to the first entry: a snapshot's file
  // and its end (written to snapshot_dir; the log reset to its cut), or
  // nothing when the primary continues after the log's last entry.
  static absl::StatusOr<std::unique_ptr<Follower>> Connect(
      FollowerOptions options, absl::Duration timeout);
  ~Follower();  // Stop()
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  // The snapshot's shard epoch (0 when there was none).
  uint64_t snapshot_shard_epoch() const { return shard_epoch_; }

  // Applies entries on a thread of its own from now on. After a snapshot,
  // first tells the primary that this replica holds the state up to its
  // cut (the server restored it): the primary counts on a spare only from
  // then, not once it sent the snapshot, which the spare may have failed to
  // store (a full disk).
  void Start(PsService* service);
  // Ends the stream and waits for the thread: every entry received whole
  // is applied.
  void Stop();
  // Whether the stream ended (then why).
  bool ended() const { return ended_.load(); }
  absl::Status end_status() const;

 private:
  class Stream;  // the call, as gRPC's callbacks see it
  using FollowStub = grpc::TemplatedGenericStub<FollowUp, grpc::ByteBuffer>;

  explicit Follower(FollowerOptions options);
  absl::Status ReadSnapshot();
  void Loop(PsService* service);

  const FollowerOptions o_;
  grpc::ClientContext ctx_;
  std::unique_ptr<FollowStub> stub_;
  std::unique_ptr<Stream> stream_;
  uint64_t shard_epoch_ = 0;
  std::thread thread_;
  std::atomic<bool> ended_{false};
  mutable absl::Mutex mu_;
  absl::Status end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_FOLLOWER_H_
