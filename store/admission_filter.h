#ifndef ASYNCPS_STORE_ADMISSION_FILTER_H_
#define ASYNCPS_STORE_ADMISSION_FILTER_H_

// Admission of sparse rows (TableSpec.admission): an id without a row gets
// one only once it has been pushed admit_count times (or, per push, with
// probability admit_probability). The pushes are counted in a count-min
// sketch, one per table partition, whose memory is fixed by the spec.
//
// Example:
//
//   const AdmissionRule rule(spec);  // ADMIT_COUNT, admit_count 2
//   CountMinSketch sketch(rule.sketch_width(), spec.seed());
//   rule.Admits(id, sketch.Add(id));  // false: the first push
//   rule.Admits(id, sketch.Add(id));  // true: the second one

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Counts of ids, approximately: kDepth rows of `width` 8-bit counters, each
// id adding to one counter per row (conservative update: only the smallest
// ones go up). An estimate is never below the true count (until counters
// saturate at 255 or are halved) and equals it when the id shares no
// counter with another. To follow a changing id stream, every counter is
// halved after 16 x width additions. Not thread-safe (the owner's lock).
class CountMinSketch {
 public:
  static constexpr int kDepth = 4;
  static constexpr uint32_t kMaxCount = 255;

  // REQUIRES: width is a power of two >= 64.
  CountMinSketch(uint32_t width, uint64_t seed);

  // Counts one occurrence of `id`; returns its new estimate.
  uint32_t Add(uint64_t id);
  uint32_t Estimate(uint64_t id) const;
  // The memory the counters take.
  uint64_t bytes() const { return counts_.size(); }

 private:
  void Positions(uint64_t id, uint32_t* at) const;

  const uint32_t mask_;
  const uint64_t seed_;
  std::vector<uint8_t> counts_;  // kDepth x width
  uint64_t adds_ = 0;            // since the last halving
};

// The admission settings of one table.
class AdmissionRule {
 public:
  static constexpr uint32_t kDefaultSketchWidth = 32768;
  static constexpr uint32_t kMaxSketchWidth = 1u << 22;

  // INVALID_ARGUMENT naming the table and the field: ADMIT_COUNT with
  // admit_count outside [1, 255], ADMIT_PROBABILITY with admit_probability
  // outside (0, 1], a sketch width that is not a power of two in [64, 2^22],
  // or admission fields set under ADMIT_ALL.
  static absl::Status Validate(const TableSpec& spec);

  // REQUIRES: Validate(spec).ok().
  explicit AdmissionRule(const TableSpec& spec);

  bool enabled() const { return policy_ != ADMIT_ALL; }
  uint32_t sketch_width() const { return width_; }
  // Bytes of the sketches of a table's `partitions` partitions.
  uint64_t SketchBytes(int partitions) const {
    return enabled() ? uint64_t{CountMinSketch::kDepth} * width_ * partitions
                     : 0;
  }
  // Whether the push that made `id`'s count `count` gives it a row.
  bool Admits(uint64_t id, uint32_t count) const;

 private:
  const AdmissionPolicy policy_;
  const uint32_t count_;
  const uint64_t probability_bits_;  // admit when a hash is below this
  const uint64_t seed_;
  const uint32_t width_;
};

}  // namespace asyncps

#endif  // ASYNCPS_STORE_ADMISSION_FILTER_H_
