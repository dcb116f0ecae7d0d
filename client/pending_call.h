#ifndef ASYNCPS_CLIENT_PENDING_CALL_H_
#define ASYNCPS_CLIENT_PENDING_CALL_H_

#include <memory>
#include <optional>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "client/fanout.h"

namespace asyncps {

// What every call in flight of PsClient shares (PendingPull, PendingPush):
// either an argument error found before anything was sent, or the fan-out
// of its attempts to the shards; and the result, computed once when the
// attempts have ended.
//
// A call's requests, answers and pushed memory are referred to by its
// attempts, so they must outlive them: the owner declares its PendingCall
// after everything the attempts use, and the PendingCall (destroyed first)
// waits for them. `Result` is absl::Status or absl::StatusOr<T>.
//
// Thread-compatible: one thread starts and waits.
template <typename Result>
class PendingCall {
 public:
  // finish(s): the call's result from the fan-out's status `s` (OK, or the
  // error the call ended with); runs once, on the thread that waits, after
  // every attempt ended.
  using Finish = absl::AnyInvocable<Result(absl::Status)>;

  PendingCall() = default;
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;
  ~PendingCall() { Wait(); }

  // Nothing is sent: Wait() returns `error` (not OK).
  void Fail(absl::Status error) { error_ = std::move(error); }

  // The call's attempts, already started (null: nothing to send), and how
  // its result is made.
  void Start(std::unique_ptr<FanOut> started, Finish finish) {
    fanout_ = std::move(started);
    finish_ = std::move(finish);
  }

  // Waits for the attempts (once) and returns the result.
  const Result& Wait() {
    if (!result_.has_value()) {
      if (!error_.ok()) {
        result_.emplace(error_);
      } else if (!finish_) {
        result_.emplace(absl::InternalError("call neither started nor failed"));
      } else {
        const absl::Status s =
            fanout_ != nullptr ? fanout_->Wait() : absl::OkStatus();
        result_.emplace(finish_(s));
      }
    }
    return *result_;
  }

 private:
  absl::Status error_;
  std::unique_ptr<FanOut> fanout_;
  Finish finish_;
  std::optional<Result> result_;
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PENDING_CALL_H_
