#include "client/data_stream.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace asyncps {

// One stream (one gRPC call), owned by its DataStream, which keeps it until
// OnDone has run. A hold is taken at the start and released once no write
// will be started any more, so OnDone cannot come while a write is being
// started.
class DataStream::Call
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Call(DataStream* owner) : owner_(owner) {}

  void Begin() {
    owner_->stub_.PrepareBidiStreamingCall(&ctx_, owner_->method_,
                                           grpc::StubOptions(), this);
    AddHold();
    StartRead(&in_);
    StartCall();
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
    if (start != nullptr) StartWrite(start);
    return true;
  }

  void Cancel() { ctx_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    grpc::ByteBuffer* next = nullptr;
    bool release = false;
    {
      absl::MutexLock l(&mu_);
      writes_.pop_front();
      if (!ok) End();
      if (!ended_ && !writes_.empty()) {
        next = &writes_.front();
      } else {
        writing_ = false;
        writes_.clear();
        release = ended_ && !released_;
        if (release) released_ = true;
      }
    }
    if (next != nullptr) StartWrite(next);
    if (release) RemoveHold();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool release = false;
      {
        absl::MutexLock l(&mu_);
        End();
        release = !writing_ && !released_;
        if (release) released_ = true;
      }
      if (release) RemoveHold();
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
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status s = FromGrpcStatus(status);
    if (s.ok()) s = absl::UnavailableError("the shard ended the stream");
    absl::flat_hash_map<uint64_t, Done> pending;
    {
      absl::MutexLock l(&mu_);
      ended_ = true;
      pending.swap(pending_);
    }
    for (auto& [id, done] : pending) done(s, nullptr);
    owner_->Finished(this);  // may delete this
  }

 private:
  // No further requests are taken.
  void End() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ended_ = true; }

  DataStream* const owner_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;  // touched only by the one read in flight
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Done> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

DataStream::DataStream(std::shared_ptr<grpc::Channel> channel,
                       std::string method, IdOf id_of)
    : channel_(std::move(channel)),
      method_(std::move(method)),
      id_of_(std::move(id_of)),
      stub_(channel_) {}

DataStream::~DataStream() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock l(&mu_);
    current_ = nullptr;
    calls = calls_;
  }
  for (const auto& call : calls) call->Cancel();
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(
      +[](DataStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->finished_.size() == s->calls_.size();
      },
      this));
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
