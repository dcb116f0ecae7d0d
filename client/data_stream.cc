#include "client/data_stream.h"

#include <grpc/grpc.h>
#include <grpcpp/impl/codegen/completion_queue_tag.h>

#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

// gRPC's ByteBuffer names this class its friend, for code that hands a
// ByteBuffer's core buffer to gRPC's C API, as its own call operations do.
// Defined here, once in the program: the exchange below sends a request
// and receives an answer in one batch of that API.
namespace grpc::internal {
class GrpcByteBufferPeer {
 public:
  explicit GrpcByteBufferPeer(ByteBuffer* buffer) : buffer_(buffer) {}
  grpc_byte_buffer* c_buffer() { return buffer_->c_buffer(); }
  grpc_byte_buffer** c_buffer_ptr() { return buffer_->c_buffer_ptr(); }

 private:
  ByteBuffer* const buffer_;
};
}  // namespace grpc::internal

namespace asyncps {

// One stream (one gRPC call on the owner's DrivenQueue), kept by its
// DataStream until its last operation completed. At most one write and one
// read are in flight; the start of the call counts as the first write, so
// requests queue behind it. Once the stream has ended (a read or write
// failed, or Cancel) and neither is in flight, Finish collects the status,
// fails the requests still pending with it, and hands the stream back to its
// owner.
//
// A read is in flight only while an answer is awaited. gRPC 1.51 announces
// the window a newly posted read may fill at once, in a WINDOW_UPDATE of its
// own, whenever the stream has taken in bytes since its last announcement:
// a read posted as soon as each answer arrived cost every call a second
// write on the client and a second wake-up and read on the shard. So once no
// answer is awaited the stream posts no read (it is parked), and the next
// request goes out together with the read of its answer in one batch of
// gRPC's C API (an exchange), whose single write carries the window update.
// An exchange's write completes only with its answer, which the shard may
// hold (a pull waiting under SSP or BSP), so a request sent while one is in
// flight goes to a new stream instead of waiting behind it; that stream keeps
// a read posted for its first kPipelinedSends requests (pipelined callers),
// and the old one ends once it awaits nothing (it is retired).
class DataStream::Call {
 public:
  // What Send did with a request.
  enum class Sent { kQueued, kEnded, kBusy };

  // Requests that keep a read posted on a stream opened because the last
  // one was busy.
  static constexpr int kPipelinedSends = 64;

  Call(DataStream* owner, int pipelined_sends)
      : owner_(owner), pipelined_left_(pipelined_sends) {}

  void Begin() {
    rw_ =
        owner_->stub_.PrepareCall(&ctx_, owner_->method_, owner_->queue_->cq());
    rw_->StartCall(&start_op_);
  }

  // Queues a request (kQueued); kEnded once the stream has ended, kBusy while
  // an exchange is in flight: send it on a new stream.
  Sent Send(uint64_t id, grpc::ByteBuffer request, Done done) {
    Next next;
    {
      absl::MutexLock l(&mu_);
      if (ended_) return Sent::kEnded;
      if (exchanging_) return Sent::kBusy;
      pending_.emplace(id, std::move(done));
      writes_.push_back({id, std::move(request)});
      next = TakeNext();
    }
    // No Finish while writing_ holds: the stream is still there.
    Start(next);
    return Sent::kQueued;
  }

  // The owner sends on another stream now: this one ends as soon as it
  // awaits no answer.
  void Retire() {
    bool end = false;
    {
      absl::MutexLock l(&mu_);
      retired_ = true;
      end = !reading_ && !writing_ && pending_.empty() && !ended_;
    }
    if (end) Cancel();
  }

  void Cancel() {
    {
      // Before the cancel, so that an exchange it fails is not sent again.
      absl::MutexLock l(&mu_);
      cancelled_ = true;
      ended_ = true;
    }
    ctx_.TryCancel();
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      finish = TakeFinish();  // a parked stream has nothing in flight
    }
    if (finish) rw_->Finish(&status_, &finish_op_);
  }

 private:
  // One kind of operation's tag.
  class Op : public DrivenQueue::Op {
   public:
    Op(Call* call, void (Call::*on_complete)(bool))
        : call_(call), on_complete_(on_complete) {}
    void Complete(bool ok) override { (call_->*on_complete_)(ok); }

   private:
    Call* const call_;
    void (Call::*const on_complete_)(bool);
  };

  // An exchange's tag for gRPC's C API: the queue hands on the Op, as the
  // C++ API's operation sets do theirs.
  class CoreTag final : public grpc::internal::CompletionQueueTag {
   public:
    explicit CoreTag(DrivenQueue::Op* op) : op_(op) {}
    bool FinalizeResult(void** tag, bool* /*status*/) override {
      *tag = op_;
      return true;
    }

   private:
    DrivenQueue::Op* const op_;
  };

  // A request whose exchange failed, to be sent once more on a new stream.
  struct Resend {
    uint64_t id;
    grpc::ByteBuffer request;
    Done done;
  };

