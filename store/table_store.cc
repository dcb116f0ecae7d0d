#include "store/table_store.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "google/protobuf/util/message_differencer.h"
#include "store/push_checks.h"
#include "store/spec_diff.h"

namespace asyncps {

namespace {

// Tries of a request whose new rows need room made by eviction.
constexpr int kRoomAttempts = 4;

absl::Span<const uint64_t> IdSpan(
    const google::protobuf::RepeatedField<uint64_t>& f) {
  return absl::MakeConstSpan(f.data(), f.size());
}

// Reserved bytes, given back at the end of a request unless rows used them.
class Reservation {
 public:
  explicit Reservation(const TableStoreOptions& options) : o_(options) {}
  ~Reservation() {
    if (bytes_ > 0) o_.release(bytes_);
  }
  absl::Status Take(uint64_t bytes, const std::string& what) {
    if (bytes == 0) return absl::OkStatus();
    absl::Status s = o_.reserve(bytes, what);
    if (s.ok()) bytes_ += bytes;
    return s;
  }
  // `bytes` now belong to rows that were created.
  void Keep(uint64_t bytes) { bytes_ -= std::min(bytes, bytes_); }

 private:
  const TableStoreOptions& o_;
  uint64_t bytes_ = 0;
};

std::string NewRowsWhat(uint64_t rows, const std::vector<SparseTable*>& tables,
                        const std::vector<SparseTable::Batch>& batches) {
  std::string names;
  for (size_t k = 0; k < tables.size(); ++k) {
    if (batches[k].missing == 0) continue;
    absl::StrAppend(&names, names.empty() ? "" : ", ",
                    QuoteName(tables[k]->spec().name()));
  }
  return absl::StrCat(rows, " new row(s) of table(s) ", names);
}

}  // namespace

// ---------------------------------------------------------------- tables

TableStore::Staged::Staged(Staged&& other) noexcept
    : store_(other.store_),
      specs_(std::move(other.specs_)),
      fresh_(std::move(other.fresh_)),
      reserved_(other.reserved_) {
  other.reserved_ = 0;
}

TableStore::Staged::~Staged() {
  if (reserved_ > 0) store_->options_.release(reserved_);
}

namespace {

TableStoreOptions WithMap(TableStoreOptions options) {
  if (options.map == nullptr) {
    options.map = std::make_shared<const ServedMap>(ShardMap());
  }
  return options;
}

}  // namespace

TableStore::TableStore(TableStoreOptions options)
    : options_(WithMap(std::move(options))) {}

TableStore::~TableStore() = default;

uint64_t TableStore::TableBytes(const SparseTable& t) const {
  return t.fixed_bytes() + t.rows() * t.row_bytes();
}

bool TableStore::CanEvict() const {
  absl::ReaderMutexLock l(&mu_);
  for (const auto& [name, t] : tables_) {
    if (t->evicts_under_cap() && t->rows() > 0) return true;
  }
  return false;
}

absl::Status TableStore::ReserveWithRoom(uint64_t bytes,
                                         const std::string& what) {
  absl::Status s = options_.reserve(bytes, what);
  for (int i = 0; i < kRoomAttempts && absl::IsResourceExhausted(s) &&
                  options_.max_bytes > 0 && CanEvict();
       ++i) {
    MakeRoom(bytes);
    s = options_.reserve(bytes, what);
  }
  return s;
}

absl::Status TableStore::CheckMinimum(const SparseTable& t) const {
  if (options_.max_bytes == 0 || !t.evicts_under_cap()) {
    return absl::OkStatus();
  }
  uint64_t evictable = 0;
  {
    absl::ReaderMutexLock l(&mu_);
    for (const auto& [name, other] : tables_) {
      if (other->evicts_under_cap()) {
        evictable += other->rows() * other->row_bytes();
      }
    }
  }
  const uint64_t held = options_.reserved() - evictable;
  const uint64_t minimum =
      t.fixed_bytes() + EvictionRule::kMinRows * t.row_bytes();
  if (held + minimum <= options_.max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", QuoteName(t.spec().name()), " (", t.fixed_bytes(),
      " bytes and room for ", EvictionRule::kMinRows, " rows of ",
      t.row_bytes(), ") needs ", minimum, " bytes, but --max_parameter_bytes ",
      options_.max_bytes, " leaves ",
      options_.max_bytes - std::min(options_.max_bytes, held),
      " beside what cannot be evicted; nothing was created"));
}

SparseTable* TableStore::FindMutable(absl::string_view name) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second.get();
}

