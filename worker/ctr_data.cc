#include "worker/ctr_data.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/stable_hash.h"

namespace asyncps {

namespace {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
// Salts that keep the hash streams of different uses apart.
constexpr uint64_t kTrainSalt = 0x747261696e000000ull;
constexpr uint64_t kTestSalt = 0x7465737400000000ull;
constexpr uint64_t kIdSalt = 0x6964000000000000ull;
constexpr uint64_t kTruthSalt = 0x7472757468000000ull;

// A counter-based stream of random numbers: draw c is a hash of (key, c).
class Stream {
 public:
  explicit Stream(uint64_t key) : key_(key) {}
  uint64_t Bits() { return Mix64(key_ + (++counter_) * kGamma); }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Bits() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller; one value per two uniforms).
  double Normal() {
    const double u = 1.0 - Uniform();  // (0, 1]
    const double v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
  }

 private:
  const uint64_t key_;
  uint64_t counter_ = 0;
};

double Helper1(double x) {  // log1p(x) / x
  return std::abs(x) > 1e-8 ? std::log1p(x) / x
                            : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

double Helper2(double x) {  // expm1(x) / x
  return std::abs(x) > 1e-8
             ? std::expm1(x) / x
             : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

absl::Status ValidateCtrData(const CtrDataOptions& o) {
  if (o.vocab.empty() || o.vocab.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ctr data: 1 to 64 categorical fields, got ", o.vocab.size()));
  }
  for (size_t f = 0; f < o.vocab.size(); ++f) {
    if (o.vocab[f] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ctr data: vocab of field ", f, " must be >= 1, got ", o.vocab[f]));
    }
  }
  if (!(o.zipf_exponent > 0 && o.zipf_exponent < 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ctr data: zipf_exponent must be in (0, 10), got ", o.zipf_exponent));
  }
  if (o.dense_features < 0 || o.dense_features > 1024 || o.factor_dim < 1 ||
      o.factor_dim > 64) {
    return absl::InvalidArgumentError(
        "ctr data: dense_features must be in [0, 1024] and factor_dim in "
        "[1, 64]");
  }
  if (!(o.drift_share >= 0 && o.drift_share <= 1) || o.drift_window < 1 ||
      !(o.drift_ids_per_example >= 0 && o.drift_ids_per_example <= 1e6) ||
      o.drift_test_at < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ctr data: drift_share must be in [0, 1] (got ", o.drift_share,
        "), drift_window >= 1 (got ", o.drift_window,
        "), drift_ids_per_example in [0, 1e6] (got ", o.drift_ids_per_example,
        ") and drift_test_at >= 0"));
  }
  for (double v :
       {o.bias, o.effect_scale, o.factor_scale, o.dense_scale, o.dense_pair}) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          "ctr data: the hidden model's scales must be finite");
    }
  }
  return absl::OkStatus();
}

CtrData::Zipf CtrData::MakeZipf(int64_t n, double s) {
  Zipf z;
  z.n = static_cast<double>(n);
  z.s = s;
  z.h_x1 = HIntegral(z, 1.5) - 1.0;
  z.h_n = HIntegral(z, z.n + 0.5);
  z.t = 2.0 - HIntegralInverse(z, HIntegral(z, 2.5) - H(z, 2.0));
  return z;
}

double CtrData::H(const Zipf& z, double x) {
  return std::exp(-z.s * std::log(x));
}

double CtrData::HIntegral(const Zipf& z, double x) {
  const double log_x = std::log(x);
  return Helper2((1.0 - z.s) * log_x) * log_x;
}

double CtrData::HIntegralInverse(const Zipf& z, double x) {
  double t = x * (1.0 - z.s);
  if (t < -1.0) t = -1.0;
  return std::exp(Helper1(t) * x);
}

CtrData::CtrData(CtrDataOptions options) : o_(std::move(options)) {
  for (int64_t n : o_.vocab) zipf_.push_back(MakeZipf(n, o_.zipf_exponent));
  drift_zipf_ = MakeZipf(o_.drift_window, o_.zipf_exponent);
  Stream s(Mix64(o_.seed ^ kTruthSalt));
  for (int j = 0; j < o_.dense_features; ++j) {
    dense_w_.push_back(o_.dense_scale * s.Normal());
  }
}

uint64_t CtrData::IdOf(int field, uint64_t rank) const {
  return Mix64(Mix64(o_.seed ^ kIdSalt) +
               static_cast<uint64_t>(field) * kGamma + Mix64(rank));
}

CtrExamples CtrData::Generate(CtrSplit split, int64_t begin,
                              int64_t end) const {
  std::vector<int64_t> indices(
      static_cast<size_t>(std::max<int64_t>(0, end - begin)));
  std::iota(indices.begin(), indices.end(), begin);
  CtrExamples out;
  Generate(split, indices, &out);
  return out;
}

