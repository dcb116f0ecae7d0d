#include "client/fanout.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"

namespace asyncps {

namespace {
// How often a stoppable call looks at its stop flag.
constexpr absl::Duration kStopPoll = absl::Milliseconds(100);
}  // namespace

bool IsRetriable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsCancelled(s);
}

// Completions, recorded by attempts on any thread and consumed by the
// waiting thread; shared so that late callbacks never outlive it.
//
// The waiting thread is woken once per batch of completions, not once per
// completion: when no attempt is in flight any more, or one failed (it may
// be retried, or stop the others). A push to two shards costs its waiter
// one wake-up, not two.
struct FanOut::Shared {
  absl::Mutex mu;
  absl::CondVar cv;
  std::vector<std::pair<int, absl::Status>> done ABSL_GUARDED_BY(mu);
  int in_flight ABSL_GUARDED_BY(mu) = 0;   // attempts started, not done
  bool ready ABSL_GUARDED_BY(mu) = false;  // the waiter has work
  // `ready`, for a waiter that drives a DrivenQueue (read without mu).
  std::atomic<bool> has_work{false};
};

struct FanOut::Slot {
  int attempts = 0;
  bool in_flight = false;
  bool finished = false;
  absl::Time attempt_start = absl::InfinitePast();  // of the one in flight
  absl::Time last_wait_report = absl::InfinitePast();
  absl::Time next_start = absl::InfinitePast();
  absl::Time first_failure = absl::InfiniteFuture();
  absl::Time last_report = absl::InfinitePast();
  absl::Status last_error;  // of the last failed attempt
  std::unique_ptr<grpc::ClientContext> ctx;
};

FanOut::FanOut(FanOutEnv env, std::string method, RetryPolicy policy,
               bool stop_on_error)
    : env_(std::move(env)),
      method_(std::move(method)),
      policy_(policy),
      stop_on_error_(stop_on_error),
      shared_(std::make_shared<Shared>()) {}

FanOut::~FanOut() {
  if (waited_ || calls_.empty()) return;
  // Never waited for: give up on everything still running, and wait for it,
  // since attempts refer to buffers their owner is about to free.
  first_error_ = absl::CancelledError("abandoned");
  Run();
}

void FanOut::Start(std::vector<Call> calls) {
  calls_ = std::move(calls);
  slots_.resize(calls_.size());
  results_.assign(calls_.size(), absl::OkStatus());
  unfinished_ = static_cast<int>(calls_.size());
  deadline_ = env_.clock->Now() + policy_.call_deadline;
  for (size_t i = 0; i < calls_.size(); ++i) StartAttempt(static_cast<int>(i));
}

void FanOut::StartAttempt(int i) {
  Slot& slot = slots_[i];
  ++slot.attempts;
  slot.in_flight = true;
  slot.attempt_start = env_.clock->Now();
  if (calls_[i].cancel) {
    slot.ctx = nullptr;  // a stream request: its stream has the context
  } else {
    slot.ctx = std::make_unique<grpc::ClientContext>();
    slot.ctx->set_deadline(absl::ToChronoTime(
        std::min(absl::Now() + policy_.attempt_timeout,
                 absl::Now() + (deadline_ - env_.clock->Now()))));
  }
  std::shared_ptr<Shared> shared = shared_;
  {
    absl::MutexLock l(&shared->mu);
    ++shared->in_flight;
  }
  calls_[i].start(slot.ctx.get(),
                  [shared, i, queue = env_.queue](absl::Status s) {
                    absl::MutexLock l(&shared->mu);
                    const bool failed = !s.ok();
                    shared->done.emplace_back(i, std::move(s));
                    if (--shared->in_flight == 0 || failed) {
                      shared->ready = true;
                      shared->has_work.store(true, std::memory_order_release);
                      shared->cv.Signal();
                      // Under mu: the waiter cannot be gone (it takes mu to
                      // consume this).
                      if (queue != nullptr) queue->Notify();
                    }
                  });
}

void FanOut::CancelInFlight() {
  for (size_t k = 0; k < slots_.size(); ++k) {
    if (!slots_[k].in_flight) continue;
    if (slots_[k].ctx != nullptr) slots_[k].ctx->TryCancel();
    if (calls_[k].cancel) calls_[k].cancel();
  }
}

void FanOut::Fail(int i, const absl::Status& s) {
  results_[i] = s;
  if (!first_error_.ok() || !stop_on_error_) {
    if (first_error_.ok()) first_error_ = s;
    return;
  }
  first_error_ = s;
  CancelInFlight();
}

absl::Time FanOut::TendSlots(bool gave_up, absl::Time now) {
  absl::Time wake = gave_up ? absl::InfiniteFuture() : deadline_;
  if (!gave_up && policy_.stop != nullptr) {
    wake = std::min(wake, now + kStopPoll);
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (!gave_up && slot.in_flight) {
      // A long wait says what it waits for.
      const absl::Time due =
          std::max(slot.attempt_start, slot.last_wait_report) +
          policy_.report_every;
      if (now >= due) {
        slot.last_wait_report = now;
        env_.logger->info(
            "{} on {}: no answer yet after {}, waiting up to {} more", method_,
            env_.shard_name(calls_[i].shard),
            absl::FormatDuration(
                absl::Trunc(now - slot.attempt_start, absl::Seconds(1))),
            absl::FormatDuration(
                absl::Trunc(deadline_ - now, absl::Seconds(1))));
      } else {
        wake = std::min(wake, due);
      }
    }
    if (slot.finished || slot.in_flight) continue;
    const bool stopped = stop_on_error_ && !first_error_.ok();
    if (gave_up || stopped) {
      slot.finished = true;
      --unfinished_;
      if (results_[i].ok()) {
        results_[i] =
            stopped ? absl::CancelledError("another shard failed")
                    : absl::DeadlineExceededError(absl::StrCat(
                          method_, " on ", env_.shard_name(calls_[i].shard),
                          ": no answer within the call deadline of ",
                          absl::FormatDuration(policy_.call_deadline), " (",
                          slot.attempts, " attempts; last error: ",
                          slot.last_error.ToString(), ")"));
        if (first_error_.ok()) first_error_ = results_[i];
      }
      continue;
    }
    if (slot.next_start > now) {
      wake = std::min(wake, slot.next_start);
      continue;
    }
    StartAttempt(static_cast<int>(i));
  }
  return wake;
}