const SparseTable* TableStore::Find(absl::string_view name) const {
  return FindMutable(name);
}

bool TableStore::Contains(absl::string_view name) const {
  return Find(name) != nullptr;
}

absl::StatusOr<TableStore::Staged> TableStore::Stage(
    const google::protobuf::RepeatedPtrField<TableSpec>& specs) {
  Staged staged(this);
  absl::flat_hash_set<std::string> names;
  for (const TableSpec& spec : specs) {
    absl::Status s = SparseTable::ValidateSpec(spec);
    if (!s.ok()) return s;
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", QuoteName(spec.name()), " appears twice in one request"));
    }
    staged.specs_.push_back(spec);
    const SparseTable* existing = Find(spec.name());
    if (existing != nullptr) {
      const std::string diff = SpecDifferences(existing->spec(), spec);
      if (!diff.empty()) {
        return absl::AlreadyExistsError(
            absl::StrCat("table ", QuoteName(spec.name()),
                         " exists with another spec: ", diff));
      }
      continue;
    }
    auto table = std::make_unique<SparseTable>(spec, options_.shard_index,
                                               options_.map, options_.epoch,
                                               options_.track_removed_rows);
    s = CheckMinimum(*table);
    if (!s.ok()) return s;
    s = ReserveWithRoom(table->fixed_bytes(),
                        absl::StrCat("table ", QuoteName(spec.name())));
    if (!s.ok()) return s;
    staged.reserved_ += table->fixed_bytes();
    staged.fresh_.push_back(std::move(table));
  }
  return staged;
}

absl::Status TableStore::CheckStaged(
    const Staged& staged,
    absl::FunctionRef<bool(const std::string&)> is_tensor) const {
  absl::ReaderMutexLock l(&mu_);
  for (const TableSpec& spec : staged.specs_) {
    if (is_tensor(spec.name())) {
      return absl::AlreadyExistsError(
          absl::StrCat("table ", QuoteName(spec.name()),
                       ": a dense tensor of that name exists"));
    }
    auto it = tables_.find(spec.name());
    if (it != tables_.end() &&
        !google::protobuf::util::MessageDifferencer::Equals(it->second->spec(),
                                                            spec)) {
      return absl::AlreadyExistsError(
          absl::StrCat("table ", QuoteName(spec.name()),
                       " was created concurrently with a different spec"));
    }
  }
  return absl::OkStatus();
}

int TableStore::Commit(Staged* staged) {
  int created = 0;
  absl::MutexLock l(&mu_);
  for (auto& t : staged->fresh_) {
    if (tables_.contains(t->spec().name())) continue;  // an identical race
    staged->reserved_ -= t->fixed_bytes();
    const std::string name = t->spec().name();
    tables_.emplace(name, std::move(t));
    ++created;
  }
  return created;
}

std::vector<SparseTable*> TableStore::Sorted() const {
  std::vector<SparseTable*> out;
  {
    absl::ReaderMutexLock l(&mu_);
    for (const auto& [name, t] : tables_) out.push_back(t.get());
  }
  std::sort(out.begin(), out.end(), [](SparseTable* a, SparseTable* b) {
    return a->spec().name() < b->spec().name();
  });
  return out;
}

LrSchedule* TableStore::FindSchedule(absl::string_view name) {
  SparseTable* t = FindMutable(name);
  return t == nullptr ? nullptr : &t->schedule();
}

std::vector<TableSpec> TableStore::List() const {
  std::vector<TableSpec> out;
  for (const SparseTable* t : Sorted()) out.push_back(t->Listed());
  return out;
}

