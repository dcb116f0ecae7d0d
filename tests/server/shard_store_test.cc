#include "store/shard_store.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "common/payload.h"
#include "common/shard_map.h"
#include "tests/testing/store_helpers.h"
#include "tests/testing/tensor_specs.h"

namespace asyncps {
namespace {

using testing::SgdSpec;

// A constant tensor in slices of 4 unless said otherwise.
TensorSpec Spec(const std::string& name, std::vector<int64_t> shape,
                float init_value, const OptimizerSpec& opt,
                int64_t slice_elems = 4) {
  return testing::ConstantSpec(name, shape, init_value, opt, slice_elems);
}

std::unique_ptr<ShardStore> SingleShard() {
  ShardStoreOptions o;
  o.shard_index = 0;
  o.num_shards = 1;
  return ShardStore::Create(o).value();
}

void Create(ShardStore* store, const TensorSpec& spec) {
  CreateTensorRequest req;
  *req.add_tensors() = spec;
  REQUIRE(store->CreateTensors(req).ok());
}

// All values of `tensor` (single shard), slice by slice.
std::vector<float> Values(ShardStore* store, const std::string& tensor,
                          std::vector<uint64_t>* versions = nullptr) {
  PullRequest req;
  req.add_tensors(tensor);
  PullResponse resp;
  REQUIRE(store->Pull(req, &resp).ok());
  std::vector<float> out;
  for (const SliceData& s : resp.slices()) {
    const size_t n = (s.values().size() / sizeof(float));
    const size_t at = out.size();
    out.resize(at + n);
    DecodeFloats(s.values(), out.data() + at, n);
    if (versions != nullptr) versions->push_back(s.version());
  }
  return out;
}

SliceGradient Grad(const std::string& tensor, uint32_t slice,
                   std::vector<float> g, uint64_t read_version = 0) {
  SliceGradient sg;
  sg.set_tensor(tensor);
  sg.set_slice(slice);
  sg.set_read_version(read_version);
  EncodeFloats(g.data(), g.size(), sg.mutable_grad());
  return sg;
}

absl::Status Push(ShardStore* store, std::vector<SliceGradient> grads,
                  PushResponse* resp, StalenessRule rule = {}) {
  PushRequest req;
  for (auto& g : grads) *req.add_grads() = g;
  return testing::ApplyPush(store, req, rule, resp);
}

TEST_CASE("SGD applies w -= lr * g exactly", "[optimizer]") {
  auto store = SingleShard();
  Create(store.get(), Spec("w", {3}, 1.0f, SgdSpec(0.5f)));
  PushResponse r;
  REQUIRE(Push(store.get(), {Grad("w", 0, {1, 2, -4})}, &r).ok());
  REQUIRE(Push(store.get(), {Grad("w", 0, {1, 0, 0}, 1)}, &r).ok());
  std::vector<uint64_t> versions;
  REQUIRE(Values(store.get(), "w", &versions) ==
          std::vector<float>{0.0f, 0.0f, 3.0f});
  REQUIRE(versions == std::vector<uint64_t>{2});
}

TEST_CASE("momentum matches hand-computed values", "[optimizer]") {
  auto store = SingleShard();
  OptimizerSpec o = SgdSpec(0.1f);
  o.set_type(OPT_MOMENTUM);
  o.set_momentum(0.9f);
  Create(store.get(), Spec("w", {1}, 1.0f, o));
  PushResponse r;
  // v1 = 1, w = 1 - 0.1 = 0.9; v2 = 0.9 + 1 = 1.9, w = 0.9 - 0.19 = 0.71;
  // v3 = 1.71 - 2 = -0.29, w = 0.71 + 0.029 = 0.739.
  REQUIRE(Push(store.get(), {Grad("w", 0, {1})}, &r).ok());
  REQUIRE(Values(store.get(), "w")[0] == Approx(0.9f).epsilon(1e-6));
  REQUIRE(Push(store.get(), {Grad("w", 0, {1}, 1)}, &r).ok());
  REQUIRE(Values(store.get(), "w")[0] == Approx(0.71f).epsilon(1e-6));
  REQUIRE(Push(store.get(), {Grad("w", 0, {-2}, 2)}, &r).ok());
  REQUIRE(Values(store.get(), "w")[0] == Approx(0.739f).epsilon(1e-6));
}

TEST_CASE("Adam matches hand-computed values", "[optimizer]") {
  auto store = SingleShard();
  OptimizerSpec o = SgdSpec(0.1f);
  o.set_type(OPT_ADAM);
  o.set_beta1(0.9f);
  o.set_beta2(0.999f);
  o.set_epsilon(1e-8f);
  Create(store.get(), Spec("w", {2}, 0.0f, o));
  PushResponse r;
  // Step 1: m = 0.1 g, v = 0.001 g^2; mhat = g, vhat = g^2, so each weight
  // moves by -lr * sign(g) (up to epsilon).
  REQUIRE(Push(store.get(), {Grad("w", 0, {2, -0.5})}, &r).ok());
  auto w = Values(store.get(), "w");
  REQUIRE(w[0] == Approx(-0.1f).epsilon(1e-5));
  REQUIRE(w[1] == Approx(0.1f).epsilon(1e-5));
  // Step 2 with g = (1, -0.5):
  //  m0 = 0.9*0.2 + 0.1*1 = 0.28, mhat = 0.28/0.19 = 1.4736842
  //  v0 = 0.999*0.004 + 0.001*1 = 0.004996, vhat = 0.004996/0.001999
  //  = 2.4992496 w0 = -0.1 - 0.1 * 1.4736842 / 1.5808983 = -0.1932182 m1 =
  //  0.9*-0.05 + 0.1*-0.5 = -0.095, mhat = -0.5 v1 = 0.999*0.00025 + 0.001*0.25
  //  = 0.00049975, vhat = 0.25 w1 = 0.1 + 0.1 * 0.5 / 0.5 = 0.2
  REQUIRE(Push(store.get(), {Grad("w", 0, {1, -0.5}, 1)}, &r).ok());
  w = Values(store.get(), "w");
  REQUIRE(w[0] == Approx(-0.1932182f).epsilon(1e-5));
  REQUIRE(w[1] == Approx(0.2f).epsilon(1e-5));
}

TEST_CASE("optimizer hyper-parameters are validated", "[optimizer]") {
  auto store = SingleShard();
  CreateTensorRequest req;
  *req.add_tensors() = Spec("w", {2}, 0, SgdSpec(0));
  auto r = store->CreateTensors(req);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(r.status().message().find("learning_rate") != std::string::npos);
  OptimizerSpec m = SgdSpec(0.1f);
  m.set_type(OPT_MOMENTUM);
  m.set_momentum(1.0f);
  *req.mutable_tensors(0) = Spec("w", {2}, 0, m);
  r = store->CreateTensors(req);
  REQUIRE(r.status().message().find("momentum") != std::string::npos);
  OptimizerSpec a = SgdSpec(0.1f);
  a.set_type(OPT_ADAM);
  a.set_beta1(0.9f);
  a.set_beta2(0.999f);
  *req.mutable_tensors(0) = Spec("w", {2}, 0, a);  // epsilon 0
  r = store->CreateTensors(req);
  REQUIRE(r.status().message().find("epsilon") != std::string::npos);
  REQUIRE(store->Size().tensors == 0);
}

TEST_CASE("create is idempotent and conflicts name the field", "[store]") {
  auto store = SingleShard();
  CreateTensorRequest req;
  *req.add_tensors() = Spec("w", {10}, 1.0f, SgdSpec(0.1f));
  auto first = store->CreateTensors(req);
  REQUIRE(first.ok());
  REQUIRE(first->created() == 1);
  auto again = store->CreateTensors(req);
  REQUIRE(again.ok());
  REQUIRE(again->created() == 0);
  req.mutable_tensors(0)->set_shape(0, 11);
  req.mutable_tensors(0)->mutable_optimizer()->set_learning_rate(0.5f);
  auto conflict = store->CreateTensors(req);
  REQUIRE(conflict.status().code() == absl::StatusCode::kAlreadyExists);
  // Every differing field, in words.
  CHECK(std::string(conflict.status().message()) ==
        "tensor 'w' exists with another spec: shape is [10] on the shard, "
        "[11] asked; optimizer.learning_rate is 0.1 on the shard, 0.5 asked");
}

TEST_CASE(
    "INIT_VALUES: the request's values, checked; the first creation's win",
    "[store]") {
  auto store = SingleShard();
  TensorSpec spec = Spec("w", {2, 5}, 0, SgdSpec(0.5f));
  spec.set_init(INIT_VALUES);
  spec.set_init_value(0);
  std::vector<float> given(10);
  for (int i = 0; i < 10; ++i) given[i] = 0.25f * static_cast<float>(i) - 1.0f;
  auto request = [&](const std::vector<float>& values) {
    CreateTensorRequest req;
    *req.add_tensors() = spec;
    TensorValues* v = req.add_values();
    v->set_tensor("w");
    EncodeFloats(values.data(), values.size(), v->mutable_values());
    return req;
  };
  // Refused, creating nothing: no values, the wrong length, NaN, values for
  // a tensor of another init.
  CreateTensorRequest none;
  *none.add_tensors() = spec;
  std::vector<float> nan = given;
  nan[3] = std::nanf("");
  CreateTensorRequest other = request(given);
  *other.mutable_tensors(0) = Spec("w", {2, 5}, 0, SgdSpec(0.5f));
  for (const CreateTensorRequest& bad :
       {none, request(std::vector<float>(9)), request(nan), other}) {
    INFO(bad.ShortDebugString().substr(0, 200));
    CHECK(store->CreateTensors(bad).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  REQUIRE(store->Size().tensors == 0);

  REQUIRE(store->CreateTensors(request(given)).ok());
  CHECK(Values(store.get(), "w") == given);
  // A second creator with other values: nothing changes.
  auto again = store->CreateTensors(request(std::vector<float>(10, 7.0f)));
  REQUIRE(again.ok());
  CHECK(again->created() == 0);
  CHECK(Values(store.get(), "w") == given);
  // Trained as any other tensor.
  PushResponse resp;
  REQUIRE(Push(store.get(),
               {Grad("w", 0, {2, 2, 2, 2}), Grad("w", 1, {2, 2, 2, 2}),
                Grad("w", 2, {2, 2})},
               &resp)
              .ok());
  std::vector<float> expected = given;
  for (float& v : expected) v -= 1.0f;
  CHECK(Values(store.get(), "w") == expected);
}

TEST_CASE("create resolves the default slice size", "[store]") {
  ShardStoreOptions o;
  o.default_slice_elems = 3;
  auto store = ShardStore::Create(o).value();
  CreateTensorRequest req;
  *req.add_tensors() = Spec("w", {10}, 0, SgdSpec(0.1f), /*slice_elems=*/0);
  auto r = store->CreateTensors(req);
  REQUIRE(r.ok());
  REQUIRE(r->tensors(0).slice_elems() == 3);
  REQUIRE(store->Size().slices == 4);
}

TEST_CASE("a create with one bad spec creates nothing", "[store][bad_input]") {
  auto store = SingleShard();
  CreateTensorRequest req;
  *req.add_tensors() = Spec("good", {4}, 0, SgdSpec(0.1f));
  *req.add_tensors() = Spec("bad", {4, 0}, 0, SgdSpec(0.1f));
  REQUIRE(store->CreateTensors(req).status().code() ==
          absl::StatusCode::kInvalidArgument);
  *req.mutable_tensors(1) = Spec("good", {4}, 0, SgdSpec(0.1f));
  REQUIRE(store->CreateTensors(req).status().code() ==
          absl::StatusCode::kInvalidArgument);  // duplicate name
  REQUIRE(store->Size().tensors == 0);
}

TEST_CASE("a shard holds only the slices whose home it is", "[store]") {
  ShardStoreOptions o;
  o.num_shards = 3;
  int64_t total = 0;
  for (int shard = 0; shard < 3; ++shard) {
    o.shard_index = shard;
    auto store = ShardStore::Create(o).value();
    Create(store.get(), Spec("big", {100}, 0, SgdSpec(1), 7));
    PullRequest req;
    req.add_tensors("big");
    PullResponse resp;
    REQUIRE(store->Pull(req, &resp).ok());
    for (const SliceData& s : resp.slices()) {
      REQUIRE(ShardMap::Static(3)->SliceHome("big", s.slice()) == shard);
      total += static_cast<int64_t>((s.values().size() / sizeof(float)));
    }
  }
  REQUIRE(total == 100);
}

TEST_CASE("bad pushes are refused and change nothing", "[store][bad_input]") {
  auto store = SingleShard();
  Create(store.get(), Spec("w", {6}, 1.0f, SgdSpec(1)));  // slices of 4 and 2
  PushResponse r;
  const float nan = std::nanf("");
  const float inf = INFINITY;
  struct Case {
    const char* what;
    std::vector<SliceGradient> grads;
    absl::StatusCode code;
    const char* needle;
  } cases[] = {
      {"unknown tensor",
       {Grad("w", 0, {1, 1, 1, 1}), Grad("nope", 0, {1})},
       absl::StatusCode::kNotFound,
       "nope"},
      {"short slice",
       {Grad("w", 0, {1, 1, 1, 1}), Grad("w", 1, {1})},
       absl::StatusCode::kInvalidArgument,
       "holds 2 values"},
      {"slice out of range",
       {Grad("w", 2, {1, 1})},
       absl::StatusCode::kInvalidArgument,
       "does not exist"},
      {"NaN",
       {Grad("w", 0, {1, 1, 1, 1}), Grad("w", 1, {1, nan})},
       absl::StatusCode::kInvalidArgument,
       "NaN"},
      {"Inf",
       {Grad("w", 1, {inf, 1})},
       absl::StatusCode::kInvalidArgument,
       "NaN or Inf"},
      {"slice twice",
       {Grad("w", 1, {1, 1}), Grad("w", 1, {1, 1})},
       absl::StatusCode::kInvalidArgument,
       "twice"},
      {"future version",
       {Grad("w", 1, {1, 1}, 5)},
       absl::StatusCode::kInvalidArgument,
       "newer"},
  };
  for (auto& c : cases) {
    SECTION(c.what) {
      absl::Status s = Push(store.get(), c.grads, &r);
      REQUIRE(s.code() == c.code);
      REQUIRE(s.message().find(c.needle) != std::string::npos);
      std::vector<uint64_t> versions;
      REQUIRE(Values(store.get(), "w", &versions) ==
              std::vector<float>(6, 1.0f));
      REQUIRE(versions == std::vector<uint64_t>{0, 0});
    }
  }
  // A gradient of odd byte length.
  SliceGradient odd = Grad("w", 1, {1, 1});
  odd.mutable_grad()->push_back('x');
  REQUIRE(Push(store.get(), {odd}, &r).code() ==
          absl::StatusCode::kInvalidArgument);
}

absl::Status Assign(ShardStore* store, std::vector<SliceGradient> values,
                    PushResponse* resp, StalenessRule rule = {}) {
  PushRequest req;
  req.set_assign(true);
  for (auto& v : values) *req.add_grads() = v;
  return testing::ApplyPush(store, req, rule, resp);
}

TEST_CASE("an assign replaces values, bumps versions and keeps momentum",
          "[store]") {
  auto store = SingleShard();
  OptimizerSpec o = SgdSpec(0.1f);
  o.set_type(OPT_MOMENTUM);
  o.set_momentum(0.9f);
  Create(store.get(), Spec("w", {6}, 1.0f, o));  // slices of 4 and 2
  PushResponse r;
  // v = 1 everywhere, w = 0.9.
  REQUIRE(
      Push(store.get(), {Grad("w", 0, {1, 1, 1, 1}), Grad("w", 1, {1, 1})}, &r)
          .ok());
  // Read versions are not looked at (5 is from the future), nor is the
  // staleness bound: values as given, one version more each.
  StalenessRule strict;
  strict.max_staleness = 0;
  PushResponse assigned;
  REQUIRE(Assign(store.get(),
                 {Grad("w", 0, {2, 3, 4, 5}, 5), Grad("w", 1, {6, 7})},
                 &assigned, strict)
              .ok());
  std::vector<uint64_t> versions;
  REQUIRE(Values(store.get(), "w", &versions) ==
          std::vector<float>{2, 3, 4, 5, 6, 7});
  REQUIRE(versions == std::vector<uint64_t>{2, 2});
  REQUIRE(assigned.results_size() == 2);
  REQUIRE(assigned.results(0).outcome() == APPLIED);
  REQUIRE(assigned.results(0).new_version() == 2);
  REQUIRE(assigned.results(1).lr_scale() == 1.0f);
  // The velocity survived the assign: v = 0.9 + 1 = 1.9, w = 2 - 0.19.
  REQUIRE(Push(store.get(), {Grad("w", 0, {1, 1, 1, 1}, 2)}, &r).ok());
  REQUIRE(Values(store.get(), "w")[0] == Approx(1.81f).epsilon(1e-6));

  SECTION("bad values change nothing") {
    const float nan = std::nanf("");
    absl::Status s = Assign(
        store.get(), {Grad("w", 0, {0, 0, 0, 0}), Grad("w", 1, {nan, 0})}, &r);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(s.message().find("values contain NaN or Inf") != std::string::npos);
    s = Assign(store.get(), {Grad("w", 1, {1, 2, 3})}, &r);
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(s.message().find("holds 2 values") != std::string::npos);
    versions.clear();
    REQUIRE(Values(store.get(), "w", &versions)[4] == 6.0f);
    REQUIRE(versions == std::vector<uint64_t>{3, 2});
  }
}

TEST_CASE("pull of an unknown tensor is NOT_FOUND", "[store][bad_input]") {
  auto store = SingleShard();
  PullRequest req;
  req.add_tensors("missing");
  PullResponse resp;
  REQUIRE(store->Pull(req, &resp).code() == absl::StatusCode::kNotFound);
  REQUIRE(resp.slices_size() == 0);
}

TEST_CASE("push staler than the bound is refused per slice", "[staleness]") {
  auto store = SingleShard();
  Create(store.get(), Spec("w", {8}, 0.0f, SgdSpec(1)));  // two slices of 4
  PushResponse r;
  // Advance slice 0 to version 3.
  for (uint64_t v = 0; v < 3; ++v) {
    REQUIRE(Push(store.get(), {Grad("w", 0, {0, 0, 0, 0}, v)}, &r).ok());
  }
  StalenessRule rule;
  rule.max_staleness = 2;
  PushResponse resp;
  // Slice 0 read at version 0: staleness 3 > 2, refused. Slice 1 read at 0:
  // staleness 0, applied.
  REQUIRE(Push(store.get(),
               {Grad("w", 0, {1, 1, 1, 1}, 0), Grad("w", 1, {1, 1, 1, 1}, 0)},
               &resp, rule)
              .ok());
  REQUIRE(resp.results(0).outcome() == REFUSED_STALE);
  REQUIRE(resp.results(0).staleness() == 3);
  REQUIRE(resp.results(0).new_version() == 3);
  REQUIRE(resp.results(1).outcome() == APPLIED);
  REQUIRE(resp.results(1).new_version() == 1);
  auto w = Values(store.get(), "w");
  REQUIRE(w == std::vector<float>{0, 0, 0, 0, -1, -1, -1, -1});
  // Read at version 1: staleness exactly 2 = the bound, applied.
  PushResponse ok;
  REQUIRE(Push(store.get(), {Grad("w", 0, {1, 1, 1, 1}, 1)}, &ok, rule).ok());
  REQUIRE(ok.results(0).outcome() == APPLIED);
  REQUIRE(ok.results(0).staleness() == 2);
}

TEST_CASE("inverse staleness scaling applies lr / (1 + staleness)",
          "[staleness]") {
  auto store = SingleShard();
  Create(store.get(), Spec("w", {4}, 0.0f, SgdSpec(0.5f)));
  PushResponse r;
  for (uint64_t v = 0; v < 3; ++v) {
    REQUIRE(Push(store.get(), {Grad("w", 0, {0, 0, 0, 0}, v)}, &r).ok());
  }
  StalenessRule rule;
  rule.inverse_lr = true;
  PushResponse resp;
  REQUIRE(
      Push(store.get(), {Grad("w", 0, {8, 4, -8, 0}, 0)}, &resp, rule).ok());
  REQUIRE(resp.results(0).staleness() == 3);
  REQUIRE(resp.results(0).lr_scale() == Approx(0.25f));
  // applied = lr / (1 + 3) * g = 0.125 * g
  REQUIRE(Values(store.get(), "w") == std::vector<float>{-1, -0.5, 1, 0});
}

}  // namespace
}  // namespace asyncps
