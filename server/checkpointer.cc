#include "server/checkpointer.h"

#include <unistd.h>

#include <cerrno>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/steady_wait.h"
#include "server/checkpoint_dir.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Start(
    CheckpointerOptions options) {
  if (options.logger == nullptr || options.clock == nullptr ||
      options.fs == nullptr || options.capture == nullptr) {
    return absl::InvalidArgumentError(
        "CheckpointerOptions.logger, clock, fs and capture are required");
  }
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("checkpoint directory is empty");
  }
  if (options.full_every > 1 && options.capture_delta == nullptr) {
    return absl::InvalidArgumentError(
        "CheckpointerOptions.capture_delta is required with full_every > 1");
  }
  if (options.full_every < 0 || !(options.delta_max_fraction > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "full checkpoint interval must be >= 0 and the delta fraction > 0, "
        "got ",
        options.full_every, " and ", options.delta_max_fraction));
  }
  if (options.every < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint interval must be >= 0, got ",
                     absl::FormatDuration(options.every)));
  }
  if (absl::Status made = options.fs->CreateDirs(options.dir); !made.ok()) {
    return absl::Status(made.code(),
                        absl::StrCat("cannot create checkpoint directory ",
                                     options.dir, ": ", made.message()));
  }
  if (::access(options.dir.c_str(), W_OK | X_OK) != 0) {
    return absl::ErrnoToStatus(
        errno,
        absl::StrCat("checkpoint directory ", options.dir, " is not writable"));
  }
  std::unique_ptr<Checkpointer> c(new Checkpointer(std::move(options)));
  c->thread_ = std::thread([p = c.get()] { p->Loop(); });
  return c;
}

Checkpointer::Checkpointer(CheckpointerOptions options)
    : options_(std::move(options)) {}

Checkpointer::~Checkpointer() { Stop(); }

void Checkpointer::Request(Done done) {
  {
    absl::MutexLock l(&mu_);
    if (!stop_) {
      pending_.push_back(std::move(done));
      woken_.notify_all();
      return;
    }
  }
  done(absl::UnavailableError("the shard is shutting down"));
}

void Checkpointer::RequestFull(Done done) {
  full_asked_.fetch_add(1, std::memory_order_acq_rel);
  Request(std::move(done));
}

void Checkpointer::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    woken_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Checkpointer::Loop() {
  // The schedule is on the monotonic clock (and so is its wait: common/
  // steady_wait.h), so that the real-time clock stepped back an hour does
  // not put the next checkpoint off by an hour; options_.clock dates them.
  Clock* const steady = Clock::Monotonic();
  absl::Time next = options_.every > absl::ZeroDuration()
                        ? steady->Now() + options_.every
                        : absl::InfiniteFuture();
  while (true) {
    std::vector<Done> batch;
    {
      absl::MutexLock l(&mu_);
      AwaitSteadily(&mu_, &woken_, next - steady->Now(),
                    [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                      return stop_ || !pending_.empty();
                    });
      if (pending_.empty()) {
        if (stop_) return;
        if (steady->Now() < next) continue;  // spurious
      }
      batch.swap(pending_);
    }
    const absl::StatusOr<CheckpointInfo> result = WriteNow();
    if (options_.every > absl::ZeroDuration()) {
      next = steady->Now() + options_.every;
    }
    for (Done& done : batch) done(result);
  }
}

bool Checkpointer::NextIsDelta() const {
  return options_.full_every > 1 && chain_.valid &&
         chain_.deltas + 1 < options_.full_every &&
         static_cast<double>(chain_.delta_bytes) <
             options_.delta_max_fraction *
                 static_cast<double>(chain_.full_bytes);
}

void Checkpointer::Advance(const CheckpointImage& image,
                           const CheckpointInfo& info, uint32_t crc) {
  if (image.delta) {
    ++chain_.next.sequence;
    chain_.next.previous_crc = crc;
    chain_.since = image.epoch;
    chain_.delta_bytes += info.bytes();
    ++chain_.deltas;
    return;
  }
  chain_ = Chain();
  chain_.valid = true;
  chain_.next.base_crc = crc;
  chain_.next.base_bytes = info.bytes();
  chain_.next.base_unix_time_ms = info.unix_time_ms();
  chain_.since = image.epoch;
  chain_.full_bytes = info.bytes();
  // The previous chain's deltas follow no checkpoint now (a restore would
  // ignore them): removed, best effort.
  absl::StatusOr<int> pruned = PruneDeltaFiles(options_.dir, image.shard_index,
                                               image.num_shards, options_.fs);
  if (!pruned.ok()) {
    options_.logger->warn("removing old checkpoint deltas: {}",
                          pruned.status().ToString());
  } else if (*pruned > 0) {
    options_.logger->debug("removed {} delta(s) of the previous checkpoint",
                           *pruned);
  }
}

void Checkpointer::LogWritten(const CheckpointInfo& info) const {
  options_.logger->info(
      "checkpoint {}written: {} ({} bytes, {} tensors, {} slices, {} tables, "
      "{} rows, {} removed rows, {} workers) in {:.1f} ms; pushes held {:.1f} "
      "ms",
      info.delta() ? absl::StrCat("delta ", info.delta_sequence(), " ") : "",
      info.path(), info.bytes(), info.tensors(), info.slices(), info.tables(),
      info.rows(), info.removed_rows(), info.workers(), info.duration_ms(),
      info.pause_ms());
}

absl::StatusOr<CheckpointInfo> Checkpointer::WriteNow() {
  absl::MutexLock write(&write_mu_);
  // A full one when asked for since the last full one was decided.
  const uint64_t full_asked = full_asked_.load(std::memory_order_acquire);
  const bool delta = full_asked == full_served_ && NextIsDelta();
  const CheckpointImage image =
      delta ? options_.capture_delta(chain_.since, chain_.next)
            : options_.capture();
  uint32_t crc = 0;
  absl::StatusOr<CheckpointInfo> info =
      WriteCheckpoint(image, options_.dir, options_.clock, options_.fs, &crc);
  if (!info.ok()) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    if (std::optional<uint64_t> held = failure_lines_.Admit(
            info.status().ToString(), Clock::Monotonic()->Now())) {
      options_.logger->error("checkpoint failed: {}{}",
                             info.status().ToString(),
                             LogLimiter::HeldBack(*held));
    }
    absl::MutexLock l(&mu_);
    last_error_ = info.status().ToString();
    return info;
  }
  failure_lines_.Reset();
  written_.fetch_add(1, std::memory_order_relaxed);
  if (!delta) full_served_ = full_asked;
  Advance(image, *info, crc);
  LogWritten(*info);
  absl::MutexLock l(&mu_);
  last_ = *info;
  last_error_.clear();
  return info;
}

std::string Checkpointer::last_error() const {
  absl::MutexLock l(&mu_);
  return last_error_;
}

CheckpointInfo Checkpointer::last() const {
  absl::MutexLock l(&mu_);
  return last_;
}

}  // namespace asyncps