// ---------------------------------------------------------------- rows

template <typename Entry>
absl::StatusOr<std::vector<SparseTable*>> TableStore::Resolve(
    const google::protobuf::RepeatedPtrField<Entry>& entries) const {
  std::vector<SparseTable*> tables;
  tables.reserve(entries.size());
  for (const Entry& e : entries) {
    SparseTable* t = FindMutable(e.table());
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("unknown table ", QuoteName(e.table())));
    }
    if (std::find(tables.begin(), tables.end(), t) != tables.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", QuoteName(e.table()), " appears twice in one request"));
    }
    absl::Status s = t->CheckIds(IdSpan(e.ids()), options_.max_ids_per_table);
    if (!s.ok()) return s;
    tables.push_back(t);
  }
  return tables;
}

absl::Status TableStore::ValidatePull(const PullRequest& request) const {
  return Resolve(request.rows()).status();
}

absl::Status TableStore::Pull(
    const PullRequest& request, int64_t clock, WireDtype dtype,
    PullResponse* response,
    absl::FunctionRef<char*(int k, size_t bytes)> buffer) {
  if (request.rows_size() == 0) return absl::OkStatus();
  absl::StatusOr<std::vector<SparseTable*>> tables = Resolve(request.rows());
  if (!tables.ok()) return tables.status();
  for (int attempt = 0;; ++attempt) {
    uint64_t short_bytes = 0;
    absl::Status s = PullOnce(request, *tables, clock, dtype, response, buffer,
                              attempt < kRoomAttempts ? &short_bytes : nullptr);
    if (short_bytes == 0) return s;
    MakeRoom(short_bytes);
  }
}

absl::Status TableStore::PullOnce(
    const PullRequest& request, const std::vector<SparseTable*>& tables,
    int64_t clock, WireDtype dtype, PullResponse* response,
    absl::FunctionRef<char*(int k, size_t bytes)> buffer,
    uint64_t* short_bytes) {
  absl::ReaderMutexLock evict(&evict_mu_);
  const int n = request.rows_size();
  std::vector<SparseTable::Batch> batches(n);
  uint64_t missing_bytes = 0, missing_rows = 0;
  for (int k = 0; k < n; ++k) {
    tables[k]->Find(IdSpan(request.rows(k).ids()), &batches[k]);
    // A peek creates nothing, nor does a pull of a table with admission.
    if (request.rows(k).peek() || !tables[k]->admits_all()) continue;
    missing_rows += batches[k].missing;
    missing_bytes += batches[k].missing * tables[k]->row_bytes();
  }
  Reservation reservation(options_);
  absl::Status s = reservation.Take(missing_bytes,
                                    NewRowsWhat(missing_rows, tables, batches));
  if (!s.ok()) {
    if (short_bytes != nullptr && absl::IsResourceExhausted(s) && CanEvict()) {
      *short_bytes = missing_bytes;
    }
    return s;
  }
  for (int k = 0; k < n; ++k) {
    SparseTable* t = tables[k];
    const TableIds& in = request.rows(k);
    RowsData* out = response->add_rows();
    out->set_table(in.table());
    out->mutable_versions()->Resize(in.ids_size(), 0);
    const size_t bytes =
        static_cast<size_t>(in.ids_size()) * t->dim() * WireBytes(dtype);
    out->set_payload_bytes(bytes);
    char* values = buffer(k, bytes);
    uint64_t* versions = out->mutable_versions()->mutable_data();
    if (in.peek()) {
      t->Peek(IdSpan(in.ids()), batches[k], dtype, values, versions);
      continue;
    }
    const uint64_t created =
        t->Read(IdSpan(in.ids()), &batches[k], clock, dtype, values, versions);
    reservation.Keep(created * t->row_bytes());
    out->set_rows_created(created);
  }
  return absl::OkStatus();
}

std::vector<Payload> TableStore::PayloadsOf(const PushRequest& request) {
  return GradPayloads(request.rows());
}

