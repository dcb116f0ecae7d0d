#include "server/shard_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/float_codec.h"
#include "common/initializer.h"
#include "common/sharding.h"
#include "google/protobuf/util/message_differencer.h"

namespace asyncps {

// One slice of a tensor held by this shard.
class ShardStore::Slice {
 public:
  // `initialize` false leaves the values at zero (a restore fills them).
  Slice(const TensorSpec& spec, const TensorLayout& layout, uint32_t index,
        bool initialize = true)
      : index_(index),
        size_(layout.SliceSize(index)),
        values_(size_),
        optimizer_(SliceOptimizer::Create(spec.optimizer(), size_)) {
    if (initialize) InitializeSlice(spec, layout, index, values_.data());
  }

  uint32_t index() const { return index_; }
  int64_t size() const { return size_; }

  uint64_t version() const {
    absl::ReaderMutexLock l(&mu_);
    return version_;
  }

  // Hands name, index, version and values to sink under the lock.
  void CopyOut(const std::string& tensor, const SliceSink& sink) const {
    absl::ReaderMutexLock l(&mu_);
    sink(tensor, index_, version_, absl::MakeConstSpan(values_));
  }

  // Applies g unless staler than the rule allows; fills `result`.
  void Apply(const float* g, uint64_t read_version, const StalenessRule& rule,
             SliceResult* result) {
    absl::MutexLock l(&mu_);
    const uint64_t staleness = version_ - read_version;
    result->set_staleness(staleness);
    if (rule.max_staleness >= 0 &&
        staleness > static_cast<uint64_t>(rule.max_staleness)) {
      result->set_outcome(REFUSED_STALE);
      result->set_new_version(version_);
      result->set_lr_scale(0);
      return;
    }
    const float scale =
        rule.inverse_lr ? 1.0f / (1.0f + static_cast<float>(staleness)) : 1.0f;
    ++version_;
    optimizer_->Apply(values_.data(), g, values_.size(), scale, version_);
    result->set_outcome(APPLIED);
    result->set_new_version(version_);
    result->set_lr_scale(scale);
  }

  // Hands the whole state to visit under the lock.
  void Read(const SliceVisitor& visit) const {
    absl::ReaderMutexLock l(&mu_);
    SliceView view;
    view.index = index_;
    view.version = version_;
    view.values = absl::MakeConstSpan(values_);
    view.optimizer_state = optimizer_->state();
    visit(view);
  }

  // REQUIRES: values and every state buffer hold size() floats, and there
  // are as many buffers as the optimizer keeps.
  void Import(uint64_t version, absl::string_view values,
              absl::Span<const absl::string_view> state) {
    absl::MutexLock l(&mu_);
    version_ = version;
    DecodeFloats(values, values_.data(), values_.size());
    std::vector<absl::Span<float>> buffers = optimizer_->mutable_state();
    for (size_t i = 0; i < buffers.size(); ++i) {
      DecodeFloats(state[i], buffers[i].data(), buffers[i].size());
    }
  }

  size_t optimizer_buffers() const {
    absl::ReaderMutexLock l(&mu_);
    return optimizer_->state().size();
  }

  size_t optimizer_bytes() const {
    absl::ReaderMutexLock l(&mu_);
    return optimizer_->state_bytes();
  }

 private:
  const uint32_t index_;
  const int64_t size_;
  mutable absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SliceOptimizer> optimizer_ ABSL_GUARDED_BY(mu_);
};

struct ShardStore::Tensor {
  TensorSpec spec;
  TensorLayout layout;
  // Local slices by slice index; null where another shard is the home.
  std::vector<std::unique_ptr<Slice>> slices;
};

namespace {

constexpr size_t kMaxTensorNameBytes = 256;

// True when every value is finite. Reads the exponent bits, so the loop
// vectorizes without -ffast-math: an all-ones exponent (Inf or NaN) makes
// (bits & kExponent) + kCarry carry into bit 31, which no finite value does.
// Sixteen independent accumulators keep the vector units busy instead of
// waiting on one OR chain (about 2.5x faster on data in cache, where the
// scan otherwise costs as much as applying the update).
bool AllFinite(const char* bytes, size_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr uint32_t kCarry = 0x00800000u;
  constexpr size_t kLanes = 16;
  uint32_t acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      uint32_t bits;
      std::memcpy(&bits, bytes + (i + k) * sizeof(float), sizeof(bits));
      acc[k] |= (bits & kExponent) + kCarry;
    }
  }
  uint32_t bad = 0;
  for (size_t k = 0; k < kLanes; ++k) bad |= acc[k];
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, bytes + i * sizeof(float), sizeof(bits));
    bad |= (bits & kExponent) + kCarry;
  }
  return (bad & 0x80000000u) == 0;
}

