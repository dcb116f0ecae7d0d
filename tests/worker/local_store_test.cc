// The --local parameter store (worker/local_store.h): exact values after
// pushes with each optimizer, slice versions and staleness, the read sets
// pulls return, and bad input that is refused without changing anything.
#include "worker/local_store.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/tensor_specs.h"
#include "worker/parameter_store.h"

namespace asyncps {
namespace {

// A 1-D tensor of `n` elements, every element `init`, cut into slices of
// `slice_elems`, trained with `opt`.
TensorSpec Spec(const std::string& name, int64_t n, int64_t slice_elems,
                float init, const OptimizerSpec& opt) {
  return testing::ConstantSpec(name, {n}, init, opt, slice_elems);
}

using testing::SgdSpec;

std::unique_ptr<ParameterStore> NewStore() {
  absl::StatusOr<std::unique_ptr<ParameterStore>> s = MakeLocalStore();
  REQUIRE_OK(s.status());
  return *std::move(s);
}

// Pulls `name` (n elements) and returns its values and read set.
struct Pulled {
  std::vector<float> values;
  ReadSet read;
};
Pulled PullOne(ParameterStore* store, const std::string& name, int64_t n) {
  Pulled p;
  p.values.assign(n, std::numeric_limits<float>::quiet_NaN());
  auto pull = store->StartPull(0, 0, {{name, p.values.data()}});
  REQUIRE_OK(pull->Wait());
  p.read = pull->read();
  return p;
}

absl::StatusOr<PushSummary> PushOne(ParameterStore* store,
                                    const std::string& name,
                                    const std::vector<float>& grad,
                                    const ReadSet& read) {
  return store->StartPush(0, {{name, grad.data()}}, read)->Wait();
}

TEST_CASE("pulls hand out the initial values and a read set of version 0",
          "[local_store]") {
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("w", 10, 4, 1.5f, SgdSpec(0.5f)),
                            Spec("b", 3, 8, -2.0f, SgdSpec(0.5f))}));
  std::vector<float> w(10, 0.0f), b(3, 0.0f);
  auto pull = store->StartPull(0, 0, {{"w", w.data()}, {"b", b.data()}});
  REQUIRE_OK(pull->Wait());
  CHECK(w == std::vector<float>(10, 1.5f));
  CHECK(b == std::vector<float>(3, -2.0f));
  const ReadSet& read = pull->read();
  CHECK(read.epochs == absl::flat_hash_map<int, uint64_t>{{0, 1}});
  REQUIRE(read.versions.size() == 2);
  // 10 elements in slices of 4: 3 slices; 3 in slices of 8: 1.
  CHECK(read.versions.at("w") == std::vector<uint64_t>{0, 0, 0});
  CHECK(read.versions.at("b") == std::vector<uint64_t>{0});
  // Wait() again answers the same.
  REQUIRE_OK(pull->Wait());

  // A pull of one tensor reads only that one.
  Pulled only_b = PullOne(store.get(), "b", 3);
  CHECK(only_b.read.versions.size() == 1);
  CHECK(only_b.read.versions.count("b") == 1);
}

TEST_CASE("SGD: w -= lr * g exactly, every slice's version counts pushes",
          "[local_store]") {
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("w", 10, 4, 1.0f, SgdSpec(0.5f))}));
  Pulled before = PullOne(store.get(), "w", 10);
  std::vector<float> g(10);
  for (int i = 0; i < 10; ++i) g[i] = 0.25f * i;  // exact in binary

  absl::StatusOr<PushSummary> sum = PushOne(store.get(), "w", g, before.read);
  REQUIRE_OK(sum.status());
  CHECK(sum->applied == 3);
  CHECK(sum->refused_stale == 0);
  CHECK(sum->max_staleness == 0);
  CHECK(sum->mean_staleness == 0.0);

  Pulled after = PullOne(store.get(), "w", 10);
  for (int i = 0; i < 10; ++i) {
    INFO("element " << i);
    CHECK(after.values[i] == 1.0f - 0.125f * i);
  }
  CHECK(after.read.versions.at("w") == std::vector<uint64_t>{1, 1, 1});

  // A second push from the fresh read: versions 2, values moved again.
  REQUIRE_OK(PushOne(store.get(), "w", g, after.read).status());
  Pulled again = PullOne(store.get(), "w", 10);
  for (int i = 0; i < 10; ++i) CHECK(again.values[i] == 1.0f - 0.25f * i);
  CHECK(again.read.versions.at("w") == std::vector<uint64_t>{2, 2, 2});
}

