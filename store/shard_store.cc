#include "store/shard_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/initializer.h"
#include "common/names.h"
#include "common/shard_map.h"
#include "google/protobuf/util/message_differencer.h"
#include "store/lr_schedule.h"
#include "store/optimizer.h"
#include "store/push_checks.h"
#include "store/shard_store_tensor.h"
#include "store/spec_diff.h"

namespace asyncps {

namespace {

// What a tensor takes on this shard (see ShardStoreOptions::
// max_parameter_bytes); false when the count does not fit in 64 bits.
bool TensorBytes(const TensorSpec& spec, const TensorLayout& layout,
                 int shard_index, const ShardMap& map, uint64_t* bytes) {
  const uint32_t last = layout.num_slices() - 1;
  const uint64_t local_slices =
      map.SlicesOn(spec.name(), layout.num_slices(), shard_index);
  uint64_t local_elems =
      local_slices * static_cast<uint64_t>(layout.slice_elems());
  if (local_slices > 0 && map.SliceHome(spec.name(), last) == shard_index) {
    local_elems -=
        static_cast<uint64_t>(layout.slice_elems() - layout.SliceSize(last));
  }
  const uint64_t floats_per_elem = 1 + OptimizerBuffers(spec.optimizer());
  uint64_t values, slices, table;
  return !__builtin_mul_overflow(local_elems, floats_per_elem * sizeof(float),
                                 &values) &&
         !__builtin_mul_overflow(local_slices, kSliceOverheadBytes, &slices) &&
         !__builtin_mul_overflow(uint64_t{layout.num_slices()},
                                 kTableEntryBytes, &table) &&
         !__builtin_add_overflow(values, slices, bytes) &&
         !__builtin_add_overflow(*bytes, table, bytes);
}

}  // namespace

ShardStore::ShardStore(const ShardStoreOptions& options, const ShardMap& map)
    : options_(options), map_(std::make_shared<ServedMap>(map)) {
  TableStoreOptions t;
  t.shard_index = options.shard_index;
  t.map = map_;
  t.row_ttl_steps = options.row_ttl_steps;
  t.reserve = [this](uint64_t bytes, const std::string& what) {
    return ReserveBytes(bytes, absl::StrCat(what, " need"));
  };
  t.release = [this](uint64_t bytes) { Unreserve(bytes); };
  t.max_bytes = options.max_parameter_bytes;
  t.reserved = [this] {
    absl::MutexLock l(&mu_);
    return reserved_bytes_;
  };
  t.epoch = &epoch_;
  t.track_removed_rows = options.track_removed_rows;
  tables_ = std::make_unique<TableStore>(std::move(t));
}
ShardStore::~ShardStore() = default;

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(
    const ShardStoreOptions& options) {
  absl::StatusOr<ShardMap> map = ShardMap::Static(options.num_shards);
  if (!map.ok()) return map.status();
  if (options.map.has_value()) {
    if (options.map->num_shards() != options.num_shards) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shard map (", options.map->DebugString(),
                       ") is not one of ", options.num_shards, " shards"));
    }
    map = *options.map;
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
  return std::unique_ptr<ShardStore>(new ShardStore(options, *map));
}

absl::StatusOr<TensorSpec> ShardStore::Resolve(const TensorSpec& in) const {
  TensorSpec spec = in;
  absl::Status s = CheckName("tensor name", spec.name());
  if (!s.ok()) return s;
  if (spec.slice_elems() == 0) {
    spec.set_slice_elems(options_.default_slice_elems);
  }
  if (spec.slice_elems() < 0 || spec.slice_elems() > options_.max_slice_elems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", QuoteName(spec.name()), ": slice_elems must be in [1, ",
        options_.max_slice_elems, "], got ", spec.slice_elems()));
  }
  s = TensorLayout::FromSpec(spec).status();
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", QuoteName(spec.name()), ": ", s.message()));
  }
  s = ValidateInitializer(spec);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", QuoteName(spec.name()), ": ", s.message()));
  }
  s = ValidateOptimizer(spec.optimizer());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", QuoteName(spec.name()), ": ", s.message()));
  }
  return spec;
}

const ShardStore::Tensor* ShardStore::FindTensor(absl::string_view name) const {
  return FindMutableTensor(name);
}

ShardStore::Tensor* ShardStore::FindMutableTensor(
    absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.get();
}