bool FanOut::ScheduleRetry(int i, const absl::Status& status, bool gave_up,
                           const std::string& where) {
  Slot& slot = slots_[i];
  const absl::Time t = env_.clock->Now();
  if (gave_up || !(first_error_.ok() || !stop_on_error_) ||
      !IsRetriable(status) || t >= deadline_ ||
      (policy_.max_attempts != 0 && slot.attempts >= policy_.max_attempts)) {
    return false;
  }
  absl::Duration backoff = policy_.initial_backoff;
  for (int k = 1; k < slot.attempts && backoff < policy_.max_backoff; ++k) {
    backoff *= 2;
  }
  backoff =
      std::min(backoff, policy_.max_backoff) * absl::Uniform(rng_, 0.5, 1.5);
  slot.next_start = t + backoff;
  if (slot.first_failure == absl::InfiniteFuture()) {
    slot.first_failure = t;
    slot.last_report = t;
    env_.logger->warn(
        "{} failed: {}; retrying for up to {}", where, status.ToString(),
        absl::FormatDuration(absl::Trunc(deadline_ - t, absl::Seconds(1))));
  } else if (t - slot.last_report >= policy_.report_every) {
    slot.last_report = t;
    env_.logger->warn("{}: still failing after {} ({} attempts): {}", where,
                      absl::FormatDuration(absl::Trunc(t - slot.first_failure,
                                                       absl::Seconds(1))),
                      slot.attempts, status.ToString());
  }
  return true;
}

void FanOut::Settle(int i, absl::Status status, bool gave_up) {
  Slot& slot = slots_[i];
  slot.in_flight = false;
  const std::string where =
      absl::StrCat(method_, " on ", env_.shard_name(calls_[i].shard));
  if (status.ok()) {
    slot.finished = true;
    --unfinished_;
    if (slot.attempts > 1) {
      env_.logger->info(
          "{} answered after {} attempts ({})", where, slot.attempts,
          absl::FormatDuration(absl::Trunc(
              env_.clock->Now() - slot.first_failure, absl::Milliseconds(1))));
    }
    if (calls_[i].on_ok && (first_error_.ok() || !stop_on_error_)) {
      absl::Status s = calls_[i].on_ok();
      if (!s.ok()) {
        Fail(i, absl::Status(s.code(), absl::StrCat(where, ": ", s.message())));
      }
    }
    return;
  }
  slot.last_error = status;
  if (ScheduleRetry(i, status, gave_up, where)) return;
  slot.finished = true;
  --unfinished_;
  if (gave_up && first_error_.ok()) {
    status = absl::DeadlineExceededError(
        absl::StrCat("no answer within the call deadline of ",
                     absl::FormatDuration(policy_.call_deadline),
                     "; last error: ", status.ToString()));
  }
  if (slot.attempts > 1) {
    status = absl::Status(
        status.code(),
        absl::StrCat("after ", slot.attempts, " attempts: ", status.message()));
  }
  if (results_[i].ok()) {
    Fail(i, absl::Status(status.code(),
                         absl::StrCat(where, ": ", status.message())));
  }
}

void FanOut::Run() {
  bool gave_up = false;  // the deadline passed, or the owner abandoned us
  absl::Time next_poll = env_.clock->Now() + kStopPoll;
  while (unfinished_ > 0) {
    const absl::Time now = env_.clock->Now();
    if (!gave_up && policy_.stop != nullptr && policy_.poll &&
        now >= next_poll) {
      policy_.poll();
      next_poll = now + kStopPoll;
    }
    if (!gave_up && policy_.stop != nullptr && policy_.stop->load() &&
        first_error_.ok()) {
      first_error_ = absl::CancelledError(
          absl::StrCat(method_, ": stopped (the process was asked to stop)"));
    }
    if (!gave_up && (now >= deadline_ || absl::IsCancelled(first_error_))) {
      gave_up = true;
      CancelInFlight();
    }
    const absl::Time wake = TendSlots(gave_up, now);
    if (unfinished_ == 0) break;

    // One wake-up per batch of completions.
    std::vector<std::pair<int, absl::Status>> done;
    const absl::Duration wait = wake - env_.clock->Now();
    if (env_.queue != nullptr && wait > absl::ZeroDuration()) {
      Shared* shared = shared_.get();
      env_.queue->WaitUntil(wait, [shared] {
        return shared->has_work.load(std::memory_order_acquire);
      });
    }
    {
      absl::MutexLock l(&shared_->mu);
      if (env_.queue == nullptr && !shared_->ready &&
          wait > absl::ZeroDuration()) {
        shared_->cv.WaitWithTimeout(&shared_->mu, wait);
      }
      shared_->ready = false;
      shared_->has_work.store(false, std::memory_order_relaxed);
      done.swap(shared_->done);
    }
    for (auto& [i, status] : done) Settle(i, std::move(status), gave_up);
  }
}

std::vector<absl::Status> FanOut::WaitAll() {
  waited_ = true;
  Run();
  return results_;
}

absl::Status FanOut::Wait() {
  waited_ = true;
  Run();
  return first_error_;
}

}  // namespace asyncps