TEST_CASE("momentum: v = mu v + g; w -= lr v, state kept per slice",
          "[local_store]") {
  OptimizerSpec opt;
  opt.set_type(OPT_MOMENTUM);
  opt.set_learning_rate(0.5f);
  opt.set_momentum(0.5f);
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("m", 5, 2, 2.0f, opt)}));
  const std::vector<float> g(5, 1.0f);
  REQUIRE_OK(
      PushOne(store.get(), "m", g, PullOne(store.get(), "m", 5).read).status());
  // v1 = 1, w1 = 2 - 0.5 = 1.5
  Pulled p1 = PullOne(store.get(), "m", 5);
  CHECK(p1.values == std::vector<float>(5, 1.5f));
  REQUIRE_OK(PushOne(store.get(), "m", g, p1.read).status());
  // v2 = 0.5 + 1 = 1.5, w2 = 1.5 - 0.75 = 0.75
  Pulled p2 = PullOne(store.get(), "m", 5);
  CHECK(p2.values == std::vector<float>(5, 0.75f));
  CHECK(p2.read.versions.at("m") == std::vector<uint64_t>{2, 2, 2});
}

TEST_CASE("Adam: bias-corrected moments by each slice's update count",
          "[local_store]") {
  OptimizerSpec opt;
  opt.set_type(OPT_ADAM);
  opt.set_learning_rate(0.1f);
  opt.set_beta1(0.9f);
  opt.set_beta2(0.999f);
  opt.set_epsilon(1e-8f);
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("a", 4, 4, 0.0f, opt)}));
  const std::vector<float> grads[2] = {{1.0f, -2.0f, 0.5f, 4.0f},
                                       {-1.0f, 3.0f, 0.25f, 4.0f}};
  // Reference in double.
  double w[4] = {0, 0, 0, 0}, m[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};
  for (int t = 1; t <= 2; ++t) {
    REQUIRE_OK(PushOne(store.get(), "a", grads[t - 1],
                       PullOne(store.get(), "a", 4).read)
                   .status());
    for (int i = 0; i < 4; ++i) {
      const double gi = grads[t - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.999 * v[i] + 0.001 * gi * gi;
      const double mh = m[i] / (1 - std::pow(0.9, t));
      const double vh = v[i] / (1 - std::pow(0.999, t));
      w[i] -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
    }
  }
  Pulled p = PullOne(store.get(), "a", 4);
  for (int i = 0; i < 4; ++i) {
    INFO("element " << i);
    CHECK(p.values[i] == Approx(w[i]).epsilon(1e-5));
  }
  // After the first step every element moved by lr in the gradient's
  // direction (|m_hat| / sqrt(v_hat) = 1), so the values are distinct from 0.
  CHECK(p.values[0] != 0.0f);
}

TEST_CASE("staleness is measured from the read set the push names",
          "[local_store]") {
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("w", 6, 2, 0.0f, SgdSpec(1.0f))}));
  const ReadSet old_read = PullOne(store.get(), "w", 6).read;
  const std::vector<float> g(6, 1.0f);
  for (uint64_t k = 0; k < 3; ++k) {
    absl::StatusOr<PushSummary> s = PushOne(store.get(), "w", g, old_read);
    REQUIRE_OK(s.status());
    CHECK(s->applied == 3);
    CHECK(s->max_staleness == k);  // k pushes happened since the read
    CHECK(s->mean_staleness == static_cast<double>(k));
  }
  // A push that names no read counts from version 0.
  absl::StatusOr<PushSummary> s = PushOne(store.get(), "w", g, ReadSet());
  REQUIRE_OK(s.status());
  CHECK(s->max_staleness == 3);
  Pulled p = PullOne(store.get(), "w", 6);
  CHECK(p.values == std::vector<float>(6, -4.0f));
  CHECK(p.read.versions.at("w") == std::vector<uint64_t>{4, 4, 4});
}

// The state of "w" must equal `values` at `versions` (nothing applied).
void ExpectUnchanged(ParameterStore* store, const std::vector<float>& values,
                     const std::vector<uint64_t>& versions) {
  Pulled p = PullOne(store, "w", static_cast<int64_t>(values.size()));
  CHECK(p.values == values);
  CHECK(p.read.versions.at("w") == versions);
}

