#include "serving/snapshot.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/names.h"

namespace asyncps {

SnapshotKeeper::SnapshotKeeper(ParameterSource* source,
                               std::vector<std::string> names,
                               absl::Duration refresh,
                               std::shared_ptr<spdlog::logger> logger)
    : source_(source),
      names_(std::move(names)),
      refresh_(refresh),
      logger_(std::move(logger)) {}

SnapshotKeeper::~SnapshotKeeper() { Stop(); }

absl::Status SnapshotKeeper::Refresh() {
  absl::MutexLock read(&read_mu_);
  absl::StatusOr<ListTensorsResponse> specs = source_->List();
  absl::Status s = specs.status();
  auto next = std::make_shared<Snapshot>();
  if (s.ok()) {
    absl::flat_hash_map<std::string, int64_t> elems;
    for (const TensorSpec& spec : specs->tensors()) {
      int64_t n = 1;
      for (int64_t d : spec.shape()) n *= d;
      elems[spec.name()] = n;
    }
    std::vector<std::pair<std::string, float*>> outs;
    next->names = names_;
    next->values.resize(names_.size());
    for (size_t i = 0; i < names_.size() && s.ok(); ++i) {
      auto it = elems.find(names_[i]);
      if (it == elems.end()) {
        s = absl::NotFoundError(absl::StrCat(
            source_->Describe(), " holds no tensor ", QuoteName(names_[i])));
        break;
      }
      if (!sizes_.empty() && sizes_[i] != it->second) {
        s = absl::FailedPreconditionError(absl::StrCat(
            source_->Describe(), " now holds ", it->second, " elements of ",
            QuoteName(names_[i]), ", the served model ", sizes_[i],
            " (another run or a re-created tensor): restart ps_serve to "
            "serve it"));
        break;
      }
      next->values[i].resize(it->second);
      outs.emplace_back(names_[i], next->values[i].data());
    }
    if (s.ok()) s = source_->Read(outs, &next->versions);
  }
  if (!s.ok()) {
    failures_.fetch_add(1);
    absl::MutexLock l(&mu_);
    if (last_error_.empty()) {
      logger_->warn(
          "snapshot refresh from {} failed (serving the last one): "
          "{}",
          source_->Describe(), s.ToString());
    }
    last_error_ = s.ToString();
    return s;
  }
  if (sizes_.empty()) {
    for (const std::vector<float>& v : next->values) {
      sizes_.push_back(static_cast<int64_t>(v.size()));
    }
  }
  next->id = next_id_++;
  next->taken = absl::Now();
  for (uint64_t v : next->versions) next->version_sum += v;
  absl::MutexLock l(&mu_);
  if (!last_error_.empty()) {
    logger_->info("snapshot refresh from {} works again", source_->Describe());
  }
  last_error_.clear();
  current_ = std::move(next);
  return absl::OkStatus();
}

void SnapshotKeeper::Start() {
  if (refresh_ <= absl::ZeroDuration() || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void SnapshotKeeper::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void SnapshotKeeper::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(refresh_)) {
    Refresh().IgnoreError();  // counted and logged
  }
}

std::shared_ptr<const Snapshot> SnapshotKeeper::Current() const {
  absl::MutexLock l(&mu_);
  return current_;
}

std::string SnapshotKeeper::last_error() const {
  absl::MutexLock l(&mu_);
  return last_error_;
}

}  // namespace asyncps
