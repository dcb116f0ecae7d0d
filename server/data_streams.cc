#include "server/data_streams.h"

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fast_frame.h"
#include "common/names.h"
#include "common/shard_map_proto.h"
#include "server/ps_service.h"
#include "server/pull_wait.h"
#include "server/push_transaction.h"

namespace asyncps {

namespace {

// A refusal of a request routed with an older map carries the shard's map
// (common/shard_map_proto.h RefusalMap) to the client, one routed with a
// newer map the epoch served (ServedMapEpoch).
void SetCallStatus(const absl::Status& s, CallStatus* out) {
  out->set_code(static_cast<int32_t>(s.code()));
  out->set_message(std::string(s.message()));
  std::optional<ShardMapProto> map = RefusalMap(s);
  if (map.has_value()) *out->mutable_map() = *std::move(map);
  const std::optional<uint64_t> served = ServedMapEpoch(s);
  if (served.has_value()) out->set_served_map_epoch(*served);
}

// One payload per gradient message (SliceGradient or RowsGradient) of a
// PushStream frame, read from `reader` in order: out[i] gets
// gradients(i).grad_bytes() bytes of `dtype`. `in_message` is the error for
// a gradient carried in its message instead, `what(g)` names g in errors.
template <typename Gradient>
absl::Status ReadPayloads(
    const google::protobuf::RepeatedPtrField<Gradient>& gradients,
    WireDtype dtype, absl::string_view in_message,
    absl::FunctionRef<std::string(const Gradient&)> what, FrameReader* reader,
    std::vector<Payload>* out) {
  out->resize(gradients.size());
  for (int i = 0; i < gradients.size(); ++i) {
    const Gradient& g = gradients.Get(i);
    (*out)[i].set_dtype(dtype);
    absl::Status s = g.grad().empty() ? reader->Next(g.grad_bytes(), &(*out)[i])
                                      : absl::InvalidArgumentError(in_message);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(g), " (grad_bytes ", g.grad_bytes(), "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

// The gradients of a PushStream frame, after its header: grads[i] gets
// request.grads(i).grad_bytes() bytes, then rows[k] gets
// request.rows(k).grad_bytes(); nothing may be left over.
absl::Status ReadFrameGradients(const PushRequest& request, FrameReader* reader,
                                std::vector<Payload>* grads,
                                std::vector<Payload>* rows) {
  if (request.wire_dtype() != WIRE_F32 && request.wire_dtype() != WIRE_BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown wire_dtype ", request.wire_dtype()));
  }
  absl::Status s = ReadPayloads<SliceGradient>(
      request.grads(), request.wire_dtype(),
      "PushStream carries gradients after the header, not in "
      "SliceGradient.grad",
      [](const SliceGradient& g) {
        return absl::StrCat("slice ", g.slice(), " of tensor ",
                            QuoteName(g.tensor()));
      },
      reader, grads);
  if (!s.ok()) return s;
  s = ReadPayloads<RowsGradient>(
      request.rows(), request.wire_dtype(),
      "PushStream carries row gradients after the header, not in "
      "RowsGradient.grad",
      [](const RowsGradient& g) {
        return absl::StrCat("rows of table ", QuoteName(g.table()));
      },
      reader, rows);
  if (!s.ok()) return s;
  if (reader->remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame: ", reader->remaining(),
                     " payload bytes beyond the gradients' grad_bytes"));
  }
  return absl::OkStatus();
}

// The write side of a stream reactor: answers queue up and are written one
// at a time; the stream finishes once the client is done sending, nothing
// is pending and everything is written (or the stream broke). Thread-safe:
// reads, writes and waits complete on different threads.
class StreamWriter {
 public:
  explicit StreamWriter(ByteBidiReactor* reactor) : reactor_(reactor) {}

