// The synthetic click log is a pure function of its options, its id
// popularity follows the Zipf law asked for, and AUC / log loss are right on
// cases computed by hand.
#include "worker/ctr_data.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace asyncps {
namespace {

CtrDataOptions Small() {
  CtrDataOptions o;
  o.seed = 5;
  o.vocab = {100000, 1000, 10};
  o.zipf_exponent = 1.1;
  o.dense_features = 3;
  return o;
}

TEST_CASE("examples are a pure function of seed and index", "[ctr]") {
  const CtrData data(Small());
  const CtrExamples a = data.Generate(CtrSplit::kTrain, 100, 200);
  const CtrExamples b = CtrData(Small()).Generate(CtrSplit::kTrain, 100, 200);
  REQUIRE(a.ids == b.ids);
  REQUIRE(a.dense == b.dense);
  REQUIRE(a.labels == b.labels);
  REQUIRE(a.probability == b.probability);
  // By index, in any order: the same examples.
  CtrExamples c;
  data.Generate(CtrSplit::kTrain, std::vector<int64_t>{150, 100}, &c);
  // Example 150 is a's example 50: its three ids start at 50 * 3.
  REQUIRE(std::vector<uint64_t>(c.ids.begin(), c.ids.begin() + 3) ==
          std::vector<uint64_t>(a.ids.begin() + 150, a.ids.begin() + 153));
  REQUIRE(std::vector<uint64_t>(c.ids.begin() + 3, c.ids.end()) ==
          std::vector<uint64_t>(a.ids.begin(), a.ids.begin() + 3));
  REQUIRE(c.labels[1] == a.labels[0]);
  // Other seeds and the other split differ.
  CtrDataOptions other = Small();
  other.seed = 6;
  REQUIRE(CtrData(other).Generate(CtrSplit::kTrain, 100, 200).ids != a.ids);
  REQUIRE(data.Generate(CtrSplit::kTest, 100, 200).ids != a.ids);
  // Ids of different fields never collide in practice (hashed per field).
  REQUIRE(data.IdOf(0, 1) != data.IdOf(1, 1));
}

TEST_CASE("field ids follow the Zipf law", "[ctr]") {
  CtrDataOptions o = Small();
  o.vocab = {1000};
  o.zipf_exponent = 1.2;
  const CtrData data(o);
  const CtrExamples e = data.Generate(CtrSplit::kTrain, 0, 200000);
  absl::flat_hash_map<uint64_t, int64_t> count;
  for (uint64_t id : e.ids) ++count[id];
  double h = 0;
  for (int r = 1; r <= 1000; ++r) h += std::pow(r, -1.2);
  for (uint64_t rank : {1, 2, 10, 100}) {
    const double expected = 200000 * std::pow(rank, -1.2) / h;
    const double got = static_cast<double>(count[data.IdOf(0, rank)]);
    INFO("rank " << rank << ": " << got << " of " << expected);
    REQUIRE(std::abs(got - expected) < 5 * std::sqrt(expected) + 1);
  }
  REQUIRE(count.size() <= 1000);
}

TEST_CASE("labels follow the hidden probabilities", "[ctr]") {
  const CtrData data(Small());
  const CtrExamples e = data.Generate(CtrSplit::kTest, 0, 50000);
  double p = 0, y = 0;
  for (int64_t i = 0; i < e.size(); ++i) {
    p += e.probability[i];
    y += e.labels[i];
    REQUIRE((e.labels[i] == 0.0f || e.labels[i] == 1.0f));
  }
  REQUIRE(y / e.size() == Approx(p / e.size()).margin(0.01));
  // The hidden model separates clicks well, and better than chance.
  const double bayes = Auc(e.probability, e.labels);
  REQUIRE(bayes > 0.7);
  REQUIRE(bayes < 0.99);
}

TEST_CASE("AUC and log loss on hand-computed cases", "[ctr][auc]") {
  REQUIRE(Auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}) == Approx(0.75));
  REQUIRE(Auc({0.1f, 0.2f, 0.3f}, {0, 1, 1}) == 1.0);
  REQUIRE(Auc({0.3f, 0.2f, 0.1f}, {0, 1, 1}) == 0.0);
  // Ties count half: one positive and one negative with the same score.
  REQUIRE(Auc({0.5f, 0.5f}, {1, 0}) == 0.5);
  REQUIRE(Auc({0.2f, 0.5f, 0.5f, 0.9f}, {0, 1, 0, 1}) == Approx(0.875));
  REQUIRE(Auc({0.2f, 0.3f}, {1, 1}) == 0.5);  // one class only
  REQUIRE(LogLoss({0.5f, 0.5f}, {1, 0}) == Approx(std::log(2.0)));
  REQUIRE(LogLoss({0.9f, 0.2f}, {1, 0}) ==
          Approx(-(std::log(0.9) + std::log(0.8)) / 2));
}

TEST_CASE("bad data options are refused naming the field", "[ctr]") {
  CtrDataOptions o = Small();
  o.vocab = {};
  REQUIRE(absl::IsInvalidArgument(ValidateCtrData(o)));
  o = Small();
  o.vocab[1] = 0;
  REQUIRE(ValidateCtrData(o).message().find("vocab") != std::string::npos);
  o = Small();
  o.zipf_exponent = 0;
  REQUIRE(ValidateCtrData(o).message().find("zipf") != std::string::npos);
  REQUIRE(ValidateCtrData(Small()).ok());
}

TEST_CASE(
    "a drifting id space draws fresh ids from a moving window; off, the "
    "stream is unchanged",
    "[ctr][drift]") {
  CtrDataOptions o = Small();
  o.vocab = {100, 100};
  const CtrExamples plain = CtrData(o).Generate(CtrSplit::kTrain, 0, 4000);
  o.drift_window = 1000;
  o.drift_ids_per_example = 1.0;
  CtrDataOptions off = o;  // drift_share 0: the window settings change nothing
  REQUIRE(CtrData(off).Generate(CtrSplit::kTrain, 0, 4000).ids == plain.ids);

  o.drift_share = 0.5;
  const CtrData data(o);
  absl::flat_hash_set<uint64_t> stationary;
  for (int f = 0; f < 2; ++f) {
    for (uint64_t r = 1; r <= 100; ++r) stationary.insert(data.IdOf(f, r));
  }
  auto fresh_ids = [&](int64_t begin) {
    const CtrExamples e = data.Generate(CtrSplit::kTrain, begin, begin + 4000);
    absl::flat_hash_set<uint64_t> fresh;
    size_t drawn = 0;
    for (uint64_t id : e.ids) {
      if (stationary.contains(id)) continue;
      ++drawn;
      fresh.insert(id);
    }
    // About half the ids are fresh.
    REQUIRE(drawn > 0.45 * e.ids.size());
    REQUIRE(drawn < 0.55 * e.ids.size());
    return fresh;
  };
  const absl::flat_hash_set<uint64_t> early = fresh_ids(0);
  const absl::flat_hash_set<uint64_t> late = fresh_ids(100000);
  // Many distinct fresh ids, and none of the early window is left late.
  REQUIRE(early.size() > 1000);
  for (uint64_t id : late) REQUIRE_FALSE(early.contains(id));
  // A pure function of the index, drift included.
  REQUIRE(data.Generate(CtrSplit::kTrain, 100000, 100400).ids ==
          data.Generate(CtrSplit::kTrain, 100000, 100400).ids);
}

}  // namespace
}  // namespace asyncps
