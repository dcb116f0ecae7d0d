// PsClient's steps: a push and the next step's pull as one StepStream
// request per shard (proto/asyncps.proto). The halves are planned, checked,
// waited for and retried by pull.cc and push.cc as if started alone; only
// their first attempts meet here (PsClient::StepPairing).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "client/ps_client_internal.h"
#include "common/fast_frame.h"

namespace asyncps {

PsClient::PendingStep PsClient::StartStep(int64_t clock, const PushSet& push,
                                          const ReadSet& read,
                                          const PullSet& pull) {
  std::shared_ptr<StepPairing> pairing;
  if (!steps_unsupported_.load(std::memory_order_relaxed)) {
    pairing = std::make_shared<StepPairing>();
  }
  PendingStep step;
  // The push's first attempts start (and are held) before the pull's,
  // which take them.
  step.push = StartSend(/*assign=*/false, clock, push, read, pairing);
  step.pull = StartPullPaired(clock + 1, clock + 1, pull, pairing);
  if (pairing != nullptr) {
    for (StepPairing::Held& h : pairing->Close()) {
      h.alone->Send(h.part->header.request_id(), FrameOf(h.part),
                    std::move(h.answered));
    }
  }
  return step;
}

bool PsClient::SendStep(StepPairing* pairing, PullShard* ps,
                        uint32_t connection, StreamDone* pull_answered) {
  StepPairing::Held held = pairing->Take(ps->shard);
  if (held.part == nullptr) return false;
  const Endpoint* endpoint = EndpointOf(ps->shard);
  if (endpoint == nullptr || endpoint->steps.empty()) {
    // No step stream after all: both halves go alone.
    held.alone->Send(held.part->header.request_id(), FrameOf(held.part),
                     std::move(held.answered));
    return false;
  }
  DataStream* stream =
      endpoint->steps[connection % endpoint->steps.size()].get();
  // Both halves' cancels now end the step stream's attempt.
  held.part->stream.store(stream, std::memory_order_release);
  ps->stream.store(stream, std::memory_order_release);
  PushRequest header = held.part->header;
  *header.mutable_then_pull() = ps->request;
  const uint64_t id = header.request_id();
  stream->Send(id, MakeFrame(header, held.part->payload),
               [this, push_answered = std::move(held.answered),
                pull_answered = std::move(*pull_answered)](
                   absl::Status st, grpc::ByteBuffer* answer) {
                 SplitStepAnswer(std::move(st), answer, push_answered,
                                 pull_answered);
               });
  return true;
}

void PsClient::SplitStepAnswer(absl::Status st, grpc::ByteBuffer* answer,
                               const StreamDone& push_answered,
                               const StreamDone& pull_answered) {
  if (st.ok()) {
    PullResponse header;
    FrameReader frame;
    st = frame.Open(*answer, &header);
    if (st.ok()) {
      grpc::ByteBuffer pushed = SerializeToByteBuffer(header.push());
      push_answered(absl::OkStatus(), &pushed);
      pull_answered(absl::OkStatus(), answer);
      return;
    }
    st = absl::InternalError(absl::StrCat("StepStream answer: ", st.message()));
  } else if (absl::IsUnimplemented(st)) {
    // An older shard: both halves are retried alone, and later steps go
    // as two messages.
    if (!steps_unsupported_.exchange(true)) {
      options_.logger->info(
          "a shard does not serve StepStream ({}): steps go as a push and a "
          "pull",
          std::string(st.message()));
    }
    st = absl::UnavailableError(
        absl::StrCat("the shard does not serve StepStream (", st.message(),
                     "); sent again as a push and a pull"));
  }
  push_answered(st, nullptr);
  pull_answered(st, nullptr);
}

absl::StatusOr<PushSummary> PsClient::PushThenPull(
    int64_t clock, const PushSet& grads,
    const std::vector<std::pair<std::string, float*>>& outs) {
  PendingStep step = StartStep(clock, grads, LastRead(), PullSet{outs, {}});
  // The pull first: a stop ends its wait (and so the shared request's), and
  // the push then finishes alone.
  absl::Status pulled = step.pull->Wait();
  absl::StatusOr<PushSummary> pushed = step.push->Wait();
  if (!pushed.ok()) return pushed.status();
  if (!pulled.ok()) return pulled;
  absl::MutexLock l(&mu_);
  last_read_.Update(step.pull->read());
  return pushed;
}

}  // namespace asyncps