  // Queues an answer (dropped once the stream broke).
  void Write(grpc::ByteBuffer answer) {
    grpc::ByteBuffer* start = nullptr;
    {
      absl::MutexLock l(&mu_);
      if (broken_) return;
      queue_.push_back(std::move(answer));
      if (writing_) return;
      writing_ = true;
      start = &queue_.front();
    }
    reactor_->StartWrite(start);
  }

  // From OnWriteDone.
  void WriteDone(bool ok) {
    grpc::ByteBuffer* next = nullptr;
    {
      absl::MutexLock l(&mu_);
      queue_.pop_front();
      if (!ok) {
        broken_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
      }
    }
    if (next != nullptr) {
      reactor_->StartWrite(next);
    } else {
      MaybeFinish();
    }
  }

  // Work that will write an answer later starts / ends.
  void AddPending() {
    absl::MutexLock l(&mu_);
    ++pending_;
  }
  void EndPending() {
    {
      absl::MutexLock l(&mu_);
      --pending_;
    }
    MaybeFinish();
  }

  // The client is done sending (or the stream broke on the read side).
  void ReadsDone() {
    {
      absl::MutexLock l(&mu_);
      reads_done_ = true;
    }
    MaybeFinish();
  }

 private:
  void MaybeFinish() {
    {
      absl::MutexLock l(&mu_);
      if (finished_ || !reads_done_ || pending_ > 0 || writing_) return;
      finished_ = true;
    }
    reactor_->Finish(grpc::Status::OK);
  }

  ByteBidiReactor* const reactor_;
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
};

// What every stream reactor is: one read in flight at a time, handed to
// Handle on the thread that read it, the next read started once Handle
// returns; the writer ends the stream once the client is done sending and
// every answer is written. Deletes itself when the call is done.
class StreamReactor : public ByteBidiReactor {
 public:
  void OnReadDone(bool ok) final {
    if (!ok) {
      writer_.ReadsDone();
      return;
    }
    Handle(request_);
    request_.Clear();
    StartRead(&request_);
  }
  void OnWriteDone(bool ok) final { writer_.WriteDone(ok); }
  void OnDone() final { delete this; }

  // A new reactor of type `Reactor`, reading: the first read starts once
  // the reactor is whole (it may complete, and Handle run, at once).
  template <typename Reactor>
  static ByteBidiReactor* Launch(PsService* service) {
    Reactor* reactor = new Reactor(service);
    reactor->StartRead(&reactor->request_);
    return reactor;
  }

 protected:
  explicit StreamReactor(PsService* service)
      : service_(service), writer_(this) {}

  // One request read from the stream, valid during the call; its answer
  // goes to writer_, now or later (AddPending / EndPending around it).
  virtual void Handle(const grpc::ByteBuffer& request) = 0;

  PsService* const service_;  // not owned
  StreamWriter writer_;

 private:
  grpc::ByteBuffer request_;  // touched only by the one read in flight
};

// PushStream: each request is applied on the thread that read it, and
// answered; reads continue meanwhile.
class PushStreamReactor : public StreamReactor {
 public:
  explicit PushStreamReactor(PsService* service) : StreamReactor(service) {}

 private:
  void Handle(const grpc::ByteBuffer& request) override {
    auto answer = std::make_shared<PushResponse>();
    // The gradients stay in gRPC's receive buffers; the reader holds them
    // until the push is applied.
    PushRequest header;
    FrameReader reader;
    std::vector<Payload> grads, rows;
    absl::Status s = reader.Open(request, &header);
    if (s.ok()) {
      s = PushTransaction::CheckCaller(header);
    }
    if (s.ok()) s = ReadFrameGradients(header, &reader, &grads, &rows);
    if (!s.ok()) service_->context().stats->RecordBadInput();
    if (s.ok()) s = service_->CheckPrimary();
    answer->set_request_id(header.request_id());
    if (!s.ok()) return Write(answer.get(), s);
    // Answered once the push is applied (and held by the backups, and
    // checkpointed when an assign needs it); the stream goes on meanwhile.
    writer_.AddPending();
    service_->RunPushStep(header, grads, rows, &reader, answer.get(),
                          [this, answer](absl::Status st) {
                            Write(answer.get(), st);
                            writer_.EndPending();
                          });
  }