absl::Status TableStore::DecodePush(
    const PushRequest& request, absl::Span<const Payload> grads,
    std::vector<SparseTable*>* tables,
    std::vector<std::vector<float>>* decoded) const {
  const int n = request.rows_size();
  if (grads.size() != static_cast<size_t>(n)) {
    return absl::InternalError(absl::StrCat(
        "push has ", n, " row gradients but ", grads.size(), " payloads"));
  }
  if (n == 0) return absl::OkStatus();
  absl::StatusOr<std::vector<SparseTable*>> resolved = Resolve(request.rows());
  if (!resolved.ok()) return resolved.status();
  *tables = *std::move(resolved);
  decoded->resize(n);
  for (int k = 0; k < n; ++k) {
    const RowsGradient& g = request.rows(k);
    const SparseTable& t = *(*tables)[k];
    if (g.read_versions_size() != 0 && g.read_versions_size() != g.ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", QuoteName(g.table()), ": ", g.ids_size(), " ids but ",
          g.read_versions_size(), " read_versions (give one per id, or none)"));
    }
    const uint64_t values = static_cast<uint64_t>(g.ids_size()) * t.dim();
    const uint64_t expected = values * WireBytes(grads[k].dtype());
    if (grads[k].size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", QuoteName(g.table()), " has dim ", t.dim(), ": ",
          g.ids_size(), " ids need ", expected, " bytes of gradient as ",
          WireDtype_Name(grads[k].dtype()), "; got ", grads[k].size()));
    }
    if (!AllFinite(grads[k])) {
      return NotFiniteError(absl::StrCat("table ", QuoteName(g.table())),
                            request.assign());
    }
    (*decoded)[k].resize(values);
    DecodePayload(grads[k], (*decoded)[k].data());
    if (request.assign()) {
      // One value per row: a repeated id would make the result depend on
      // the order the rows are written in.
      absl::flat_hash_set<uint64_t> ids;
      ids.reserve(g.ids_size());
      for (uint64_t id : g.ids()) {
        if (!ids.insert(id).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("row ", id, " of table ", QuoteName(g.table()),
                           " appears twice in one assign"));
        }
      }
    }
  }
  return absl::OkStatus();
}

TableStore::PreparedRows::PreparedRows(PreparedRows&& other) noexcept {
  *this = std::move(other);
}

TableStore::PreparedRows& TableStore::PreparedRows::operator=(
    PreparedRows&& other) noexcept {
  if (this == &other) return *this;
  Release();
  store_ = other.store_;
  request_ = other.request_;
  mode_ = other.mode_;
  evict_mu_ = std::exchange(other.evict_mu_, nullptr);
  tables_ = std::move(other.tables_);
  decoded_ = std::move(other.decoded_);
  batches_ = std::move(other.batches_);
  reserved_ = std::exchange(other.reserved_, 0);
  return *this;
}

TableStore::PreparedRows::~PreparedRows() { Release(); }

void TableStore::PreparedRows::Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (reserved_ > 0) store_->options_.release(reserved_);
  reserved_ = 0;
  if (evict_mu_ != nullptr) evict_mu_->ReaderUnlock();
  evict_mu_ = nullptr;
}

absl::StatusOr<TableStore::PreparedRows> TableStore::PreparePush(
    const PushRequest& request, absl::Span<const Payload> grads,
    PushMode mode) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const int n = request.rows_size();
  PreparedRows out;
  // Sizes and values, then (under the eviction lock) versions and memory.
  absl::Status checked =
      DecodePush(request, grads, &out.tables_, &out.decoded_);
  if (!checked.ok()) return checked;
  if (n == 0) return out;
  out.store_ = this;
  out.request_ = &request;
  out.mode_ = mode;
  for (int attempt = 0;; ++attempt) {
    // Held by `out` from here on: released when it is committed or
    // dropped, or below before room is made.
    evict_mu_.ReaderLock();
    out.evict_mu_ = &evict_mu_;
    uint64_t short_bytes = 0;
    absl::Status s = FindPushRows(
        request, mode, &out, attempt < kRoomAttempts ? &short_bytes : nullptr);
    if (s.ok()) return out;
    out.Release();
    if (short_bytes == 0) return s;
    MakeRoom(short_bytes);
  }
}