// AllFinite over a payload in pieces; a float split between two pieces is
// reassembled and checked on its own.
bool AllFinite(const FloatPayload& payload) {
  char carry[sizeof(float)];
  size_t have = 0;
  for (absl::string_view piece : payload.pieces()) {
    const char* p = piece.data();
    size_t len = piece.size();
    if (have > 0) {
      const size_t take = std::min(sizeof(float) - have, len);
      std::memcpy(carry + have, p, take);
      have += take;
      p += take;
      len -= take;
      if (have < sizeof(float)) continue;
      if (!AllFinite(carry, 1)) return false;
      have = 0;
    }
    const size_t whole = len / sizeof(float);
    if (!AllFinite(p, whole)) return false;
    have = len - whole * sizeof(float);
    std::memcpy(carry, p + whole * sizeof(float), have);
  }
  return true;
}

}  // namespace

ShardStore::ShardStore(const ShardStoreOptions& options) : options_(options) {}
ShardStore::~ShardStore() = default;

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(
    const ShardStoreOptions& options) {
  if (options.num_shards <= 0) {
    return absl::InvalidArgumentError("num_shards must be > 0");
  }
  if (options.shard_index < 0 || options.shard_index >= options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_index must be in [0, ", options.num_shards,
                     "), got ", options.shard_index));
  }
  if (options.default_slice_elems <= 0 ||
      options.default_slice_elems > options.max_slice_elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice_elems must be in [1, ", options.max_slice_elems,
                     "], got ", options.default_slice_elems));
  }
  return std::unique_ptr<ShardStore>(new ShardStore(options));
}

absl::StatusOr<TensorSpec> ShardStore::Resolve(const TensorSpec& in) const {
  TensorSpec spec = in;
  if (spec.name().empty() || spec.name().size() > kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor name must be 1..", kMaxTensorNameBytes,
                     " bytes, got ", spec.name().size()));
  }
  if (spec.slice_elems() == 0) {
    spec.set_slice_elems(options_.default_slice_elems);
  }
  if (spec.slice_elems() < 0 || spec.slice_elems() > options_.max_slice_elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name(), "': slice_elems must be in [1, ",
                     options_.max_slice_elems, "], got ", spec.slice_elems()));
  }
  absl::Status s = TensorLayout::FromSpec(spec).status();
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name(), "': ", s.message()));
  }
  s = ValidateInitializer(spec);
  if (!s.ok()) return s;
  s = ValidateOptimizer(spec.optimizer());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name(), "': ", s.message()));
  }
  return spec;
}

const ShardStore::Tensor* ShardStore::FindTensor(
    const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.get();
}

absl::StatusOr<CreateTensorResponse> ShardStore::CreateTensors(
    const CreateTensorRequest& request) {
  // Validate and resolve outside the lock; slices are built outside it too.
  std::vector<TensorSpec> specs;
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& in : request.tensors()) {
    absl::StatusOr<TensorSpec> spec = Resolve(in);
    if (!spec.ok()) return spec.status();
    if (!names.insert(spec->name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", spec->name(), "' appears twice in one request"));
    }
    specs.push_back(*std::move(spec));
  }

  CreateTensorResponse response;
  std::vector<std::unique_ptr<Tensor>> fresh;
  {
    absl::ReaderMutexLock l(&mu_);
    for (const TensorSpec& spec : specs) {
      const Tensor* existing = FindTensor(spec.name());
      if (existing == nullptr) continue;
      std::string diff;
      google::protobuf::util::MessageDifferencer differ;
      differ.ReportDifferencesToString(&diff);
      if (!differ.Compare(existing->spec, spec)) {
        return absl::AlreadyExistsError(
            absl::StrCat("tensor '", spec.name(),
                         "' exists with a different spec: ", diff));
      }
    }
  }
  for (const TensorSpec& spec : specs) {
    auto t = std::make_unique<Tensor>(
        Tensor{spec, *TensorLayout::FromSpec(spec), {}});
    t->slices.resize(t->layout.num_slices());
    for (uint32_t i = 0; i < t->layout.num_slices(); ++i) {
      if (SliceHome(spec.name(), i, options_.num_shards) ==
          options_.shard_index) {
        t->slices[i] = std::make_unique<Slice>(spec, t->layout, i);
      }
    }
    fresh.push_back(std::move(t));
  }

  absl::MutexLock l(&mu_);
  // Re-check under the exclusive lock: a concurrent identical create may
  // have won the race, which is fine; a conflicting one is an error.
  for (const auto& t : fresh) {
    const Tensor* existing = FindTensor(t->spec.name());
    if (existing != nullptr &&
        !google::protobuf::util::MessageDifferencer::Equals(existing->spec,
                                                            t->spec)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "tensor '", t->spec.name(), "' was created concurrently with a "
          "different spec"));
    }
  }
  int created = 0;
  for (auto& t : fresh) {
    *response.add_tensors() = t->spec;
    if (FindTensor(t->spec.name()) == nullptr) {
      const std::string name = t->spec.name();
      tensors_.emplace(name, std::move(t));
      ++created;
    }
  }
  response.set_created(created);
  return response;
}