  void Write(PushResponse* answer, const absl::Status& s) {
    if (!s.ok()) {
      answer->clear_results();
      SetCallStatus(s, answer->mutable_status());
    }
    writer_.Write(SerializeToByteBuffer(*answer));
  }
};

// PullStream: each request waits (without a thread) as the consistency
// model says, then its frame is copied and written; reads continue
// meanwhile, and answers go out in the order they become ready.
class PullStreamReactor : public StreamReactor {
 public:
  explicit PullStreamReactor(PsService* service) : StreamReactor(service) {}

  void OnCancel() override {
    std::vector<std::shared_ptr<PullWait>> waits;
    {
      absl::MutexLock l(&mu_);
      for (auto& [key, wait] : waits_) waits.push_back(wait);
    }
    for (auto& wait : waits) wait->Cancel();
  }

 protected:
  // Serves one validated request: begins the pull, waits as the
  // consistency model says, then copies and writes its frame. `push`, when
  // set, is the answer of the push the pull rode with (StepStream): it
  // goes into the header of the answer, an error's too.
  void ServePull(std::shared_ptr<const PullRequest> request,
                 std::shared_ptr<const PushResponse> push) {
    int64_t target = 0;
    absl::Status s = service_->BeginPull(*request, &target);
    if (!s.ok()) {
      WriteError(request->request_id(), s, push.get());
      return;
    }
    auto wait = std::make_shared<PullWait>(service_->context().workers);
    uint64_t key;
    {
      absl::MutexLock l(&mu_);
      key = next_key_++;
      waits_.emplace(key, wait);
    }
    writer_.AddPending();
    const absl::Time start = service_->context().clock->Now();
    const WorkerRegistry::WaitId id = service_->WhenReady(
        *request, target,
        [this, request, push, wait, key, start](absl::Status status) {
          wait->Ended();
          Answer(*request, push, status, start);
          {
            absl::MutexLock l(&mu_);
            waits_.erase(key);
          }
          writer_.EndPending();
        });
    if (id != 0) service_->context().stats->RecordPullWait();
    wait->Started(id);
  }

  // The answer to a request that failed: a frame with no payload, whose
  // header says why (and carries `push`, when set).
  void WriteError(uint64_t request_id, const absl::Status& s,
                  const PushResponse* push) {
    PullResponse header;
    header.set_request_id(request_id);
    header.set_shard_epoch(service_->epoch());
    SetCallStatus(s, header.mutable_status());
    if (push != nullptr) *header.mutable_push() = *push;
    writer_.Write(MakeFrame(header, {}));
  }

 private:
  void Handle(const grpc::ByteBuffer& bytes) override {
    auto request = std::make_shared<PullRequest>();
    absl::Status s = ParseFromByteBuffer(bytes, request.get());
    if (!s.ok()) {
      service_->context().stats->RecordBadInput();
    } else if (!request->read_only()) {
      s = service_->CheckPrimary();
    }
    if (!s.ok()) {
      WriteError(request->request_id(), s, nullptr);
      return;
    }
    ServePull(std::move(request), nullptr);
  }