  // A request waiting to be written, and its id.
  struct Write {
    uint64_t id;
    grpc::ByteBuffer request;
  };

  // What to start once no write is in flight: the next queued request, as
  // an exchange when no read is posted (the stream is parked).
  struct Next {
    grpc::ByteBuffer* request = nullptr;  // writes_.front(); null: nothing
    bool exchange = false;
  };

  Next TakeNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Next next;
    if (writing_ || ended_ || writes_.empty()) return next;
    writing_ = true;
    next.request = &writes_.front().request;
    if (pipelined_left_ > 0) --pipelined_left_;
    if (!reading_) {    // parked: a read has completed, so the shard's initial
      reading_ = true;  // metadata has come (the first read asked for it)
      next.exchange = exchanging_ = true;
      exchange_id_ = writes_.front().id;
    }
    return next;
  }

  void Start(const Next& next) {
    if (next.exchange) {
      StartExchange(next.request);
    } else if (next.request != nullptr) {
      rw_->Write(*next.request, &write_op_);
    }
  }

  // Sends `request` (the front write) and reads its answer into in_, as
  // one batch.
  void StartExchange(grpc::ByteBuffer* request) {
    grpc_op ops[2];
    std::memset(ops, 0, sizeof(ops));
    // gRPC takes the slices out of the buffer it is given: hand it a copy
    // (of references, as the C++ API does), so that the request stays
    // whole for a resend.
    exchange_request_ = *request;
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message =
        grpc::internal::GrpcByteBufferPeer(&exchange_request_).c_buffer();
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message =
        grpc::internal::GrpcByteBufferPeer(&in_).c_buffer_ptr();
    // As gRPC's C++ API does with its own batches: a refused batch is a
    // broken invariant (one write and one read at a time).
    GPR_ASSERT(grpc_call_start_batch(ctx_.c_call(), ops, 2, &exchange_tag_,
                                     nullptr) == GRPC_CALL_OK);
  }

  void OnStarted(bool ok) {
    grpc::ByteBuffer* first = nullptr;
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      if (ok) {
        reading_ = true;
        if (!writes_.empty()) first = &writes_.front().request;
      } else {
        ended_ = true;
      }
      if (first == nullptr) {
        writing_ = false;
        writes_.clear();
        finish = TakeFinish();
      }
    }
    // The first read asks for the shard's initial metadata too.
    if (ok) rw_->Read(&in_, &read_op_);
    if (first != nullptr) rw_->Write(*first, &write_op_);
    if (finish) rw_->Finish(&status_, &finish_op_);
  }

  void OnWriteDone(bool ok) {
    Next next;
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      writes_.pop_front();
      writing_ = false;
      if (!ok) ended_ = true;
      if (ended_) {
        writes_.clear();
        finish = TakeFinish();
      } else {
        next = TakeNext();
      }
    }
    Start(next);
    if (finish) rw_->Finish(&status_, &finish_op_);
  }

  void OnReadDone(bool ok) {
    if (!ok) {
      bool finish = false;
      {
        absl::MutexLock l(&mu_);
        ended_ = true;
        reading_ = false;
        finish = TakeFinish();
      }
      if (finish) rw_->Finish(&status_, &finish_op_);
      return;
    }
    absl::StatusOr<uint64_t> id = owner_->id_of_(in_);
    Done done;
    if (id.ok()) {
      absl::MutexLock l(&mu_);
      auto it = pending_.find(*id);
      if (it != pending_.end()) {
        done = std::move(it->second);
        pending_.erase(it);
      }
    }
    if (done) done(absl::OkStatus(), &in_);
    in_.Clear();
    bool read = true;
    bool finish = false;
    bool end = false;
    {
      absl::MutexLock l(&mu_);
      if (pending_.empty() && (pipelined_left_ == 0 || retired_)) {
        read = false;  // parked until the next request
        reading_ = false;
        finish = TakeFinish();
        end = retired_ && !ended_ && !writing_;
      }
    }
    if (read) rw_->Read(&in_, &read_op_);
    if (finish) rw_->Finish(&status_, &finish_op_);
    if (end) Cancel();  // retired: nothing more will come this way
  }

  void OnExchanged(bool ok) {
    // ok with no message: the shard ended the stream.
    const bool answered = ok && in_.Valid();
    exchange_request_.Clear();
    {
      absl::MutexLock l(&mu_);
      exchanging_ = false;
      // The stream was parked, so it may have ended long before this
      // request was written to it: unless it is being cancelled, the
      // request goes to a new stream once this one has finished (a repeat
      // is harmless: pushes are de-duplicated by their sequence numbers).
      auto it = pending_.find(exchange_id_);
      if (!answered && !cancelled_ && it != pending_.end()) {
        resend_ = Resend{exchange_id_, writes_.front().request,
                         std::move(it->second)};
        pending_.erase(it);
      }
    }
    OnWriteDone(answered);
    OnReadDone(answered);
  }

  void OnFinished(bool) {
    absl::Status s = FromGrpcStatus(status_);
    if (s.ok()) s = absl::UnavailableError("the shard ended the stream");
    absl::flat_hash_map<uint64_t, Done> pending;
    std::optional<Resend> resend;
    {
      absl::MutexLock l(&mu_);
      pending.swap(pending_);
      resend.swap(resend_);
    }
    for (auto& [id, done] : pending) done(s, nullptr);
    if (resend.has_value() &&
        !owner_->SendOn(resend->id, resend->request, resend->done,
                        /*reap=*/false)) {
      resend->done(s, nullptr);  // the owner is closing
    }
    owner_->Finished(this);  // may delete this
  }

  // True once (the caller calls Finish) when the stream has ended and no
  // read or write is in flight any more.
  bool TakeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ended_ || reading_ || writing_ || finishing_) return false;
    finishing_ = true;
    return true;
  }

  DataStream* const owner_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> rw_;
  Op start_op_{this, &Call::OnStarted};
  Op write_op_{this, &Call::OnWriteDone};
  Op read_op_{this, &Call::OnReadDone};
  Op finish_op_{this, &Call::OnFinished};
  Op exchange_op_{this, &Call::OnExchanged};
  CoreTag exchange_tag_{&exchange_op_};
  grpc::ByteBuffer in_;                // touched only by the one read in flight
  grpc::ByteBuffer exchange_request_;  // what the exchange in flight sends
  grpc::Status status_;                // written by Finish
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Done> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<Write> writes_ ABSL_GUARDED_BY(mu_);
  // The start, then a write or an exchange, is in flight.
  bool writing_ ABSL_GUARDED_BY(mu_) = true;
  // A read or an exchange is in flight.
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool exchanging_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t exchange_id_ ABSL_GUARDED_BY(mu_) = 0;
  int pipelined_left_ ABSL_GUARDED_BY(mu_);
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Resend> resend_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
};

