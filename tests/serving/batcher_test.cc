// The dynamic batcher with a runner whose answers are known exactly:
// batched answers equal unbatched ones, full queues, expired deadlines and
// bad requests are answered alone, and no answer mixes two snapshots.

#include "serving/batcher.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "tests/serving/fake_model.h"
#include "tests/testing/require_ok.h"

namespace asyncps {
namespace {

using testing::ScalarRunner;
using testing::ScalarSource;

// Collects the answers of submitted requests.
class Answers {
 public:
  Batcher::Done Slot(int i) {
    return [this, i](absl::StatusOr<InferResult> r) {
      absl::MutexLock l(&mu_);
      results_[i] = std::move(r);
      ++done_;
    };
  }
  explicit Answers(int n) : results_(n, absl::UnknownError("no answer")) {}
  void WaitAll() {
    absl::MutexLock l(&mu_);
    REQUIRE(mu_.AwaitWithTimeout(
        absl::Condition(
            +[](Answers* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->mu_) {
              return a->done_ == static_cast<int>(a->results_.size());
            },
            this),
        absl::Seconds(30)));
  }
  absl::StatusOr<InferResult> Get(int i) {
    absl::MutexLock l(&mu_);
    return results_[i];
  }
  int done() {
    absl::MutexLock l(&mu_);
    return done_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::StatusOr<InferResult>> results_ ABSL_GUARDED_BY(mu_);
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Fixture {
  explicit Fixture(BatcherOptions o, absl::Notification* gate = nullptr)
      : snapshots(&source, {"v"}, absl::ZeroDuration(), NullLogger()) {
    source.value = 3.0f;
    REQUIRE_OK(snapshots.Refresh());
    o.input_dim = 2;
    o.output_dim = 2;
    auto made = Batcher::Create(
        o,
        [this, gate]() -> absl::StatusOr<std::unique_ptr<BatchRunner>> {
          auto r = std::make_unique<ScalarRunner>(gate);
          runners.push_back(r.get());
          return std::unique_ptr<BatchRunner>(std::move(r));
        },
        &snapshots, &metrics);
    REQUIRE_OK(made.status());
    batcher = *std::move(made);
  }
  int RowsComputed() {
    int n = 0;
    for (ScalarRunner* r : runners) n += r->rows_computed.load();
    return n;
  }

  ScalarSource source;
  SnapshotKeeper snapshots;
  ServingMetrics metrics;
  std::vector<ScalarRunner*> runners;
  std::unique_ptr<Batcher> batcher;
};

// Waits until a batch thread took every queued request.
void AwaitTaken(Batcher* batcher) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (batcher->queued() != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  REQUIRE(batcher->queued() == 0);
}

std::vector<float> Rows(int n, float base) {
  std::vector<float> x;
  for (int i = 0; i < n; ++i) {
    x.push_back(base + i);
    x.push_back(base - i);
  }
  return x;
}

void RequireAnswer(const absl::StatusOr<InferResult>& r, int n, float base,
                   float v) {
  REQUIRE_OK(r.status());
  REQUIRE(r->out.size() == static_cast<size_t>(2 * n));
  for (int i = 0; i < n; ++i) {
    REQUIRE(r->out[2 * i] == base + i + v);
    REQUIRE(r->out[2 * i + 1] == (base - i) * v);
  }
}

TEST_CASE("batched answers equal unbatched answers", "[batcher]") {
  BatcherOptions o;
  o.max_batch_rows = 8;
  o.timeout = absl::Seconds(20);  // only a full batch runs
  Fixture f(o);
  Answers answers(4);
  // 1 + 2 + 3 + 2 rows: the first three fill 6 rows, the fourth makes 8.
  const int sizes[] = {1, 2, 3, 2};
  for (int i = 0; i < 4; ++i) {
    f.batcher->Submit(Rows(sizes[i], 10.0f * i), sizes[i],
                      absl::InfiniteFuture(), answers.Slot(i));
  }
  answers.WaitAll();
  for (int i = 0; i < 4; ++i) {
    RequireAnswer(answers.Get(i), sizes[i], 10.0f * i, 3.0f);
    REQUIRE(answers.Get(i)->batch_rows == 8);
  }
  REQUIRE(f.runners[0]->batches.load() == 1);

  // The same requests one by one (no waiting) give the same answers.
  BatcherOptions alone = o;
  alone.timeout = absl::ZeroDuration();
  alone.max_batch_rows = 3;
  Fixture g(alone);
  for (int i = 0; i < 4; ++i) {
    Answers one(1);
    g.batcher->Submit(Rows(sizes[i], 10.0f * i), sizes[i],
                      absl::InfiniteFuture(), one.Slot(0));
    one.WaitAll();
    REQUIRE(one.Get(0)->batch_rows == sizes[i]);
    REQUIRE(one.Get(0)->out == answers.Get(i)->out);
  }
  REQUIRE(g.metrics.batch_rows().count() == 4);
}

TEST_CASE("auto learns what a batch costs its thread, answering included",
          "[batcher]") {
  BatcherOptions o;
  o.max_batch_rows = 4;
  o.auto_timeout = true;
  Fixture f(o);
  // The runner computes in no time; handing over each answer takes 2 ms
  // of the batch thread. Requests of 1 to 4 rows one after another for
  // over 3 rate windows of 100 ms.
  const absl::Time until = absl::Now() + absl::Milliseconds(350);
  for (int i = 0; absl::Now() < until; ++i) {
    const int rows = 1 + i % 4;
    Answers one(1);
    Batcher::Done slot = one.Slot(0);
    f.batcher->Submit(Rows(rows, 1.0f), rows, absl::InfiniteFuture(),
                      [slot](absl::StatusOr<InferResult> r) {
                        absl::SleepFor(absl::Milliseconds(2));
                        slot(std::move(r));
                      });
    one.WaitAll();
    RequireAnswer(one.Get(0), rows, 1.0f, 3.0f);
  }
  // The batch thread records a batch before it takes the next one, so once
  // this request is answered every batch before it is recorded.
  Answers last(1);
  f.batcher->Submit(Rows(1, 1.0f), 1, absl::InfiniteFuture(), last.Slot(0));
  last.WaitAll();
  const BatchPolicy::Estimate e = f.batcher->policy().Current();
  // Every batch cost its thread at least 2 ms; the fitted line passes
  // through the (decayed) mean batch, about 2.5 rows. Learnt from the
  // compute alone, a batch would cost next to nothing.
  REQUIRE(e.fixed_us + 2.5 * e.per_row_us >= 1800);
  REQUIRE(e.rows_per_s > 0);
  // The compute-time histogram keeps measuring the compute alone.
  REQUIRE(f.metrics.compute().count() >= 10);
  REQUIRE(f.metrics.compute().Mean() < 0.001);
}

TEST_CASE("a full queue refuses at once and its batch-mates are answered",
          "[batcher]") {
  absl::Notification gate;
  BatcherOptions o;
  o.max_batch_rows = 4;
  o.max_queue = 2;
  Fixture f(o, &gate);
  Answers answers(4);
  f.batcher->Submit(Rows(1, 0), 1, absl::InfiniteFuture(), answers.Slot(0));
  // The batch thread takes request 0 and blocks in Run.
  AwaitTaken(f.batcher.get());
  f.batcher->Submit(Rows(1, 1), 1, absl::InfiniteFuture(), answers.Slot(1));
  f.batcher->Submit(Rows(1, 2), 1, absl::InfiniteFuture(), answers.Slot(2));
  f.batcher->Submit(Rows(1, 3), 1, absl::InfiniteFuture(), answers.Slot(3));
  // Refused inline, before anything else is answered.
  REQUIRE(answers.done() == 1);
  REQUIRE(answers.Get(3).status().code() ==
          absl::StatusCode::kResourceExhausted);
  gate.Notify();
  answers.WaitAll();
  for (int i = 0; i < 3; ++i) RequireAnswer(answers.Get(i), 1, i, 3.0f);
  REQUIRE(f.RowsComputed() == 3);
  REQUIRE(f.metrics.requests(Outcome::kOk) == 0);  // the handler counts
}

TEST_CASE("an expired request is answered DEADLINE_EXCEEDED, never computed",
          "[batcher]") {
  absl::Notification gate;
  BatcherOptions o;
  o.max_batch_rows = 16;
  Fixture f(o, &gate);
  Answers answers(3);
  f.batcher->Submit(Rows(2, 0), 2, absl::InfiniteFuture(), answers.Slot(0));
  AwaitTaken(f.batcher.get());
  f.batcher->Submit(Rows(5, 1), 5, absl::Now() + absl::Milliseconds(20),
                    answers.Slot(1));
  f.batcher->Submit(Rows(3, 2), 3, absl::InfiniteFuture(), answers.Slot(2));
  absl::SleepFor(absl::Milliseconds(60));
  gate.Notify();
  answers.WaitAll();
  RequireAnswer(answers.Get(0), 2, 0, 3.0f);
  REQUIRE(answers.Get(1).status().code() ==
          absl::StatusCode::kDeadlineExceeded);
  RequireAnswer(answers.Get(2), 3, 2, 3.0f);
  REQUIRE(answers.Get(2)->batch_rows == 3);
  REQUIRE(f.RowsComputed() == 5);
}

TEST_CASE("bad requests, a missing snapshot and a stop are answered alone",
          "[batcher]") {
  absl::Notification gate;
  BatcherOptions o;
  o.max_batch_rows = 4;
  Fixture f(o, &gate);
  Answers answers(5);
  f.batcher->Submit(Rows(1, 0), 1, absl::InfiniteFuture(), answers.Slot(0));
  f.batcher->Submit(Rows(5, 0), 5, absl::InfiniteFuture(), answers.Slot(1));
  f.batcher->Submit(std::vector<float>(3), 1, absl::InfiniteFuture(),
                    answers.Slot(2));
  f.batcher->Submit({}, 0, absl::InfiniteFuture(), answers.Slot(3));
  REQUIRE(answers.Get(1).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(answers.Get(2).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(answers.Get(3).status().code() == absl::StatusCode::kInvalidArgument);
  AwaitTaken(f.batcher.get());
  f.batcher->Submit(Rows(1, 9), 1, absl::InfiniteFuture(), answers.Slot(4));
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(50));
    gate.Notify();
  });
  f.batcher->Stop();  // answers the queued request, waits for the running one
  release.join();
  answers.WaitAll();
  RequireAnswer(answers.Get(0), 1, 0, 3.0f);
  REQUIRE(answers.Get(4).status().code() == absl::StatusCode::kUnavailable);

  ScalarSource empty;
  empty.down = true;
  SnapshotKeeper none(&empty, {"v"}, absl::ZeroDuration(), NullLogger());
  REQUIRE(!none.Refresh().ok());
  ServingMetrics metrics;
  BatcherOptions p;
  p.input_dim = p.output_dim = 2;
  auto b = Batcher::Create(
      p,
      []() -> absl::StatusOr<std::unique_ptr<BatchRunner>> {
        return std::unique_ptr<BatchRunner>(new ScalarRunner());
      },
      &none, &metrics);
  REQUIRE_OK(b.status());
  Answers unavailable(1);
  (*b)->Submit(Rows(1, 0), 1, absl::InfiniteFuture(), unavailable.Slot(0));
  REQUIRE(unavailable.Get(0).status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("no answer mixes two snapshots", "[batcher]") {
  BatcherOptions o;
  o.max_batch_rows = 32;
  o.threads = 2;
  o.timeout = absl::Microseconds(200);
  Fixture f(o);
  std::atomic<bool> done{false};
  std::atomic<int> failed_refreshes{0};
  // The value and its version change together: v = 1 + version.
  f.source.version = 1;
  f.source.value = 2.0f;
  REQUIRE_OK(f.snapshots.Refresh());
  std::thread refresher([&] {
    for (uint64_t v = 2; !done.load(); ++v) {
      f.source.version = v;
      f.source.value = 1.0f + v;
      if (!f.snapshots.Refresh().ok()) failed_refreshes.fetch_add(1);
      absl::SleepFor(absl::Microseconds(300));
    }
  });
  constexpr int kRequests = 400;
  Answers answers(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    f.batcher->Submit(Rows(1 + i % 3, i), 1 + i % 3, absl::InfiniteFuture(),
                      answers.Slot(i));
    if (i % 8 == 0) absl::SleepFor(absl::Microseconds(100));
  }
  answers.WaitAll();
  done = true;
  refresher.join();
  REQUIRE(failed_refreshes.load() == 0);
  uint64_t first = ~uint64_t{0}, last = 0;
  for (int i = 0; i < kRequests; ++i) {
    absl::StatusOr<InferResult> r = answers.Get(i);
    REQUIRE_OK(r.status());
    const float v = r->snapshot->values[0][0];
    REQUIRE(v == 1.0f + r->snapshot->version_sum);
    RequireAnswer(r, 1 + i % 3, i, v);
    first = std::min(first, r->snapshot->version_sum);
    last = std::max(last, r->snapshot->version_sum);
  }
  REQUIRE(last > first);  // the snapshots did change while requests streamed
}

}  // namespace
}  // namespace asyncps