uint64_t ShardStore::BytesOf(const TensorSpec& spec) const {
  const TensorLayout layout = *TensorLayout::FromSpec(spec);
  uint64_t bytes = 0;
  if (!TensorBytes(spec, layout, options_.shard_index, map_->get(), &bytes)) {
    bytes = ~uint64_t{0};
  }
  return bytes;
}

std::unique_ptr<ShardStore::Tensor> ShardStore::BuildTensor(
    const TensorSpec& spec, bool initialize, uint64_t bytes,
    const float* given) const {
  const TensorLayout layout = *TensorLayout::FromSpec(spec);
  auto t = std::make_unique<Tensor>(
      Tensor{spec,
             layout,
             OptimizerBuffers(spec.optimizer()),
             {},
             bytes,
             std::make_unique<LrSchedule>(spec.optimizer())});
  t->slices.resize(layout.num_slices());
  const ShardMap map = map_->get();
  for (uint32_t i = 0; i < layout.num_slices(); ++i) {
    if (map.SliceHome(spec.name(), i) == options_.shard_index) {
      t->slices[i] =
          std::make_unique<DenseSlice>(spec, layout, i, initialize, given);
      t->slices[i]->MarkChanged(epoch_.current());
    }
  }
  return t;
}

void ShardStore::Unreserve(uint64_t bytes) {
  absl::MutexLock l(&mu_);
  reserved_bytes_ -= bytes;
}

absl::Status ShardStore::ReserveBytes(uint64_t bytes, const std::string& what) {
  absl::MutexLock l(&mu_);
  const uint64_t cap = options_.max_parameter_bytes;
  if (cap > 0 && (bytes > cap || reserved_bytes_ > cap - bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " ", bytes, " bytes on shard ", options_.shard_index,
                     ", which holds ", reserved_bytes_, " of its ", cap,
                     " (--max_parameter_bytes); nothing was created"));
  }
  reserved_bytes_ += bytes;
  return absl::OkStatus();
}

namespace {

// Tensors and tables share one namespace, also within a request.
absl::Status CheckSharedNamespace(const CreateTensorRequest& request,
                                  const std::vector<TensorSpec>& specs) {
  for (const TableSpec& table : request.tables()) {
    for (const TensorSpec& spec : specs) {
      if (spec.name() != table.name()) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          QuoteName(table.name()),
          " is both a tensor and a sparse table in this request (they share "
          "one namespace)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CreateTensorResponse> ShardStore::CreateTensors(
    const CreateTensorRequest& request) {
  // Slices are placed by a map that does not change meanwhile.
  absl::ReaderMutexLock change(&change_mu_);
  // Validate and resolve outside the lock; slices are built outside it too.
  absl::StatusOr<std::vector<TensorSpec>> specs = ResolveSpecs(request);
  if (!specs.ok()) return specs.status();
  absl::StatusOr<GivenValues> given = DecodeGivenValues(request, *specs);
  if (!given.ok()) return given.status();
  absl::Status s = CheckSharedNamespace(request, *specs);
  if (!s.ok()) return s;
  absl::StatusOr<std::vector<const TensorSpec*>> missing =
      MissingTensors(*specs);
  if (!missing.ok()) return missing.status();
  // The tables of the request, validated and reserved (given back on any
  // error below).
  absl::StatusOr<TableStore::Staged> tables = tables_->Stage(request.tables());
  if (!tables.ok()) return tables.status();
  absl::StatusOr<std::vector<std::unique_ptr<Tensor>>> fresh =
      BuildMissing(*missing, *given);
  if (!fresh.ok()) return fresh.status();
  return Publish(*specs, *std::move(fresh), &*tables);
}

absl::StatusOr<std::vector<TensorSpec>> ShardStore::ResolveSpecs(
    const CreateTensorRequest& request) const {
  std::vector<TensorSpec> specs;
  absl::flat_hash_set<std::string> names;
  for (const TensorSpec& in : request.tensors()) {
    absl::StatusOr<TensorSpec> spec = Resolve(in);
    if (!spec.ok()) return spec.status();
    if (!names.insert(spec->name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", QuoteName(spec->name()), " appears twice in one request"));
    }
    specs.push_back(*std::move(spec));
  }
  return specs;
}

absl::StatusOr<ShardStore::GivenValues> ShardStore::DecodeGivenValues(
    const CreateTensorRequest& request, const std::vector<TensorSpec>& specs) {
  GivenValues given;
  for (const TensorValues& v : request.values()) {
    const TensorSpec* spec = nullptr;
    for (const TensorSpec& t : specs) {
      if (t.name() == v.tensor()) spec = &t;
    }
    if (spec == nullptr || spec->init() != INIT_VALUES) {
      return absl::InvalidArgumentError(absl::StrCat(
          "values given for ", QuoteName(v.tensor()),
          ", which is not a tensor of this request with init INIT_VALUES"));
    }
    const int64_t n = TensorLayout::FromSpec(*spec)->num_elems();
    if (v.values().size() != static_cast<uint64_t>(n) * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", QuoteName(v.tensor()), " has ", n, " elements; ",
          v.values().size(), " bytes of values given (want ", n * 4, ")"));
    }
    if (!AllFinite(v.values().data(), static_cast<size_t>(n), WIRE_F32)) {
      return absl::InvalidArgumentError(absl::StrCat("the values of tensor ",
                                                     QuoteName(v.tensor()),
                                                     " contain NaN or Inf"));
    }
    std::vector<float> values(static_cast<size_t>(n));
    DecodeFloats(v.values(), values.data(), values.size());
    if (!given.emplace(v.tensor(), std::move(values)).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "values given twice for tensor ", QuoteName(v.tensor())));
    }
  }
  for (const TensorSpec& spec : specs) {
    if (spec.init() == INIT_VALUES && !given.contains(spec.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", QuoteName(spec.name()),
          " has init INIT_VALUES but the request carries no values for it"));
    }
  }
  return given;
}

