#include "client/data_stream.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"

namespace asyncps {

// One stream (one gRPC call). Keeps itself alive until gRPC is done with it:
// a hold is taken at the start and released once no write will be started
// any more, so OnDone cannot come while a write is being started.
class DataStream::Call
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Call(const IdOf* id_of) : id_of_(id_of) {}

  void Begin(std::shared_ptr<Call> self, grpc::GenericStub* stub,
             const std::string& method) {
    self_ = std::move(self);
    stub->PrepareBidiStreamingCall(&ctx_, method, grpc::StubOptions(), this);
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

  void WaitDone() { done_.WaitForNotification(); }

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
    absl::StatusOr<uint64_t> id = (*id_of_)(in_);
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
    done_.Notify();
    self_.reset();  // may delete this
  }

 private:
  // No further requests are taken.
  void End() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ended_ = true; }

  const IdOf* const id_of_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;  // touched only by the one read in flight
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Done> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> writes_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification done_;
  std::shared_ptr<Call> self_;  // set by Begin, dropped by OnDone
};

DataStream::DataStream(std::shared_ptr<grpc::Channel> channel,
                       std::string method, IdOf id_of)
    : channel_(std::move(channel)),
      method_(std::move(method)),
      id_of_(std::move(id_of)),
      stub_(channel_) {}

DataStream::~DataStream() {
  std::shared_ptr<Call> call;
  {
    absl::MutexLock l(&mu_);
    call = std::move(call_);
  }
  if (call != nullptr) {
    call->Cancel();
    call->WaitDone();
  }
}

void DataStream::Send(uint64_t id, grpc::ByteBuffer request, Done done) {
  for (;;) {
    std::shared_ptr<Call> call;
    bool fresh = false;
    {
      absl::MutexLock l(&mu_);
      if (call_ == nullptr) {
        call_ = std::make_shared<Call>(&id_of_);
        fresh = true;
      }
      call = call_;
    }
    if (fresh) call->Begin(call, &stub_, method_);
    // A copy: if the stream has just ended, the request goes to the next.
    if (call->Send(id, request, done)) return;
    absl::MutexLock l(&mu_);
    if (call_ == call) call_ = nullptr;
  }
}

void DataStream::Cancel() {
  std::shared_ptr<Call> call;
  {
    absl::MutexLock l(&mu_);
    call = std::move(call_);
  }
  if (call != nullptr) call->Cancel();
}

}  // namespace asyncps