  void Answer(const PullRequest& request,
              const std::shared_ptr<const PushResponse>& push,
              absl::Status status, absl::Time start) {
    service_->NoteWaitEnd(request, status);
    if (!status.ok()) {
      WriteError(request.request_id(), status, push.get());
      return;
    }
    auto header = std::make_shared<PullResponse>();
    header->set_request_id(request.request_id());
    header->set_waited_us(
        absl::ToInt64Microseconds(service_->context().clock->Now() - start));
    if (push != nullptr) *header->mutable_push() = *push;
    auto frame = std::make_shared<absl::StatusOr<grpc::ByteBuffer>>();
    writer_.AddPending();
    service_->RunPullStep(
        request,
        [&] {
          *frame = service_->CopyPullFrame(request, header.get());
          return frame->status();
        },
        [this, id = request.request_id(), push, frame](absl::Status st) {
          if (st.ok()) {
            writer_.Write(*std::move(*frame));
          } else {
            WriteError(id, st, push.get());
          }
          writer_.EndPending();
        });
  }

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PullWait>> waits_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
};

// The push of a StepStream request, parsed and checked: its header without
// then_pull, its payloads (held in `reader`'s buffers) and the pull that
// rides with it, whose request_id is the push's.
struct StepRequest {
  PushRequest push;
  FrameReader reader;
  std::vector<Payload> grads, rows;
  std::shared_ptr<PullRequest> pull = std::make_shared<PullRequest>();
};

absl::Status ParseStepRequest(const grpc::ByteBuffer& bytes, StepRequest* out) {
  absl::Status s = out->reader.Open(bytes, &out->push);
  if (!s.ok()) return s;
  if (!out->push.has_then_pull()) {
    return absl::InvalidArgumentError(
        "StepStream: the push carries no then_pull (the next step's pull); "
        "a push alone goes on PushStream");
  }
  out->pull->Swap(out->push.mutable_then_pull());
  out->push.clear_then_pull();
  out->pull->set_request_id(out->push.request_id());
  s = PushTransaction::CheckCaller(out->push);
  if (!s.ok()) return s;
  const WorkerRef& pusher = out->push.worker();
  const WorkerRef& puller = out->pull->worker();
  if (out->pull->read_only() || puller.worker_id() != pusher.worker_id() ||
      puller.incarnation() != pusher.incarnation()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StepStream: then_pull must be the pushing worker's own pull (worker ",
        pusher.worker_id(), " incarnation ", pusher.incarnation(),
        "), not a reader's or another worker's"));
  }
  return ReadFrameGradients(out->push, &out->reader, &out->grads, &out->rows);
}

// StepStream: each request's push is applied as on PushStream, on the
// thread that read it; once it is acknowledged its pull is served as on
// PullStream, and one frame answers both.
class StepStreamReactor : public PullStreamReactor {
 public:
  explicit StepStreamReactor(PsService* service) : PullStreamReactor(service) {}

 private:
  void Handle(const grpc::ByteBuffer& bytes) override {
    StepRequest step;
    absl::Status s = ParseStepRequest(bytes, &step);
    if (!s.ok()) service_->context().stats->RecordBadInput();
    if (s.ok()) s = service_->CheckPrimary();
    // The pull is checked before the push applies: a bad one refuses the
    // step whole (its checks run again once the push is acknowledged).
    if (s.ok()) s = service_->CheckPull(*step.pull);
    auto answer = std::make_shared<PushResponse>();
    if (!s.ok()) return Refuse(step.push.request_id(), s, answer.get());
    writer_.AddPending();
    service_->RunPushStep(step.push, step.grads, step.rows, &step.reader,
                          answer.get(),
                          [this, answer, pull = step.pull](absl::Status st) {
                            if (st.ok()) {
                              service_->context().stats->RecordStep();
                              ServePull(pull, answer);
                            } else {
                              Refuse(pull->request_id(), st, answer.get());
                            }
                            writer_.EndPending();
                          });
  }

  // A push refused: nothing applied, nothing pulled.
  void Refuse(uint64_t request_id, const absl::Status& s,
              PushResponse* answer) {
    answer->clear_results();
    answer->clear_row_results();
    SetCallStatus(s, answer->mutable_status());
    WriteError(request_id, s, answer);
  }
};

}  // namespace

ByteBidiReactor* NewPushStreamReactor(PsService* service) {
  return StreamReactor::Launch<PushStreamReactor>(service);
}

ByteBidiReactor* NewPullStreamReactor(PsService* service) {
  return StreamReactor::Launch<PullStreamReactor>(service);
}

ByteBidiReactor* NewStepStreamReactor(PsService* service) {
  return StreamReactor::Launch<StepStreamReactor>(service);
}

}  // namespace asyncps
