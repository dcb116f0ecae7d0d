#ifndef ASYNCPS_WORKER_STORE_CALLS_H_
#define ASYNCPS_WORKER_STORE_CALLS_H_

// The pulls and pushes in flight of a worker's ParameterStore (on the
// cluster or in this process), as one pair of interfaces, and their
// implementations: over a PsClient call, or already done (the in-process
// store runs a call to completion when it starts).

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/ps_client.h"

namespace asyncps {

// A pull in flight; Wait() returns its outcome (again on later calls).
// Destroying one waits for it.
class StorePull {
 public:
  virtual ~StorePull() = default;
  virtual absl::Status Wait() = 0;
  // What was read; valid after Wait returned OK.
  virtual const ReadSet& read() const = 0;
  // Rows the pull created (ids without a row, outside a peek and without
  // admission); valid after Wait returned OK.
  virtual int64_t rows_created() const = 0;
};

// A push in flight; as StorePull.
class StorePush {
 public:
  virtual ~StorePush() = default;
  virtual absl::StatusOr<PushSummary> Wait() = 0;
};

// A PsClient pull.
class RemotePull : public StorePull {
 public:
  explicit RemotePull(std::unique_ptr<PsClient::PendingPull> p)
      : p_(std::move(p)) {}
  absl::Status Wait() override { return p_->Wait(); }
  const ReadSet& read() const override { return p_->read(); }
  int64_t rows_created() const override { return p_->rows_created(); }

 private:
  std::unique_ptr<PsClient::PendingPull> p_;
};

// A PsClient push.
class RemotePush : public StorePush {
 public:
  explicit RemotePush(std::unique_ptr<PsClient::PendingPush> p)
      : p_(std::move(p)) {}
  absl::StatusOr<PushSummary> Wait() override { return p_->Wait(); }

 private:
  std::unique_ptr<PsClient::PendingPush> p_;
};

// A finished pull.
class DonePull : public StorePull {
 public:
  DonePull(absl::Status status, ReadSet read, int64_t rows_created = 0)
      : status_(std::move(status)),
        read_(std::move(read)),
        rows_created_(rows_created) {}
  absl::Status Wait() override { return status_; }
  const ReadSet& read() const override { return read_; }
  int64_t rows_created() const override { return rows_created_; }

 private:
  const absl::Status status_;
  const ReadSet read_;
  const int64_t rows_created_;
};

// A finished push.
class DonePush : public StorePush {
 public:
  explicit DonePush(absl::StatusOr<PushSummary> result)
      : result_(std::move(result)) {}
  absl::StatusOr<PushSummary> Wait() override { return result_; }

 private:
  const absl::StatusOr<PushSummary> result_;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_STORE_CALLS_H_
