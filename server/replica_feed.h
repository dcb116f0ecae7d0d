#ifndef ASYNCPS_SERVER_REPLICA_FEED_H_
#define ASYNCPS_SERVER_REPLICA_FEED_H_

// The primary's end of the Follow stream (proto/replication.proto): a
// backup that can continue from its last entry gets the entries after it;
// one that cannot gets a snapshot first (a checkpoint file taken at a cut
// of the log, server/replication_log.h), then the entries after the cut.
// Acknowledgements go to the log (ReplicationLog::Ack). A stream's snapshot
// is sent from a thread of its own (it blocks on the checkpoint and on the
// backup's flow control); from then on the stream has no thread: each
// entry is written by the thread that appended it, or by the completion of
// the write before it (a thread woken per entry cost the primary about as
// much CPU as serving the push). kMaxFeeds streams at once (streams that
// send nothing hold no thread); the backup's messages are read as bytes
// and parsed only once their cost in memory is known to be bounded
// (common/parse_cost.h: gRPC's typed parse of one 64 MiB message of empty
// unknown fields took a primary to 2.2 GB).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/task_threads.h"
#include "membership/member_record.h"  // ReplicaId: a replica in the log
#include "proto/replication.grpc.pb.h"
#include "server/replication_log.h"
#include "spdlog/spdlog.h"

namespace asyncps {

// A snapshot written for a backup: the checkpoint file and where the log
// stood.
struct FeedSnapshot {
  std::string name;   // a checkpoint file's name in its directory
  std::string bytes;  // and its contents
  uint64_t index = 0;
  uint64_t epoch = 0;
  uint64_t shard_epoch = 0;
};

struct ReplicaFeedOptions {
  std::string run_id;
  int shard_index = 0;
  int num_shards = 1;
  ReplicationLog* log = nullptr;  // not owned
  // Whether replica `id` (ReplicaId) is in the shard's group now: the feed
  // serves only those (a stale or stray process reads no state). Null =
  // any.
  std::function<bool(const std::string& id)> admits;
  // Writes a snapshot at a cut of the log.
  std::function<absl::StatusOr<FeedSnapshot>()> snapshot;
  std::shared_ptr<spdlog::logger> logger;
};

class ReplicaFeedService final
    : public Replication::WithRawCallbackMethod_Follow<Replication::Service> {
 public:
  static constexpr int kMaxFeeds = 16;

  explicit ReplicaFeedService(ReplicaFeedOptions options);
  // Waits for the snapshots still being sent (the server shut down first).
  ~ReplicaFeedService() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Follow(
      grpc::CallbackServerContext* ctx) override;

  class Stream;  // one Follow call

 private:
  // The streams past their snapshot, which the log's appends pump; shared
  // with the log's listener (it may outlive the service).
  struct Live {
    absl::Mutex mu;
    int open ABSL_GUARDED_BY(mu) = 0;  // streams started and not ended
    std::vector<std::shared_ptr<Stream>> streams ABSL_GUARDED_BY(mu);
    void Pump();
  };

  // The start of one stream's feed, on its thread: checks who asks, sends
  // a snapshot when needed, then hands the stream to `live_`.
  absl::Status Serve(const std::shared_ptr<Stream>& stream);
  // Sends the snapshot's file; returns its end marker's index.
  absl::StatusOr<uint64_t> SendSnapshot(Stream* stream, uint64_t reader);

  const ReplicaFeedOptions o_;
  const std::shared_ptr<Live> live_;
  TaskThreads feeds_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_FEED_H_