void CtrData::Generate(CtrSplit split, absl::Span<const int64_t> indices,
                       CtrExamples* out) const {
  const size_t n = indices.size();
  out->fields = fields();
  out->dense_features = o_.dense_features;
  out->ids.resize(n * out->fields);
  out->dense.resize(n * out->dense_features);
  out->labels.resize(n);
  out->probability.resize(n);
  const bool train = split == CtrSplit::kTrain;
  const uint64_t salt = train ? kTrainSalt : kTestSalt;
  for (size_t i = 0; i < n; ++i) {
    Fill(salt, indices[i], train ? indices[i] : o_.drift_test_at, i, out);
  }
}

int64_t CtrData::DrawRank(const Zipf& z, absl::FunctionRef<double()> uniform) {
  for (;;) {
    const double v = z.h_n + uniform() * (z.h_x1 - z.h_n);
    const double x = HIntegralInverse(z, v);
    const int64_t rank = std::clamp<int64_t>(static_cast<int64_t>(x + 0.5), 1,
                                             static_cast<int64_t>(z.n));
    if (rank - x <= z.t ||
        v >= HIntegral(z, rank + 0.5) - H(z, static_cast<double>(rank))) {
      return rank;
    }
  }
}

uint64_t CtrData::DrawId(int f, int64_t time,
                         absl::FunctionRef<double()> uniform) const {
  if (o_.drift_share > 0 && uniform() < o_.drift_share) {
    // Fresh ids follow the field's own ranks; the newest is rank 1.
    const int64_t head = static_cast<int64_t>(static_cast<double>(time) *
                                              o_.drift_ids_per_example);
    const int64_t fresh =
        head + o_.drift_window - DrawRank(drift_zipf_, uniform);
    return IdOf(f, static_cast<uint64_t>(o_.vocab[f] + 1 + fresh));
  }
  return IdOf(f, static_cast<uint64_t>(DrawRank(zipf_[f], uniform)));
}

void CtrData::Fill(uint64_t split_salt, int64_t index, int64_t time, size_t i,
                   CtrExamples* out) const {
  const int nf = fields();
  const int nd = o_.dense_features;
  const int k = o_.factor_dim;
  const double factor_sd = o_.factor_scale / std::sqrt(static_cast<double>(k));
  double sum[64] = {0};  // factor_dim <= 64 (ValidateCtrData)
  Stream s(Mix64(o_.seed ^ Mix64(split_salt + static_cast<uint64_t>(index))));
  double logit = o_.bias;
  double squares = 0;
  for (int f = 0; f < nf; ++f) {
    const uint64_t id = DrawId(f, time, [&s] { return s.Uniform(); });
    out->ids[i * nf + f] = id;
    // The id's hidden effect and factors.
    Stream truth(Mix64(o_.seed ^ kTruthSalt ^ id));
    logit += o_.effect_scale * truth.Normal();
    for (int d = 0; d < k; ++d) {
      const double u = factor_sd * truth.Normal();
      sum[d] += u;
      squares += u * u;
    }
  }
  // sum_{f<g} <u_f, u_g> = (|sum u|^2 - sum |u_f|^2) / 2
  double pairs = -squares;
  for (int d = 0; d < k; ++d) pairs += sum[d] * sum[d];
  logit += 0.5 * pairs;
  float* x = out->dense.data() + i * nd;
  for (int j = 0; j < nd; ++j) {
    x[j] = static_cast<float>(s.Normal());
    logit += dense_w_[j] * x[j];
  }
  if (nd >= 2) logit += o_.dense_pair * x[0] * x[1];
  const double p = Sigmoid(logit);
  out->probability[i] = static_cast<float>(p);
  out->labels[i] = s.Uniform() < p ? 1.0f : 0.0f;
}

double Auc(absl::Span<const float> scores, absl::Span<const float> labels) {
  const size_t n = std::min(scores.size(), labels.size());
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: sum of the positives' ranks (ties get their mean rank).
  double positive_ranks = 0;
  double positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double tied_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      tied_positives += labels[order[j]] > 0.5f;
      ++j;
    }
    const double mean_rank = 0.5 * static_cast<double>(i + 1 + j);
    positive_ranks += tied_positives * mean_rank;
    positives += tied_positives;
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (positive_ranks - positives * (positives + 1) / 2) /
         (positives * negatives);
}

double LogLoss(absl::Span<const float> probability,
               absl::Span<const float> labels) {
  const size_t n = std::min(probability.size(), labels.size());
  if (n == 0) return 0;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::clamp<double>(probability[i], 1e-7, 1 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return sum / static_cast<double>(n);
}

}  // namespace asyncps