TEST_CASE("a bad push is refused as a whole and changes nothing",
          "[local_store]") {
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("w", 6, 2, 1.0f, SgdSpec(1.0f)),
                            Spec("u", 2, 2, 0.0f, SgdSpec(1.0f))}));
  const std::vector<float> ones(6, 1.0f);
  REQUIRE_OK(PushOne(store.get(), "w", ones, ReadSet()).status());
  const std::vector<float> w1(6, 0.0f);
  const std::vector<uint64_t> v1 = {1, 1, 1};
  ExpectUnchanged(store.get(), w1, v1);

  SECTION("NaN in the last slice: no slice applied") {
    std::vector<float> g = ones;
    g[5] = std::numeric_limits<float>::quiet_NaN();
    absl::StatusOr<PushSummary> s = PushOne(store.get(), "w", g, ReadSet());
    CHECK(absl::IsInvalidArgument(s.status()));
    CHECK(absl::StrContains(s.status().message(), "NaN or Inf"));
  }
  SECTION("Inf") {
    std::vector<float> g = ones;
    g[0] = std::numeric_limits<float>::infinity();
    CHECK(absl::IsInvalidArgument(
        PushOne(store.get(), "w", g, ReadSet()).status()));
  }
  SECTION("a read version from the future") {
    ReadSet future;
    future.versions["w"] = {1, 7, 1};
    absl::StatusOr<PushSummary> s = PushOne(store.get(), "w", ones, future);
    CHECK(absl::IsInvalidArgument(s.status()));
    CHECK(absl::StrContains(s.status().message(), "read_version 7"));
  }
  SECTION("an unknown tensor next to a known one") {
    const std::vector<float> g(2, 1.0f);
    absl::StatusOr<PushSummary> s =
        store->StartPush(0, {{"w", ones.data()}, {"nope", g.data()}}, ReadSet())
            ->Wait();
    CHECK(absl::IsInvalidArgument(s.status()));
    CHECK(absl::StrContains(s.status().message(), "nope"));
  }
  SECTION("the same tensor twice") {
    absl::StatusOr<PushSummary> s =
        store->StartPush(0, {{"w", ones.data()}, {"w", ones.data()}}, ReadSet())
            ->Wait();
    CHECK(absl::IsInvalidArgument(s.status()));
    CHECK(absl::StrContains(s.status().message(), "twice"));
  }
  SECTION("a null gradient") {
    absl::StatusOr<PushSummary> s =
        store->StartPush(0, {{"w", nullptr}}, ReadSet())->Wait();
    CHECK(absl::IsInvalidArgument(s.status()));
  }
  ExpectUnchanged(store.get(), w1, v1);
  // The other tensor was not touched either.
  Pulled u = PullOne(store.get(), "u", 2);
  CHECK(u.values == std::vector<float>(2, 0.0f));
  CHECK(u.read.versions.at("u") == std::vector<uint64_t>{0});
}

TEST_CASE("a bad pull is refused and leaves the buffers alone",
          "[local_store]") {
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("w", 4, 2, 3.0f, SgdSpec(1.0f))}));
  std::vector<float> w(4, -1.0f), x(4, -1.0f);

  SECTION("unknown tensor (after a known one)") {
    auto pull = store->StartPull(0, 0, {{"w", w.data()}, {"x", x.data()}});
    const absl::Status s = pull->Wait();
    CHECK(absl::IsNotFound(s));
    CHECK(absl::StrContains(s.message(), "'x'"));
    CHECK(pull->read().versions.empty());
  }
  SECTION("a name twice") {
    auto pull = store->StartPull(0, 0, {{"w", w.data()}, {"w", x.data()}});
    CHECK(absl::IsInvalidArgument(pull->Wait()));
  }
  SECTION("a null buffer") {
    auto pull = store->StartPull(0, 0, {{"w", nullptr}});
    CHECK(absl::IsInvalidArgument(pull->Wait()));
  }
  CHECK(w == std::vector<float>(4, -1.0f));
  CHECK(x == std::vector<float>(4, -1.0f));
}

