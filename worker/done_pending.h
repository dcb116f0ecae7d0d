#ifndef ASYNCPS_WORKER_DONE_PENDING_H_
#define ASYNCPS_WORKER_DONE_PENDING_H_

// Pulls and pushes of the in-process stores (--local), which run to
// completion when started: their pending objects only hand the outcome out.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/ps_client.h"

namespace asyncps {

// A finished pull: `Base` is a store's PendingPull, whose read() returns a
// const Read&.
template <typename Base, typename Read>
class DonePull : public Base {
 public:
  DonePull(absl::Status status, Read read)
      : status_(std::move(status)), read_(std::move(read)) {}
  absl::Status Wait() override { return status_; }
  const Read& read() const override { return read_; }

 private:
  const absl::Status status_;
  const Read read_;
};

// A finished push: `Base` is a store's PendingPush.
template <typename Base>
class DonePush : public Base {
 public:
  explicit DonePush(absl::StatusOr<PushSummary> result)
      : result_(std::move(result)) {}
  absl::StatusOr<PushSummary> Wait() override { return result_; }

 private:
  const absl::StatusOr<PushSummary> result_;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_DONE_PENDING_H_