std::vector<TensorSpec> ShardStore::ListTensors() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<TensorSpec> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) out.push_back(t->spec);
  return out;
}

absl::Status ShardStore::ValidatePull(const PullRequest& request) const {
  return PullInto(request, nullptr);
}

absl::Status ShardStore::Pull(const PullRequest& request,
                              SliceSink sink) const {
  return PullInto(request, &sink);
}

absl::Status ShardStore::Pull(const PullRequest& request,
                              PullResponse* response) const {
  return Pull(request, [response](const std::string& tensor, uint32_t slice,
                                  uint64_t version,
                                  absl::Span<const float> values) {
    SliceData* out = response->add_slices();
    out->set_tensor(tensor);
    out->set_slice(slice);
    out->set_version(version);
    EncodeFloats(values.data(), values.size(), out->mutable_values());
  });
}

absl::Status ShardStore::PullInto(const PullRequest& request,
                                  const SliceSink* sink) const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<const Tensor*> found;
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& name : request.tensors()) {
    const Tensor* t = FindTensor(name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown tensor '", name, "'"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' requested twice"));
    }
    found.push_back(t);
  }
  if (sink == nullptr) return absl::OkStatus();
  for (const Tensor* t : found) {
    for (const auto& slice : t->slices) {
      if (slice != nullptr) slice->CopyOut(t->spec.name(), *sink);
    }
  }
  return absl::OkStatus();
}

std::vector<FloatPayload> ShardStore::PayloadsOf(const PushRequest& request) {
  std::vector<FloatPayload> out;
  out.reserve(request.grads_size());
  for (const SliceGradient& g : request.grads()) out.emplace_back(g.grad());
  return out;
}

absl::StatusOr<std::vector<ShardStore::Slice*>> ShardStore::ValidatePush(
    const PushRequest& request) const {
  return ValidatePush(request, PayloadsOf(request));
}

absl::StatusOr<std::vector<ShardStore::Slice*>> ShardStore::ValidatePush(
    const PushRequest& request, absl::Span<const FloatPayload> grads) const {
  if (grads.size() != static_cast<size_t>(request.grads_size())) {
    return absl::InternalError(absl::StrCat(
        "push has ", request.grads_size(), " gradients but ", grads.size(),
        " payloads"));
  }
  absl::ReaderMutexLock l(&mu_);
  std::vector<Slice*> out;
  out.reserve(request.grads_size());
  // Slices are unique objects, so repeated slices are found by pointer.
  absl::flat_hash_set<const Slice*> seen;
  seen.reserve(request.grads_size());
  // A push lists many slices of few tensors, usually in runs of the same
  // tensor: look a name up only when it changes.
  const Tensor* t = nullptr;
  for (int k = 0; k < request.grads_size(); ++k) {
    const SliceGradient& g = request.grads(k);
    const FloatPayload& payload = grads[k];
    if (t == nullptr || g.tensor() != t->spec.name()) {
      t = FindTensor(g.tensor());
    }
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("unknown tensor '", g.tensor(), "'"));
    }
    if (g.slice() >= t->layout.num_slices()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", g.tensor(), "' has ", t->layout.num_slices(),
                       " slices; slice ", g.slice(), " does not exist"));
    }
    Slice* slice = t->slices[g.slice()].get();
    if (slice == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", g.slice(), " of tensor '", g.tensor(), "' lives on shard ",
          SliceHome(g.tensor(), g.slice(), options_.num_shards), ", not ",
          options_.shard_index));
    }
    if (!seen.insert(slice).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", g.slice(), " of tensor '", g.tensor(),
                       "' appears twice in one push"));
    }
    if (payload.size() != slice->size() * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", g.slice(), " of tensor '", g.tensor(), "' holds ",
          slice->size(), " floats (", slice->size() * sizeof(float),
          " bytes); the gradient has ", payload.size(), " bytes"));
    }
    if (const uint64_t version = slice->version();
        g.read_version() > version) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", g.slice(), " of tensor '", g.tensor(), "': read_version ",
          g.read_version(), " is newer than the slice (version ", version,
          ")"));
    }
    if (!AllFinite(payload)) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", g.slice(), " of tensor '", g.tensor(),
                       "': gradient contains NaN or Inf"));
    }
    out.push_back(slice);
  }
  return out;
}

