#include "store/dense_slice.h"

#include <algorithm>

#include "common/initializer.h"

namespace asyncps {

DenseSlice::DenseSlice(const TensorSpec& spec, const TensorLayout& layout,
                       uint32_t index, bool initialize, const float* given)
    : index_(index),
      size_(layout.SliceSize(index)),
      values_(size_),
      optimizer_(SliceOptimizer::Create(spec.optimizer(), size_)) {
  if (!initialize) return;
  if (given != nullptr) {
    std::copy_n(given + layout.SliceBegin(index), size_, values_.data());
  } else {
    InitializeSlice(spec, layout, index, values_.data());
  }
}

uint64_t DenseSlice::version() const {
  absl::ReaderMutexLock l(&mu_);
  return version_;
}

void DenseSlice::CopyOut(const std::string& tensor, const Sink& sink) const {
  absl::ReaderMutexLock l(&mu_);
  sink(tensor, index_, version_, absl::MakeConstSpan(values_));
}

void DenseSlice::Apply(const Payload& g, uint64_t read_version,
                       const StalenessRule& rule, float lr_factor,
                       const ChangeEpoch& epoch, SliceResult* result) {
  absl::MutexLock l(&mu_);
  MarkChanged(epoch.current());
  const uint64_t staleness = version_ - read_version;
  result->set_staleness(staleness);
  if (rule.Refuses(staleness)) {
    result->set_outcome(REFUSED_STALE);
    result->set_new_version(version_);
    result->set_lr_scale(0);
    return;
  }
  const float scale = rule.LrScale(staleness);
  ++version_;
  optimizer_->Apply(values_.data(), g, scale * lr_factor, version_);
  result->set_outcome(APPLIED);
  result->set_new_version(version_);
  result->set_lr_scale(scale);
}

void DenseSlice::Assign(const Payload& values, const ChangeEpoch& epoch,
                        SliceResult* result) {
  absl::MutexLock l(&mu_);
  MarkChanged(epoch.current());
  DecodePayload(values, values_.data());
  ++version_;
  result->set_outcome(APPLIED);
  result->set_new_version(version_);
  result->set_lr_scale(1);
}

absl::Status DenseSlice::Read(
    absl::FunctionRef<absl::Status(const View&)> visit) const {
  absl::ReaderMutexLock l(&mu_);
  View view;
  view.index = index_;
  view.version = version_;
  view.changed = changed();
  view.values = absl::MakeConstSpan(values_);
  view.optimizer_state = optimizer_->state();
  return visit(view);
}

void DenseSlice::Import(uint64_t version, absl::string_view values,
                        absl::Span<const absl::string_view> state) {
  absl::MutexLock l(&mu_);
  version_ = version;
  DecodeFloats(values, values_.data(), values_.size());
  std::vector<absl::Span<float>> buffers = optimizer_->mutable_state();
  for (size_t i = 0; i < buffers.size(); ++i) {
    DecodeFloats(state[i], buffers[i].data(), buffers[i].size());
  }
}

size_t DenseSlice::optimizer_bytes() const {
  absl::ReaderMutexLock l(&mu_);
  return optimizer_->state_bytes();
}

}  // namespace asyncps