absl::Status TableStore::FindPushRows(const PushRequest& request, PushMode mode,
                                      PreparedRows* out,
                                      uint64_t* short_bytes) {
  const int n = request.rows_size();
  // Read versions from the future are bad input where rows cannot have
  // been evicted since they were read.
  // (An assign's read versions are not looked at.)
  const bool check_future = mode == PushMode::kApply &&
                            options_.row_ttl_steps == 0 && !request.assign();
  out->batches_.assign(n, SparseTable::Batch());
  std::vector<uint64_t> versions;
  uint64_t missing_bytes = 0, missing_rows = 0;
  for (int k = 0; k < n; ++k) {
    const RowsGradient& g = request.rows(k);
    SparseTable* t = out->tables_[k];
    SparseTable::Batch& batch = out->batches_[k];
    const bool future =
        check_future && !t->evicts_under_cap() && g.read_versions_size() > 0;
    if (future) versions.assign(g.ids_size(), 0);
    t->Find(IdSpan(g.ids()), &batch, future ? versions.data() : nullptr);
    if (future) {
      for (int i = 0; i < g.ids_size(); ++i) {
        if (g.read_versions(i) > versions[i]) {
          return FutureReadVersionError(
              absl::StrCat("row ", g.ids(i), " of table ",
                           QuoteName(g.table())),
              "row", g.read_versions(i), versions[i]);
        }
      }
    }
    // An assign creates every missing row; a push those admitted.
    const uint64_t creates = request.assign()
                                 ? (batch.may_create = batch.missing)
                                 : t->Admissible(IdSpan(g.ids()), &batch);
    missing_rows += creates;
    missing_bytes += creates * t->row_bytes();
  }
  if (mode != PushMode::kApply || missing_bytes == 0) return absl::OkStatus();
  absl::Status s = options_.reserve(
      missing_bytes, NewRowsWhat(missing_rows, out->tables_, out->batches_));
  if (!s.ok()) {
    if (short_bytes != nullptr && absl::IsResourceExhausted(s) && CanEvict()) {
      *short_bytes = missing_bytes;
    }
    return s;
  }
  out->reserved_ = missing_bytes;
  return absl::OkStatus();
}

void TableStore::CommitPush(PreparedRows* rows, const StalenessRule& rule,
                            PushResponse* response) {
  if (rows->request_ == nullptr) return;  // no rows, or committed
  const PushRequest& request = *rows->request_;
  rows->request_ = nullptr;
  const int n = request.rows_size();
  for (int k = 0; k < n; ++k) {
    const RowsGradient& g = request.rows(k);
    RowsResult* r = response->add_row_results();
    r->set_table(g.table());
    if (rows->mode_ == PushMode::kRefuseRestored) {
      absl::flat_hash_set<uint64_t> distinct(g.ids().begin(), g.ids().end());
      r->set_refused_restored(distinct.size());
      continue;
    }
    SparseTable* t = rows->tables_[k];
    const SparseTable::PushCounts c =
        request.assign()
            ? t->Assign(IdSpan(g.ids()), &rows->batches_[k],
                        rows->decoded_[k].data(), request.worker().clock())
            : t->Apply(IdSpan(g.ids()), &rows->batches_[k],
                       IdSpan(g.read_versions()), rows->decoded_[k].data(),
                       rule, request.worker().clock());
    // The created rows' bytes now belong to them.
    rows->reserved_ -= std::min(rows->reserved_, c.created * t->row_bytes());
    r->set_applied(c.applied);
    r->set_refused_stale(c.refused_stale);
    r->set_refused_restored(c.refused_restored);
    r->set_staleness_sum(c.staleness_sum);
    r->set_max_staleness(c.max_staleness);
    r->set_scaled(c.scaled);
    r->set_rows_created(c.created);
    r->set_refused_admission(c.refused_admission);
  }
  rows->Release();
}