absl::StatusOr<std::vector<const TensorSpec*>> ShardStore::MissingTensors(
    const std::vector<TensorSpec>& specs) const {
  std::vector<const TensorSpec*> missing;
  absl::ReaderMutexLock l(&mu_);
  for (const TensorSpec& spec : specs) {
    const Tensor* existing = FindTensor(spec.name());
    if (existing == nullptr) {
      missing.push_back(&spec);
      continue;
    }
    const std::string diff = SpecDifferences(existing->spec, spec);
    if (!diff.empty()) {
      return absl::AlreadyExistsError(
          absl::StrCat("tensor ", QuoteName(spec.name()),
                       " exists with another spec: ", diff));
    }
  }
  return missing;
}

absl::StatusOr<std::vector<std::unique_ptr<ShardStore::Tensor>>>
ShardStore::BuildMissing(const std::vector<const TensorSpec*>& missing,
                         const GivenValues& given) {
  // The whole request is sized and reserved before any tensor is built.
  std::vector<uint64_t> bytes;
  uint64_t total = 0;
  for (const TensorSpec* spec : missing) {
    bytes.push_back(BytesOf(*spec));
    if (__builtin_add_overflow(total, bytes.back(), &total)) {
      total = ~uint64_t{0};
    }
  }
  if (!missing.empty()) {
    const std::string what =
        missing.size() == 1
            ? absl::StrCat("tensor ", QuoteName(missing[0]->name()), " needs")
            : absl::StrCat("the ", missing.size(),
                           " new tensors of this request need");
    absl::Status reserved = ReserveBytes(total, what);
    if (!reserved.ok()) return reserved;
  }
  std::vector<std::unique_ptr<Tensor>> fresh;
  for (size_t i = 0; i < missing.size(); ++i) {
    auto it = given.find(missing[i]->name());
    fresh.push_back(
        BuildTensor(*missing[i], /*initialize=*/true, bytes[i],
                    it == given.end() ? nullptr : it->second.data()));
  }
  return fresh;
}

absl::Status ShardStore::CheckStillNew(
    const std::vector<TensorSpec>& specs,
    const std::vector<std::unique_ptr<Tensor>>& fresh,
    const TableStore::Staged& tables) const {
  // A concurrent identical create may have won the race, which is fine; a
  // conflicting one is an error.
  for (const auto& t : fresh) {
    const Tensor* existing = FindTensor(t->spec.name());
    if (existing != nullptr &&
        !google::protobuf::util::MessageDifferencer::Equals(existing->spec,
                                                            t->spec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("tensor ", QuoteName(t->spec.name()),
                       " was created concurrently with a different spec"));
    }
  }
  for (const TensorSpec& spec : specs) {
    if (tables_->Contains(spec.name())) {
      return absl::AlreadyExistsError(
          absl::StrCat("tensor ", QuoteName(spec.name()),
                       ": a sparse table of that name exists"));
    }
  }
  return tables_->CheckStaged(tables, [this](const std::string& name)
                                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                            return FindTensor(name) != nullptr;
                                          });
}

