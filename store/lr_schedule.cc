#include "store/lr_schedule.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace asyncps {

LrSchedule::LrSchedule(const OptimizerSpec& created)
    : created_(created.learning_rate()), rate_(created.learning_rate()) {}

absl::Status LrSchedule::Check(absl::string_view name,
                               const LearningRate& rate) const {
  if (!std::isfinite(rate.learning_rate()) || rate.learning_rate() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rate of ", QuoteName(name), " must be > 0, got ",
                     rate.learning_rate()));
  }
  if (rate.step() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule step of ", QuoteName(name),
                     " must be >= 1, got ", rate.step()));
  }
  absl::MutexLock l(&mu_);
  if (rate.step() == step_ && rate.learning_rate() != rate_) {
    return absl::AlreadyExistsError(absl::StrCat(
        "learning rate of ", QuoteName(name), " at schedule step ", step_,
        " is ", rate_, " on the shard, ", rate.learning_rate(),
        " asked (workers disagree on the schedule)"));
  }
  return absl::OkStatus();
}

bool LrSchedule::Apply(const LearningRate& rate) {
  absl::MutexLock l(&mu_);
  if (rate.step() <= step_) return false;
  step_ = rate.step();
  rate_ = rate.learning_rate();
  factor_.store(rate_ / created_, std::memory_order_relaxed);
  return true;
}

void LrSchedule::Annotate(OptimizerSpec* spec) const {
  absl::MutexLock l(&mu_);
  if (step_ == 0) {
    ClearSchedule(spec);
    return;
  }
  spec->set_scheduled_learning_rate(rate_);
  spec->set_schedule_step(step_);
}

bool LrSchedule::Current(LearningRate* rate) const {
  absl::MutexLock l(&mu_);
  if (step_ == 0) return false;
  rate->set_learning_rate(rate_);
  rate->set_step(step_);
  return true;
}

void ClearSchedule(OptimizerSpec* spec) {
  spec->clear_scheduled_learning_rate();
  spec->clear_schedule_step();
}

bool ScheduleOf(absl::string_view name, const OptimizerSpec& spec,
                LearningRate* rate) {
  if (spec.schedule_step() == 0) return false;
  rate->set_name(std::string(name));
  rate->set_learning_rate(spec.scheduled_learning_rate());
  rate->set_step(spec.schedule_step());
  return true;
}

}  // namespace asyncps