void ShardStore::ApplyPush(const PushRequest& request,
                           const std::vector<Slice*>& slices,
                           const StalenessRule& rule, PushResponse* response) {
  ApplyPush(request, PayloadsOf(request), slices, rule, response);
}

void ShardStore::ApplyPush(const PushRequest& request,
                           absl::Span<const FloatPayload> grads,
                           const std::vector<Slice*>& slices,
                           const StalenessRule& rule, PushResponse* response) {
  std::vector<float> scratch;
  for (int i = 0; i < request.grads_size(); ++i) {
    const SliceGradient& g = request.grads(i);
    const float* grad = grads[i].Floats(&scratch);
    SliceResult* result = response->add_results();
    result->set_tensor(g.tensor());
    result->set_slice(g.slice());
    slices[i]->Apply(grad, g.read_version(), rule, result);
  }
}

absl::Status ShardStore::ForEachTensor(TensorVisitor visit) const {
  // Tensors are never removed and their spec and slice table are fixed at
  // creation, so the pointers taken here stay valid after the lock is let go.
  std::vector<const Tensor*> tensors;
  {
    absl::ReaderMutexLock l(&mu_);
    tensors.reserve(tensors_.size());
    for (const auto& [name, t] : tensors_) tensors.push_back(t.get());
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const Tensor* a, const Tensor* b) {
              return a->spec.name() < b->spec.name();
            });
  std::vector<const Slice*> local;
  for (const Tensor* t : tensors) {
    local.clear();
    for (const auto& slice : t->slices) {
      if (slice != nullptr) local.push_back(slice.get());
    }
    absl::Status s = visit(t->spec, local);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void ShardStore::ReadSlice(const Slice* slice, SliceVisitor visit) {
  slice->Read(visit);
}

absl::Status ShardStore::RestoreTensor(const TensorSpec& in) {
  absl::StatusOr<TensorSpec> spec = Resolve(in);
  if (!spec.ok()) return spec.status();
  auto t = std::make_unique<Tensor>(
      Tensor{*spec, *TensorLayout::FromSpec(*spec), {}});
  t->slices.resize(t->layout.num_slices());
  for (uint32_t i = 0; i < t->layout.num_slices(); ++i) {
    if (SliceHome(spec->name(), i, options_.num_shards) ==
        options_.shard_index) {
      t->slices[i] = std::make_unique<Slice>(*spec, t->layout, i,
                                             /*initialize=*/false);
    }
  }
  absl::MutexLock l(&mu_);
  if (FindTensor(spec->name()) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", spec->name(), "' exists already"));
  }
  tensors_.emplace(spec->name(), std::move(t));
  return absl::OkStatus();
}

absl::Status ShardStore::RestoreSlice(
    const std::string& tensor, uint32_t index, uint64_t version,
    absl::string_view values,
    absl::Span<const absl::string_view> optimizer_state) {
  Slice* slice = nullptr;
  {
    absl::ReaderMutexLock l(&mu_);
    const Tensor* t = FindTensor(tensor);
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor '", tensor, "'"));
    }
    if (index >= t->layout.num_slices()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor, "' has ", t->layout.num_slices(),
                       " slices; slice ", index, " does not exist"));
    }
    slice = t->slices[index].get();
    if (slice == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", index, " of tensor '", tensor, "' lives on shard ",
          SliceHome(tensor, index, options_.num_shards), ", not ",
          options_.shard_index));
    }
  }
  const size_t bytes = slice->size() * sizeof(float);
  if (values.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", index, " of tensor '", tensor, "' holds ",
                     bytes, " bytes of values; got ", values.size()));
  }
  if (optimizer_state.size() != slice->optimizer_buffers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice ", index, " of tensor '", tensor, "': its optimizer keeps ",
        slice->optimizer_buffers(), " state buffers; got ",
        optimizer_state.size()));
  }
  for (size_t i = 0; i < optimizer_state.size(); ++i) {
    if (optimizer_state[i].size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", index, " of tensor '", tensor, "': optimizer state ", i,
          " must hold ", bytes, " bytes; got ", optimizer_state[i].size()));
    }
  }
  slice->Import(version, values, optimizer_state);
  return absl::OkStatus();
}

StoreSize ShardStore::Size() const {
  absl::ReaderMutexLock l(&mu_);
  StoreSize size;
  size.tensors = static_cast<int32_t>(tensors_.size());
  for (const auto& [name, t] : tensors_) {
    for (const auto& s : t->slices) {
      if (s == nullptr) continue;
      ++size.slices;
      size.parameter_bytes += s->size() * sizeof(float);
      size.optimizer_bytes += s->optimizer_bytes();
    }
  }
  return size;
}

}  // namespace asyncps
