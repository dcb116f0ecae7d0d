#ifndef ASYNCPS_STORE_LR_SCHEDULE_H_
#define ASYNCPS_STORE_LR_SCHEDULE_H_

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// The learning-rate schedule of one tensor or table (SetLearningRate in
// proto/asyncps.proto): the rate in effect and the schedule step that set
// it. The optimizer keeps the created rate; updates are scaled by factor()
// (the rate in effect over the created one), read on the push path without
// a lock.
//
// Thread-safe.
class LrSchedule {
 public:
  // REQUIRES: ValidateOptimizer(created).ok().
  explicit LrSchedule(const OptimizerSpec& created);
  LrSchedule(const LrSchedule&) = delete;
  LrSchedule& operator=(const LrSchedule&) = delete;

  // OK when `rate` may be applied: finite rate > 0, step >= 1, and not the
  // step in effect with another rate (ALREADY_EXISTS naming both). `name`
  // is for messages. Changes nothing.
  absl::Status Check(absl::string_view name, const LearningRate& rate) const;

  // Applies `rate` if its step is above the one in effect; returns whether
  // it did. REQUIRES: Check(rate).ok() (the caller
  // serializes Check and Apply against other writers).
  bool Apply(const LearningRate& rate);

  // The multiplier of the created rate in effect (1 until a schedule step).
  float factor() const { return factor_.load(std::memory_order_relaxed); }

  // Sets spec's scheduled_learning_rate and schedule_step to the ones in
  // effect (zero when no step was applied).
  void Annotate(OptimizerSpec* spec) const;

  // Fills rate with the rate and step in effect; false (rate untouched)
  // when no schedule step was applied.
  bool Current(LearningRate* rate) const;

 private:
  const float created_;
  mutable absl::Mutex mu_;
  float rate_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<float> factor_{1.0f};
};

// `spec` without its schedule (the created spec, a spec's identity).
void ClearSchedule(OptimizerSpec* spec);

// The schedule step a listed, checkpointed or journaled optimizer spec
// carries, as a LearningRate named `name`; false when it carries none.
bool ScheduleOf(absl::string_view name, const OptimizerSpec& spec,
                LearningRate* rate);

// A listed spec (a TensorSpec or TableSpec as listed, checkpointed or
// journaled) taken apart: the spec as created, and the schedule step its
// optimizer carried, if any.
template <typename Spec>
struct Unlisted {
  Spec spec;  // ClearSchedule'd
  std::optional<LearningRate> rate;
};

template <typename Spec>
Unlisted<Spec> Unlist(const Spec& listed) {
  Unlisted<Spec> out{listed, std::nullopt};
  LearningRate rate;
  if (ScheduleOf(listed.name(), listed.optimizer(), &rate)) out.rate = rate;
  ClearSchedule(out.spec.mutable_optimizer());
  return out;
}

}  // namespace asyncps

#endif  // ASYNCPS_STORE_LR_SCHEDULE_H_