bool TableStore::IdleDue(int64_t clock) const {
  const int64_t ttl = options_.row_ttl_steps;
  if (ttl <= 0) return false;
  absl::ReaderMutexLock l(&evict_mu_);
  return clock - last_evict_clock_ >= std::max<int64_t>(1, ttl / 8);
}

bool TableStore::WatermarkDue() const {
  const uint64_t cap = options_.max_bytes;
  return cap != 0 && CanEvict() && options_.reserved() + cap / 32 > cap;
}

bool TableStore::EvictionDue(int64_t clock) const {
  return WatermarkDue() || IdleDue(clock);
}

uint64_t TableStore::EvictIdle(int64_t clock) {
  const int64_t ttl = options_.row_ttl_steps;
  if (!IdleDue(clock)) return 0;
  std::vector<std::pair<SparseTable*, std::vector<uint64_t>>> ids;
  uint64_t evicted = 0;
  {
    absl::MutexLock l(&evict_mu_);
    last_evict_clock_ = clock;
    for (SparseTable* table : Sorted()) {
      std::vector<uint64_t>* out = nullptr;
      if (listener_) out = &ids.emplace_back(table, 0).second;
      const uint64_t n = table->EvictBefore(clock - ttl, out);
      if (n > 0) options_.release(n * table->row_bytes());
      evicted += n;
    }
  }
  for (const auto& [table, list] : ids) {
    if (!list.empty()) listener_(table->spec().name(), list, /*idle=*/true);
  }
  return evicted;
}

absl::StatusOr<uint64_t> TableStore::EvictRows(absl::string_view table,
                                               absl::Span<const uint64_t> ids,
                                               bool idle) {
  SparseTable* t = FindMutable(table);
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("evicted rows of unknown table ", QuoteName(table)));
  }
  uint64_t n;
  {
    absl::MutexLock l(&evict_mu_);
    n = t->EvictIds(ids, idle);
  }
  options_.release(n * t->row_bytes());
  return n;
}

uint64_t TableStore::MakeRoom(uint64_t bytes) {
  if (options_.max_bytes == 0) return 0;
  absl::MutexLock room(&room_mu_);
  // Another request may have made the room meanwhile.
  const uint64_t free =
      options_.max_bytes - std::min(options_.max_bytes, options_.reserved());
  if (free >= bytes + options_.max_bytes / 128) return 0;
  return FreeBytes(bytes + options_.max_bytes / 64 - free);
}

uint64_t TableStore::EvictToWatermark() {
  if (!WatermarkDue()) return 0;
  const uint64_t cap = options_.max_bytes;
  absl::MutexLock room(&room_mu_);
  const uint64_t reserved = options_.reserved();
  const uint64_t low = cap - cap / 16;
  return reserved > low ? FreeBytes(reserved - low) : 0;
}

uint64_t TableStore::FreeBytes(uint64_t bytes) {
  uint64_t freed = 0, evicted = 0;
  for (int round = 0; round < 8 && freed < bytes; ++round) {
    std::vector<SparseTable*> victims;
    double held = 0;
    for (SparseTable* t : Sorted()) {
      if (!t->evicts_under_cap() || t->rows() == 0) continue;
      victims.push_back(t);
      held += static_cast<double>(t->rows() * t->row_bytes());
    }
    if (victims.empty()) break;
    // Every evicting table gives up its share of what is still needed, in
    // proportion to the row bytes it holds: the tables shrink together, so
    // none keeps (in its chunks and index) room for many more rows than it
    // holds, and the rows of tables used alike live alike long.
    const double need = static_cast<double>(bytes - freed);
    for (SparseTable* victim : victims) {
      const uint64_t row_bytes = victim->row_bytes();
      const double share =
          need * static_cast<double>(victim->rows() * row_bytes) / held;
      uint64_t left = std::min<uint64_t>(
          victim->rows(), static_cast<uint64_t>(std::ceil(share / row_bytes)));
      if (left == 0) continue;
      const double threshold = victim->EvictionThreshold(left);
      std::vector<uint64_t> ids;
      std::vector<uint64_t>* out = listener_ ? &ids : nullptr;
      // One partition per step: requests run between the steps.
      for (int k = 0; k < SparseTable::kPartitions && left > 0; ++k) {
        uint64_t n;
        {
          absl::MutexLock l(&evict_mu_);
          n = victim->EvictPartition(k, threshold, left, out);
        }
        if (n > 0) options_.release(n * row_bytes);
        left -= n;
        freed += n * row_bytes;
        evicted += n;
      }
      if (!ids.empty()) listener_(victim->spec().name(), ids, /*idle=*/false);
    }
  }
  return evicted;
}