DataStream::DataStream(std::shared_ptr<grpc::Channel> channel,
                       std::string method, IdOf id_of, DrivenQueue* queue)
    : channel_(std::move(channel)),
      method_(std::move(method)),
      id_of_(std::move(id_of)),
      queue_(queue),
      stub_(channel_) {}

DataStream::~DataStream() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock l(&mu_);
    closing_ = true;  // no stream starts after this snapshot
    current_ = nullptr;
    calls = calls_;
  }
  for (const auto& call : calls) call->Cancel();
  queue_->WaitUntil(absl::InfiniteDuration(), [this] {
    absl::MutexLock l(&mu_);
    return finished_.size() == calls_.size();
  });
  // `calls` and calls_ delete the streams here, on the caller's thread.
}

void DataStream::Finished(const Call* call) {
  absl::MutexLock l(&mu_);
  finished_.insert(call);
}

std::vector<std::shared_ptr<DataStream::Call>> DataStream::TakeFinished() {
  std::vector<std::shared_ptr<Call>> out;
  if (finished_.empty()) return out;
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (finished_.erase(it->get()) > 0) {
      out.push_back(std::move(*it));
      it = calls_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void DataStream::Send(uint64_t id, grpc::ByteBuffer request, Done done) {
  if (!SendOn(id, std::move(request), done, /*reap=*/true)) {
    done(absl::CancelledError("the stream is being closed"), nullptr);
  }
}

bool DataStream::SendOn(uint64_t id, grpc::ByteBuffer request, Done done,
                        bool reap) {
  int pipelined = 0;  // a new stream's first requests that keep a read posted
  for (;;) {
    std::shared_ptr<Call> call;
    std::vector<std::shared_ptr<Call>> ended;  // deleted on return
    bool fresh = false;
    {
      absl::MutexLock l(&mu_);
      if (closing_) return false;
      if (reap) ended = TakeFinished();
      if (current_ == nullptr) {
        current_ = std::make_shared<Call>(this, pipelined);
        calls_.push_back(current_);
        fresh = true;
      }
      call = current_;
    }
    if (fresh) call->Begin();
    // A copy: if the stream has just ended, the request goes to the next.
    const Call::Sent sent = call->Send(id, request, done);
    if (sent == Call::Sent::kQueued) return true;
    {
      absl::MutexLock l(&mu_);
      if (current_ == call) current_ = nullptr;
    }
    if (sent == Call::Sent::kBusy) {
      call->Retire();
      pipelined = Call::kPipelinedSends;
    }
  }
}

void DataStream::ReapFinished() {
  // Deleted on return, outside the lock.
  std::shared_ptr<Call> current;
  std::vector<std::shared_ptr<Call>> ended;
  {
    absl::MutexLock l(&mu_);
    if (current_ != nullptr && finished_.contains(current_.get())) {
      current = std::move(current_);
    }
    ended = TakeFinished();
  }
}

void DataStream::Cancel() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock l(&mu_);
    current_ = nullptr;
    calls = calls_;  // the current stream and retired ones still answering
  }
  for (const auto& call : calls) call->Cancel();
}

}  // namespace asyncps