absl::StatusOr<CreateTensorResponse> ShardStore::Publish(
    const std::vector<TensorSpec>& specs,
    std::vector<std::unique_ptr<Tensor>> fresh, TableStore::Staged* tables) {
  CreateTensorResponse response;
  absl::MutexLock l(&mu_);
  absl::Status s = CheckStillNew(specs, fresh, *tables);
  if (!s.ok()) {
    for (const auto& f : fresh) reserved_bytes_ -= f->reserved_bytes;
    return s;
  }
  int created = 0;
  for (auto& t : fresh) {
    if (FindTensor(t->spec.name()) != nullptr) {
      reserved_bytes_ -= t->reserved_bytes;  // lost an identical race
      continue;
    }
    const std::string name = t->spec.name();
    tensors_.emplace(name, std::move(t));
    ++created;
  }
  for (const TensorSpec& spec : specs) *response.add_tensors() = spec;
  for (const TableSpec& spec : tables->specs()) *response.add_tables() = spec;
  created += tables_->Commit(tables);
  response.set_created(created);
  return response;
}

std::vector<TensorSpec> ShardStore::ListTensors() const {
  absl::ReaderMutexLock l(&mu_);
  std::vector<TensorSpec> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) out.push_back(t->Listed());
  return out;
}

absl::StatusOr<SetLearningRateResponse> ShardStore::SetLearningRates(
    const SetLearningRateRequest& request, bool* changed) {
  *changed = false;
  // One writer at a time, so that what is checked is what is applied.
  absl::MutexLock writer(&schedule_mu_);
  std::vector<LrSchedule*> schedules;
  absl::flat_hash_set<absl::string_view> seen;
  for (const LearningRate& rate : request.rates()) {
    LrSchedule* schedule = nullptr;
    {
      absl::ReaderMutexLock l(&mu_);
      const Tensor* t = FindTensor(rate.name());
      if (t != nullptr) schedule = t->schedule.get();
    }
    if (schedule == nullptr) schedule = tables_->FindSchedule(rate.name());
    if (schedule == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("unknown tensor or table ", QuoteName(rate.name())));
    }
    if (!seen.insert(rate.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          QuoteName(rate.name()), " appears twice in one request"));
    }
    absl::Status s = schedule->Check(rate.name(), rate);
    if (!s.ok()) return s;
    schedules.push_back(schedule);
  }
  SetLearningRateResponse response;
  for (int i = 0; i < request.rates_size(); ++i) {
    *changed = schedules[i]->Apply(request.rates(i)) || *changed;
    LearningRate* now = response.add_rates();
    now->set_name(request.rates(i).name());
    schedules[i]->Current(now);
  }
  return response;
}

std::vector<LearningRate> ShardStore::LearningRates() const {
  std::vector<LearningRate> out;
  LearningRate rate;
  for (const TensorSpec& t : ListTensors()) {
    if (ScheduleOf(t.name(), t.optimizer(), &rate)) out.push_back(rate);
  }
  for (const TableSpec& t : tables_->List()) {
    if (ScheduleOf(t.name(), t.optimizer(), &rate)) out.push_back(rate);
  }
  std::sort(out.begin(), out.end(),
            [](const LearningRate& a, const LearningRate& b) {
              return a.name() < b.name();
            });
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
  return Pull(
      request, [response](const std::string& tensor, uint32_t slice,
                          uint64_t version, absl::Span<const float> values) {
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
  found.reserve(request.tensors_size());
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& name : request.tensors()) {
    const Tensor* t = FindTensor(name);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("unknown tensor ", QuoteName(name)));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", QuoteName(name), " requested twice"));
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

std::vector<Payload> ShardStore::PayloadsOf(const PushRequest& request) {
  return GradPayloads(request.grads());
}

absl::StatusOr<DenseSlice*> ShardStore::FindSlice(
    const Tensor* t, const SliceGradient& g) const {
  if (t == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("unknown tensor ", QuoteName(g.tensor())));
  }
  if (g.slice() >= t->layout.num_slices()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", QuoteName(g.tensor()), " has ", t->layout.num_slices(),
        " slices; slice ", g.slice(), " does not exist"));
  }
  DenseSlice* slice = t->slices[g.slice()].get();
  if (slice == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice ", g.slice(), " of tensor ", QuoteName(g.tensor()),
        " lives on shard ", map_->get().SliceHome(g.tensor(), g.slice()),
        ", not ", options_.shard_index));
  }
  return slice;
}