// ---------------------------------------------------------------- checkpoints

absl::Status TableStore::Export(
    absl::FunctionRef<absl::Status(const TableSpec&)> table,
    absl::FunctionRef<absl::Status(const SparseTable::RowView&)> row) const {
  absl::ReaderMutexLock evict(&evict_mu_);
  for (const SparseTable* t : Sorted()) {
    absl::Status s = table(t->Listed());
    if (!s.ok()) return s;
    s = t->Export(row);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TableStore::ExportSince(
    uint32_t since, absl::FunctionRef<absl::Status(const TableSpec&)> table,
    absl::FunctionRef<absl::Status(absl::Span<const uint64_t>)> removed,
    absl::FunctionRef<absl::Status(const SparseTable::RowView&)> row) const {
  absl::ReaderMutexLock evict(&evict_mu_);
  std::vector<uint64_t> ids;
  for (const SparseTable* t : Sorted()) {
    absl::Status s = table(t->Listed());
    if (!s.ok()) return s;
    ids.clear();
    t->RemovedSince(since, &ids);
    s = removed(ids);
    if (!s.ok()) return s;
    s = t->Export(row, since);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void TableStore::ForgetRemovedBefore(uint32_t epoch) {
  for (SparseTable* t : Sorted()) t->ForgetRemovedBefore(epoch);
}

// ---------------------------------------------------------------- status

std::vector<TableStatus> TableStore::Status() const {
  std::vector<TableStatus> out;
  const uint64_t reserved = options_.max_bytes > 0 ? options_.reserved() : 0;
  for (const SparseTable* t : Sorted()) {
    const SparseTable::Counters c = t->counters();
    TableStatus s;
    s.set_name(t->spec().name());
    s.set_dim(t->dim());
    s.set_optimizer(t->spec().optimizer().type());
    s.set_rows(c.rows);
    const uint64_t bytes = t->fixed_bytes() + c.rows * t->row_bytes();
    s.set_bytes(bytes);
    s.set_rows_created(c.rows_created);
    s.set_rows_evicted(c.rows_evicted_idle + c.rows_evicted_cap);
    s.set_rows_evicted_idle(c.rows_evicted_idle);
    s.set_rows_evicted_cap(c.rows_evicted_cap);
    s.set_rows_admitted(c.rows_admitted);
    s.set_admission_refused(c.admission_refused);
    s.set_eviction(t->spec().eviction());
    s.set_admission(t->spec().admission());
    if (options_.max_bytes > 0) {
      const uint64_t free =
          options_.max_bytes - std::min(options_.max_bytes, reserved);
      s.set_fill_ratio(static_cast<double>(bytes) /
                       static_cast<double>(bytes + free));
    }
    s.set_pulls(c.pulls);
    s.set_pushes(c.pushes);
    s.set_rows_pulled(c.rows_pulled);
    s.set_rows_pushed(c.rows_pushed);
    out.push_back(std::move(s));
  }
  return out;
}

TableStore::Totals TableStore::totals() const {
  Totals totals;
  for (const SparseTable* t : Sorted()) {
    ++totals.tables;
    totals.rows += t->rows();
    totals.bytes += TableBytes(*t);
  }
  return totals;
}

}  // namespace asyncps
