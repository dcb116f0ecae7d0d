#include "serving/batcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<Batcher>> Batcher::Create(
    const BatcherOptions& options, const RunnerFactory& factory,
    const SnapshotKeeper* snapshots, ServingMetrics* metrics) {
  if (options.input_dim < 0 || options.ids_per_row < 0 ||
      options.input_dim + options.ids_per_row < 1 || options.output_dim < 1 ||
      options.max_batch_rows < 1 || options.max_queue < 1 ||
      options.threads < 1 || options.timeout < absl::ZeroDuration() ||
      options.latency_objective < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "batcher: a row needs features or ids, an output, and "
        "max_batch_rows, max_queue and threads must be >= 1, timeout and "
        "latency objective >= 0");
  }
  std::unique_ptr<Batcher> b(new Batcher(options, snapshots, metrics));
  for (int i = 0; i < options.threads; ++i) {
    absl::StatusOr<std::unique_ptr<BatchRunner>> r = factory();
    if (!r.ok()) return r.status();
    b->runners_.push_back(*std::move(r));
  }
  for (auto& runner : b->runners_) {
    BatchRunner* raw = runner.get();
    b->threads_.emplace_back([b = b.get(), raw] { b->Loop(raw); });
  }
  return b;
}

namespace {

BatchPolicyOptions PolicyOptions(const BatcherOptions& o) {
  BatchPolicyOptions p;
  p.automatic = o.auto_timeout;
  p.fixed_timeout = o.timeout;
  p.max_batch_rows = o.max_batch_rows;
  p.threads = o.threads;
  p.latency_objective = o.latency_objective;
  return p;
}

}  // namespace

Batcher::Batcher(const BatcherOptions& options, const SnapshotKeeper* snapshots,
                 ServingMetrics* metrics)
    : options_(options),
      snapshots_(snapshots),
      metrics_(metrics),
      policy_(PolicyOptions(options)) {}

Batcher::~Batcher() { Stop(); }

void Batcher::Submit(std::vector<float> x, std::vector<uint64_t> ids, int rows,
                     absl::Time deadline, Done done) {
  if (rows < 1 || rows > options_.max_batch_rows ||
      x.size() != static_cast<size_t>(rows) * options_.input_dim ||
      ids.size() != static_cast<size_t>(rows) * options_.ids_per_row) {
    done(absl::InvalidArgumentError(absl::StrCat(
        "a request holds 1 to ", options_.max_batch_rows, " rows of ",
        options_.input_dim, " values and ", options_.ids_per_row, " ids; got ",
        rows, " rows, ", x.size(), " values, ", ids.size(), " ids")));
    return;
  }
  if (snapshots_->Current() == nullptr) {
    done(absl::UnavailableError(
        "no parameters yet: the first snapshot has not been read"));
    return;
  }
  const absl::Time now = absl::Now();
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      refused = absl::UnavailableError("ps_serve is stopping");
    } else if (queue_.size() >= static_cast<size_t>(options_.max_queue)) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("the batch queue is full (", options_.max_queue,
                       " requests wait): retry later"));
    } else {
      queue_.push_back(Request{std::move(x), std::move(ids), rows, now,
                               deadline, std::move(done)});
      queued_rows_ += rows;
    }
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  policy_.RecordArrival(now, rows);
}

int Batcher::queued() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(queue_.size());
}

std::vector<Batcher::Request> Batcher::NextBatch() {
  absl::MutexLock l(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](Batcher* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) {
          return b->stopping_ || !b->queue_.empty();
        },
        this));
    if (stopping_) return {};
    // Wait for a full batch or the oldest request's timeout.
    const absl::Time until = queue_.front().arrived + policy_.Timeout();
    mu_.AwaitWithDeadline(
        absl::Condition(
            +[](Batcher* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) {
              return b->stopping_ ||
                     b->queued_rows_ >= b->options_.max_batch_rows;
            },
            this),
        until);
    if (stopping_) return {};
    if (queue_.empty()) continue;  // another thread took them
    std::vector<Request> batch;
    int rows = 0;
    while (!queue_.empty() &&
           rows + queue_.front().rows <= options_.max_batch_rows) {
      rows += queue_.front().rows;
      queued_rows_ -= queue_.front().rows;
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return batch;
  }
}

void Batcher::Loop(BatchRunner* runner) {
  for (;;) {
    std::vector<Request> batch = NextBatch();
    if (batch.empty()) return;
    RunBatch(runner, std::move(batch));
  }
}

void Batcher::RunBatch(BatchRunner* runner, std::vector<Request> batch) {
  const absl::Time start = absl::Now();
  std::vector<Request> live;
  int rows = 0;
  for (Request& r : batch) {
    metrics_->RecordQueueWait(start - r.arrived);
    if (r.deadline <= start) {
      r.done(absl::DeadlineExceededError(
          "the request's deadline passed while it waited for its batch"));
      continue;
    }
    rows += r.rows;
    live.push_back(std::move(r));
  }
  if (live.empty()) return;
  std::shared_ptr<const Snapshot> snapshot = snapshots_->Current();
  std::vector<float> x;
  std::vector<uint64_t> ids;
  const float* in = live[0].x.data();
  const uint64_t* in_ids = live[0].ids.data();
  if (live.size() > 1) {
    x.reserve(static_cast<size_t>(rows) * options_.input_dim);
    ids.reserve(static_cast<size_t>(rows) * options_.ids_per_row);
    for (const Request& r : live) {
      x.insert(x.end(), r.x.begin(), r.x.end());
      ids.insert(ids.end(), r.ids.begin(), r.ids.end());
    }
    in = x.data();
    in_ids = ids.data();
  }
  std::vector<float> out(static_cast<size_t>(rows) * options_.output_dim);
  const absl::Status s = runner->Run(*snapshot, in, in_ids, rows, out.data());
  const absl::Duration compute = absl::Now() - start;
  metrics_->RecordBatch(rows, compute);  // counted before any answer is out
  size_t at = 0;
  for (Request& r : live) {
    if (!s.ok()) {
      r.done(s);
      continue;
    }
    InferResult result;
    const size_t n = static_cast<size_t>(r.rows) * options_.output_dim;
    result.out.assign(out.begin() + at, out.begin() + at + n);
    at += n;
    result.snapshot = snapshot;
    result.batch_rows = rows;
    r.done(std::move(result));
  }
  // The policy learns the batch thread's whole time per batch, answering
  // included: that, not the model's compute alone, is what a batch costs
  // the thread (on a CPU, encoding and handing over the answers of small
  // batches can cost more than computing them).
  policy_.RecordBatch(rows, absl::Now() - start);
}

void Batcher::Stop() {
  std::deque<Request> left;
  {
    absl::MutexLock l(&mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    left.swap(queue_);
    queued_rows_ = 0;
  }
  for (Request& r : left)
    r.done(absl::UnavailableError("ps_serve is stopping"));
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace asyncps