absl::StatusOr<ShardStore::PreparedPush> ShardStore::PreparePush(
    const PushRequest& request, absl::Span<const Payload> grads,
    absl::Span<const Payload> rows, PushMode mode) {
  absl::StatusOr<PreparedPush> out = PrepareSlices(request, grads, mode);
  if (!out.ok()) return out;
  // Rows after slices: a bad slice is reported before any row is looked at.
  absl::StatusOr<TableStore::PreparedRows> prepared_rows =
      tables_->PreparePush(request, rows, mode);
  if (!prepared_rows.ok()) return prepared_rows.status();
  out->rows_ = *std::move(prepared_rows);
  return out;
}

void ShardStore::CommitPush(PreparedPush* push, const StalenessRule& rule,
                            PushResponse* response) {
  if (push->request_ == nullptr) return;  // committed before
  const PushRequest& request = *push->request_;
  push->request_ = nullptr;
  tables_->CommitPush(&push->rows_, rule, response);
  response->mutable_results()->Reserve(request.grads_size());
  for (int i = 0; i < request.grads_size(); ++i) {
    const SliceGradient& g = request.grads(i);
    SliceResult* result = response->add_results();
    result->set_tensor(g.tensor());
    result->set_slice(g.slice());
    if (push->mode_ == PushMode::kRefuseRestored) {
      result->set_outcome(REFUSED_RESTORED);
      result->set_new_version(push->slices_[i]->version());
      result->set_lr_scale(0);
    } else if (request.assign()) {
      push->slices_[i]->Assign(push->grads_[i], epoch_, result);
    } else {
      push->slices_[i]->Apply(push->grads_[i], g.read_version(), rule,
                              push->schedules_[i]->factor(), epoch_, result);
    }
  }
}

absl::StatusOr<ShardStore::PreparedPush> ShardStore::PrepareSlices(
    const PushRequest& request, absl::Span<const Payload> grads,
    PushMode mode) const {
  if (grads.size() != static_cast<size_t>(request.grads_size())) {
    return absl::InternalError(absl::StrCat("push has ", request.grads_size(),
                                            " gradients but ", grads.size(),
                                            " payloads"));
  }
  // An assign's read versions are not looked at.
  const bool allow_future_versions =
      mode == PushMode::kRefuseRestored || request.assign();
  PreparedPush out;
  out.request_ = &request;
  out.grads_ = grads;
  out.mode_ = mode;
  out.slices_.reserve(request.grads_size());
  out.schedules_.reserve(request.grads_size());
  absl::ReaderMutexLock l(&mu_);
  // Slices are unique objects, so repeated slices are found by pointer.
  absl::flat_hash_set<const DenseSlice*> seen;
  seen.reserve(request.grads_size());
  // A push lists many slices of few tensors, usually in runs of the same
  // tensor: look a name up only when it changes.
  const Tensor* t = nullptr;
  for (int k = 0; k < request.grads_size(); ++k) {
    const SliceGradient& g = request.grads(k);
    const Payload& payload = grads[k];
    if (t == nullptr || g.tensor() != t->spec.name())
      t = FindTensor(g.tensor());
    absl::StatusOr<DenseSlice*> slice = FindSlice(t, g);
    if (!slice.ok()) return slice.status();
    if (!seen.insert(*slice).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          SliceName(g.tensor(), g.slice()), " appears twice in one push"));
    }
    const uint64_t expected =
        static_cast<uint64_t>((*slice)->size()) * WireBytes(payload.dtype());
    if (payload.size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          SliceName(g.tensor(), g.slice()), " holds ", (*slice)->size(),
          " values (", expected, " bytes as ", WireDtype_Name(payload.dtype()),
          "); the gradient has ", payload.size(), " bytes"));
    }
    if (const uint64_t version = (*slice)->version();
        g.read_version() > version && !allow_future_versions) {
      return FutureReadVersionError(SliceName(g.tensor(), g.slice()), "slice",
                                    g.read_version(), version);
    }
    if (!AllFinite(payload)) {
      return NotFiniteError(SliceName(g.tensor(), g.slice()), request.assign());
    }
    out.slices_.push_back(*slice);
    out.schedules_.push_back(t->schedule.get());
  }
  return out;
}

StoreSize ShardStore::Size() const {
  StoreSize size;
  const TableStore::Totals tables = tables_->totals();
  size.tables = tables.tables;
  size.table_rows = tables.rows;
  size.table_bytes = tables.bytes;
  absl::ReaderMutexLock l(&mu_);
  size.tensors = static_cast<int32_t>(tensors_.size());
  size.reserved_bytes = reserved_bytes_;
  size.slices_remade = slices_remade_;
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
