#ifndef ASYNCPS_CLIENT_DATA_STREAM_H_
#define ASYNCPS_CLIENT_DATA_STREAM_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/driven_queue.h"

namespace asyncps {

// One long-lived stream of requests and answers to one shard on one
// channel: PullStream or PushStream (proto/asyncps.proto). Requests carry
// ids and are answered in any order; each Send's callback gets its answer or
// the stream's failure. A failed or ended stream is replaced by a new one on
// the next Send, so a restarted shard is reached again without the caller's
// help (the caller retries what failed). A stream that awaits no answer
// posts no read, so it learns that the shard ended it only from the next
// request, which then goes to a new stream by itself (requests must be safe
// to repeat: pushes carry sequence numbers).
//
// The streams' operations complete on a DrivenQueue: answer callbacks run on
// whichever thread waits on that queue (DrivenQueue::WaitUntil), so a caller
// waits for its answers through the queue, never on a plain condition
// variable. Callbacks must not block.
//
// Thread-safe. Streams are deleted only on the caller's threads (in Send,
// ReapFinished and the destructor), after their last operation completed.
class DataStream {
 public:
  // Called once per request: OK and the answer (the callback may keep or
  // take it), or the stream's failure (answer null).
  using Done = std::function<void(absl::Status, grpc::ByteBuffer* answer)>;
  // Reads the request id out of an answer.
  using IdOf = std::function<absl::StatusOr<uint64_t>(const grpc::ByteBuffer&)>;

  // `method`: the full method name. `channel` is shared with others; so is
  // `queue`, which must outlive this.
  DataStream(std::shared_ptr<grpc::Channel> channel, std::string method,
             IdOf id_of, DrivenQueue* queue);
  // Cancels the stream and waits until it has ended (every callback ran),
  // driving the queue meanwhile.
  ~DataStream();
  DataStream(const DataStream&) = delete;
  DataStream& operator=(const DataStream&) = delete;

  // Sends `request` (whose id is `id`, unique among this stream's pending
  // requests); done runs once it is answered or the stream fails.
  void Send(uint64_t id, grpc::ByteBuffer request, Done done);

  // The queue the answers complete on: wait for them with its WaitUntil.
  DrivenQueue* queue() const { return queue_; }

  // Ends the streams in use (the current one, and those still answering
  // requests sent before it took over): their pending requests fail with
  // CANCELLED. The next Send opens a new one.
  void Cancel();

  // Deletes the streams that have ended (the current one too, if it has),
  // which releases what gRPC still holds of their requests. Send does this
  // on its way; a stream no one sends on any more (to a shard that died or
  // moved) needs it from a caller's thread. Never call it from an answer
  // callback.
  void ReapFinished();

 private:
  class Call;

  // Sends on the current stream, opening one if there is none or it has
  // ended; false once the destructor has begun. `reap`: delete the streams
  // that have finished on the way (only on a caller's thread).
  bool SendOn(uint64_t id, grpc::ByteBuffer request, Done done, bool reap);
  // Called when a stream's last operation completed, its last touch of it.
  void Finished(const Call* call);
  // Takes the streams that have ended out of calls_, to delete them.
  std::vector<std::shared_ptr<Call>> TakeFinished()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::string method_;
  const IdOf id_of_;
  DrivenQueue* const queue_;
  grpc::GenericStub stub_;
  absl::Mutex mu_;
  std::shared_ptr<Call> current_ ABSL_GUARDED_BY(mu_);
  // Every stream not yet deleted (the current one, and ended ones whose
  // OnDone may not have run), and those whose OnDone has run.
  std::vector<std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<const Call*> finished_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_DATA_STREAM_H_
