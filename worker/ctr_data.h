#ifndef ASYNCPS_WORKER_CTR_DATA_H_
#define ASYNCPS_WORKER_CTR_DATA_H_

// A synthetic click log with a known ground truth, in the spirit of the
// data DLRM and HugeCTR generate for scale tests: categorical fields whose
// ids follow Zipf distributions (millions of distinct ids in all), a few
// dense features, and click labels drawn from a hidden model, so that the
// best achievable (Bayes-optimal) test AUC is known and a trained model can
// be measured against it.
//
// Everything is a pure function of the options (the seed included): example
// i of the train or test split is the same on every worker and every run,
// so workers generate only their own share.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace asyncps {

struct CtrDataOptions {
  uint64_t seed = 1;
  // Distinct ids per categorical field (a field's id space); a field's ids
  // are drawn Zipf(zipf_exponent) by popularity rank, then hashed to a
  // uint64 id.
  std::vector<int64_t> vocab = {2000000, 1000000, 500000, 200000,
                                50000,   10000,   1000,   100};
  double zipf_exponent = 1.2;
  int dense_features = 4;
  // The hidden model (logit of the click probability):
  //   bias + sum_f effect_f(id_f) + sum_{f<g} <factor_f(id_f), factor_g(id_g)>
  //   + sum_j dense_weight_j x_j + dense_pair * x_0 * x_1
  // with per-id effects ~ N(0, effect_scale^2) and factors of
  // `factor_dim` values ~ N(0, factor_scale^2 / factor_dim), each a hash of
  // (seed, field, rank), and dense features x_j ~ N(0, 1).
  double bias = -1.0;
  double effect_scale = 0.6;
  int factor_dim = 4;
  double factor_scale = 0.4;
  double dense_scale = 0.4;
  double dense_pair = 0.3;
  // A drifting id space (off at 0): each categorical id of an example is,
  // with probability drift_share, a fresh id instead, drawn
  // Zipf(zipf_exponent) by rank within a window of drift_window ids that
  // moves drift_ids_per_example ids forward per train example, the newest
  // id ranked first: ids appear, are popular for a while and fade. Train
  // example i is drawn at position i of the stream; test examples at
  // drift_test_at (the trainer sets the end of the train split).
  // Fresh ids per field that pass through the window: drift_window +
  // drift_ids_per_example x train examples; each is drawn about
  // drift_share / drift_ids_per_example times, so about 1 - exp(-that) of
  // them are ever seen (0.26 at 0.3 and 1: 9.5M examples, 8 fields, gave
  // 20.9M distinct ids, the fields' own vocabularies included).
  double drift_share = 0;
  int64_t drift_window = 100000;
  double drift_ids_per_example = 1.0;
  int64_t drift_test_at = 0;
};

// Checks the options; the message names the field.
absl::Status ValidateCtrData(const CtrDataOptions& options);

// A block of examples, row-major: ids[i * fields + f], dense[i * dense + j].
struct CtrExamples {
  int fields = 0;
  int dense_features = 0;
  std::vector<uint64_t> ids;
  std::vector<float> dense;
  std::vector<float> labels;       // 0 or 1
  std::vector<float> probability;  // the hidden model's click probability
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

enum class CtrSplit { kTrain, kTest };

// The generator. Thread-safe (immutable).
class CtrData {
 public:
  // REQUIRES: ValidateCtrData(options).ok().
  explicit CtrData(CtrDataOptions options);

  const CtrDataOptions& options() const { return o_; }
  int fields() const { return static_cast<int>(o_.vocab.size()); }

  // Examples [begin, end) of a split.
  CtrExamples Generate(CtrSplit split, int64_t begin, int64_t end) const;
  // The examples of a split at `indices` (any order), into `out` (resized).
  void Generate(CtrSplit split, absl::Span<const int64_t> indices,
                CtrExamples* out) const;

  // The id of popularity rank r (1-based) of field f: a hash, distinct per
  // field.
  uint64_t IdOf(int field, uint64_t rank) const;

 private:
  // Zipf(exponent) over [1, n] by rejection-inversion (Hormann and
  // Derflinger 1996): O(1) memory and a few uniforms per draw.
  struct Zipf {
    double n = 1, s = 1, h_x1 = 0, h_n = 0, t = 0;
  };
  static Zipf MakeZipf(int64_t n, double s);
  static double HIntegral(const Zipf& z, double x);
  static double HIntegralInverse(const Zipf& z, double x);
  static double H(const Zipf& z, double x);
  // A rank in [1, z.n], from uniforms in [0, 1).
  static int64_t DrawRank(const Zipf& z, absl::FunctionRef<double()> uniform);
  // The id of field f of an example at stream position `time`, from
  // uniforms in [0, 1).
  uint64_t DrawId(int f, int64_t time,
                  absl::FunctionRef<double()> uniform) const;
  // Example `index` of `split` (drawn at stream position `time`) into slot
  // i of `out`.
  void Fill(uint64_t split_salt, int64_t index, int64_t time, size_t i,
            CtrExamples* out) const;

  const CtrDataOptions o_;
  std::vector<Zipf> zipf_;       // per field
  Zipf drift_zipf_;              // over the drifting window
  std::vector<double> dense_w_;  // the hidden model's dense weights
};

// Area under the ROC curve of `scores` for 0/1 `labels` (ties count half),
// by sorting: the probability that a random positive scores above a random
// negative. 0.5 when either class is missing.
double Auc(absl::Span<const float> scores, absl::Span<const float> labels);

// Mean binary cross-entropy of probabilities (clamped to [1e-7, 1 - 1e-7]).
double LogLoss(absl::Span<const float> probability,
               absl::Span<const float> labels);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_CTR_DATA_H_