TEST_CASE("Create: idempotent, all-or-nothing, names what differs",
          "[local_store]") {
  auto store = NewStore();
  const TensorSpec w = Spec("w", 4, 2, 1.0f, SgdSpec(1.0f));
  REQUIRE_OK(store->Create({w}));
  REQUIRE_OK(PushOne(store.get(), "w", std::vector<float>(4, 1.0f), ReadSet())
                 .status());

  // The same spec again is a no-op: the pushed values stay.
  REQUIRE_OK(store->Create({w}));
  CHECK(PullOne(store.get(), "w", 4).values == std::vector<float>(4, 0.0f));

  // A different spec under the same name.
  const absl::Status differs =
      store->Create({Spec("w", 4, 2, 1.0f, SgdSpec(0.25f))});
  CHECK(absl::IsAlreadyExists(differs));
  CHECK(absl::StrContains(differs.message(), "learning_rate"));

  // A batch with one invalid spec creates none of them.
  const absl::Status bad =
      store->Create({Spec("fresh", 2, 2, 0.0f, SgdSpec(1.0f)),
                     Spec("bad", 2, 2, 0.0f, SgdSpec(0))});
  CHECK(absl::IsInvalidArgument(bad));
  CHECK(absl::StrContains(bad.message(), "learning_rate"));
  CHECK(absl::IsNotFound(store->WaitFor({"fresh"}, absl::ZeroDuration())));
  std::vector<float> out(2);
  CHECK(absl::IsNotFound(
      store->StartPull(0, 0, {{"fresh", out.data()}})->Wait()));

  REQUIRE_OK(store->WaitFor({"w"}, absl::ZeroDuration()));
  const absl::Status missing =
      store->WaitFor({"w", "later"}, absl::ZeroDuration());
  CHECK(absl::IsNotFound(missing));
  CHECK(absl::StrContains(missing.message(), "later"));
}

TEST_CASE("a step's tensors and rows are pulled and pushed together",
          "[local_store][rows]") {
  auto store = NewStore();
  REQUIRE_OK(store->Create({Spec("w", 4, 2, 1.0f, SgdSpec(1.0f))},
                           {testing::ConstantTableSpec("emb", 2, 0.5f)}));
  REQUIRE_OK(store->WaitFor({"w", "emb"}, absl::ZeroDuration()));
  const std::vector<uint64_t> ids = {7, 9, 7};
  std::vector<float> w(4), emb(6);
  auto pull = store->StartPull(
      0, 0, PullSet{{{"w", w.data()}}, {{"emb", ids, emb.data()}}});
  REQUIRE_OK(pull->Wait());
  CHECK(w == std::vector<float>(4, 1.0f));
  CHECK(emb == std::vector<float>(6, 0.5f));
  CHECK(pull->rows_created() == 2);  // distinct ids

  std::vector<float> gw(4, 0.25f), ge(6, 0.125f);
  absl::StatusOr<PushSummary> done =
      store
          ->StartPush(0, PushSet{{{"w", gw.data()}}, {{"emb", ids, ge.data()}}},
                      pull->read())
          ->Wait();
  REQUIRE_OK(done.status());
  CHECK(done->rows.applied == 2);  // distinct ids
  CHECK(done->applied == 2 + 2);   // two slices and two rows
  CHECK(done->rows_created == 0);  // the pull created them

  // A step with an unknown table applies none of its tensors either.
  absl::Status s =
      store
          ->StartPush(0,
                      PushSet{{{"w", gw.data()}}, {{"nope", ids, ge.data()}}},
                      ReadSet())
          ->Wait()
          .status();
  CHECK(absl::IsInvalidArgument(s));
  pull = store->StartPull(
      0, 0, PullSet{{{"w", w.data()}}, {{"emb", ids, emb.data()}}});
  REQUIRE_OK(pull->Wait());
  CHECK(w == std::vector<float>(4, 0.75f));
  CHECK(emb[0] == Approx(0.25f));  // id 7 twice: 0.5 - 2 * 0.125
  CHECK(emb[2] == Approx(0.375f));
  CHECK(emb[4] == Approx(0.25f));
  CHECK(pull->read().versions.at("w") == std::vector<uint64_t>{1, 1});
}

TEST_CASE("the cluster-only calls answer as a lone process", "[local_store]") {
  auto store = NewStore();
  absl::StatusOr<Registration> reg = store->Register();
  REQUIRE_OK(reg.status());
  CHECK(reg->resume_clock == 0);
  CHECK(reg->previous_clock == 0);
  REQUIRE_OK(store->Heartbeat(5, false));
  REQUIRE_OK(store->Heartbeat(6, true));
  absl::StatusOr<int> live = store->LiveWorkers();
  REQUIRE_OK(live.status());
  CHECK(*live == 0);
}

}  // namespace
}  // namespace asyncps
