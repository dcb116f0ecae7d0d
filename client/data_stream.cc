#include "client/data_stream.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace asyncps {

// One stream (one gRPC call on the owner's DrivenQueue), kept by its
// DataStream until its last operation completed. At most one write and one
// read are in flight; the start of the call counts as the first write, so
// requests queue behind it. Once the stream has ended (a read or write
// failed) and neither is in flight, Finish collects the status, fails the
// requests still pending with it, and hands the stream back to its owner.
class DataStream::Call {
 public:
  explicit Call(DataStream* owner) : owner_(owner) {}

  void Begin() {
    rw_ =
        owner_->stub_.PrepareCall(&ctx_, owner_->method_, owner_->queue_->cq());
    rw_->StartCall(&start_op_);
  }

  // Queues a request; false once the stream has ended (open a new one).
  bool Send(uint64_t id, grpc::ByteBuffer request, Done done) {
    grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock l(&mu_);
      if (ended_) return false;
      pending_.emplace(id, std::move(done));
      writes_.push_back(std::move(request));
      if (!writing_) {
        writing_ = true;
        start = &writes_.front();
      }
    }
    // No Finish while writing_ holds: the stream is still there.
    if (start != nullptr) rw_->Write(*start, &write_op_);
    return true;
  }

  void Cancel() { ctx_.TryCancel(); }

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

  void OnStarted(bool ok) {
    grpc::ByteBuffer* first = nullptr;
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      if (ok) {
        reading_ = true;
        if (!writes_.empty()) first = &writes_.front();
      } else {
        ended_ = true;
      }
      if (first == nullptr) {
        writing_ = false;
        writes_.clear();
        finish = TakeFinish();
      }
    }
    if (ok) rw_->Read(&in_, &read_op_);
    if (first != nullptr) rw_->Write(*first, &write_op_);
    if (finish) rw_->Finish(&status_, &finish_op_);
  }

  void OnWriteDone(bool ok) {
    grpc::ByteBuffer* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      writes_.pop_front();
      if (!ok) ended_ = true;
      if (!ended_ && !writes_.empty()) {
        next = &writes_.front();
      } else {
        writing_ = false;
        writes_.clear();
        finish = TakeFinish();
      }
    }
    if (next != nullptr) rw_->Write(*next, &write_op_);
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
    rw_->Read(&in_, &read_op_);
  }

  void OnFinished(bool) {
    absl::Status s = FromGrpcStatus(status_);
    if (s.ok()) s = absl::UnavailableError("the shard ended the stream");
    absl::flat_hash_map<uint64_t, Done> pending;
    {
      absl::MutexLock l(&mu_);
      pending.swap(pending_);
    }
    for (auto& [id, done] : pending) done(s, nullptr);
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
  grpc::ByteBuffer in_;  // touched only by the one read in flight
  grpc::Status status_;  // written by Finish
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Done> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  // The start, then a write, is in flight.
  bool writing_ ABSL_GUARDED_BY(mu_) = true;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
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
  for (;;) {
    std::shared_ptr<Call> call;
    std::vector<std::shared_ptr<Call>> ended;  // deleted on return
    bool fresh = false;
    {
      absl::MutexLock l(&mu_);
      ended = TakeFinished();
      if (current_ == nullptr) {
        current_ = std::make_shared<Call>(this);
        calls_.push_back(current_);
        fresh = true;
      }
      call = current_;
    }
    if (fresh) call->Begin();
    // A copy: if the stream has just ended, the request goes to the next.
    if (call->Send(id, request, done)) return;
    absl::MutexLock l(&mu_);
    if (current_ == call) current_ = nullptr;
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
  std::shared_ptr<Call> call;
  {
    absl::MutexLock l(&mu_);
    call = std::move(current_);
  }
  if (call != nullptr) call->Cancel();
}

}  // namespace asyncps
