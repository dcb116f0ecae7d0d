#include "store/sparse_table.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "common/stable_hash.h"

namespace asyncps {

// kChunkRows rows: their values and state (stride floats each), ids,
// versions, what each use of a row writes, and duplicate tags.
struct SparseTable::Chunk {
  // What a use (pull or push) of a row writes, side by side so that a use
  // touches one cache line for all of it. Written by pulls under a shared
  // lock, hence atomic (relaxed: a clock that is a little behind only
  // delays an eviction).
  struct Use {
    std::atomic<int64_t> touched;  // the clock of the last use
    // EVICT_LFU: the use count at the last use (store/row_eviction.h).
    std::atomic<float> count;
    // The ChangeEpoch of the row's creation or last use.
    std::atomic<uint32_t> changed;
  };
  explicit Chunk(size_t stride) : data(new float[kChunkRows * stride]) {}
  std::unique_ptr<float[]> data;
  uint64_t ids[kChunkRows];
  uint64_t versions[kChunkRows];
  Use use[kChunkRows];
  // (request serial << 32 | position) of the last push that touched the
  // row: finds duplicate ids within one push.
  uint64_t tags[kChunkRows];
  // Whether the row holds an id (false once evicted or removed, until
  // reused): eviction scans the chunks in row order, not the index.
  bool live[kChunkRows];
};

namespace {

constexpr uint32_t kInitialSlots = 16;
// Salts the hash of the partition and slot from that of the home shard, so
// that the rows of one shard spread over all partitions and slots.
constexpr uint64_t kLocalSalt = 0x5bd1e9955bd1e995ull;

uint64_t LocalHash(uint64_t id) { return Mix64(id ^ kLocalSalt); }

}  // namespace

absl::Status SparseTable::ValidateSpec(const TableSpec& spec) {
  absl::Status s = CheckName("table name", spec.name());
  if (!s.ok()) return s;
  if (spec.dim() < 1 || spec.dim() > kMaxTableDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", QuoteName(spec.name()), ": dim must be in [1, ",
                     kMaxTableDim, "], got ", spec.dim()));
  }
  s = ValidateRowInitializer(spec);
  if (!s.ok()) return s;
  s = ValidateOptimizer(spec.optimizer());
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", QuoteName(spec.name()), ": ", s.message()));
  }
  s = AdmissionRule::Validate(spec);
  if (!s.ok()) return s;
  return EvictionRule::Validate(spec);
}

SparseTable::SparseTable(const TableSpec& spec, int shard_index,
                         std::shared_ptr<const ServedMap> map,
                         const ChangeEpoch* epoch, bool track_removed)
    : spec_(spec),
      dim_(spec.dim()),
      shard_index_(shard_index),
      map_(std::move(map)),
      table_key_(ShardMap::KeyOf(spec.name())),
      init_(spec),
      updater_(spec.optimizer(), spec.dim()),
      schedule_(spec.optimizer()),
      stride_(static_cast<size_t>(dim_) + updater_.state_floats()),
      row_bytes_(stride_ * sizeof(float) + kRowOverheadBytes),
      admission_(spec),
      eviction_(spec),
      fixed_bytes_(kTableOverheadBytes + admission_.SketchBytes(kPartitions)),
      epoch_(epoch),
      track_removed_(track_removed && epoch != nullptr),
      partitions_(new Partition[kPartitions]) {
  for (int k = 0; k < kPartitions; ++k) {
    Partition& p = partitions_[k];
    absl::MutexLock l(&p.mu);
    p.slots.assign(kInitialSlots, Slot{0, 0});
    if (admission_.enabled()) {
      p.sketch = std::make_unique<CountMinSketch>(admission_.sketch_width(),
                                                  spec.seed() + k);
    }
  }
}

SparseTable::~SparseTable() = default;

int SparseTable::PartitionOf(uint64_t id) {
  return static_cast<int>(LocalHash(id) >> (64 - kPartitionBits));
}

absl::Status SparseTable::CheckIds(absl::Span<const uint64_t> ids,
                                   int64_t max_ids) const {
  if (ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", QuoteName(spec_.name()), ": no row ids"));
  }
  if (static_cast<int64_t>(ids.size()) > max_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", QuoteName(spec_.name()), ": ", ids.size(),
                     " row ids in one request; at most ", max_ids));
  }
  const ShardMap map = map_->get();
  for (uint64_t id : ids) {
    const int home = map.RowHome(table_key_, id);
    if (home != shard_index_) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", id, " of table ", QuoteName(spec_.name()),
                       " lives on shard ", home, ", not ", shard_index_));
    }
  }
  return absl::OkStatus();
}

uint32_t SparseTable::Lookup(const Partition& p, uint64_t id) {
  const size_t mask = p.slots.size() - 1;
  for (size_t i = LocalHash(id) & mask;; i = (i + 1) & mask) {
    const Slot& s = p.slots[i];
    if (s.row1 == 0) return Batch::kNoRow;
    if (s.id == id) return s.row1 - 1;
  }
}

void SparseTable::InsertSlot(Partition& p, uint64_t id, uint32_t row) {
  if ((static_cast<uint64_t>(p.used) + 1) * 10 > p.slots.size() * 7) {
    std::vector<Slot> old(p.slots.size() * 2, Slot{0, 0});
    old.swap(p.slots);
    const size_t mask = p.slots.size() - 1;
    for (const Slot& s : old) {
      if (s.row1 == 0) continue;
      size_t i = LocalHash(s.id) & mask;
      while (p.slots[i].row1 != 0) i = (i + 1) & mask;
      p.slots[i] = s;
    }
  }
  const size_t mask = p.slots.size() - 1;
  size_t i = LocalHash(id) & mask;
  while (p.slots[i].row1 != 0) i = (i + 1) & mask;
  p.slots[i] = Slot{id, row + 1};
  ++p.used;
}

void SparseTable::EraseSlot(Partition& p, uint64_t id) {
  const size_t mask = p.slots.size() - 1;
  size_t hole = LocalHash(id) & mask;
  while (p.slots[hole].id != id || p.slots[hole].row1 == 0) {
    hole = (hole + 1) & mask;
  }
  // Backward shift: move later entries of the probe run into the hole when
  // their home slot is not between the hole and where they are.
  for (size_t j = (hole + 1) & mask; p.slots[j].row1 != 0; j = (j + 1) & mask) {
    const size_t home = LocalHash(p.slots[j].id) & mask;
    const bool stays =
        hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    p.slots[hole] = p.slots[j];
    hole = j;
  }
  p.slots[hole] = Slot{0, 0};
  --p.used;
}

float* SparseTable::RowData(const Partition& p, uint32_t row) const {
  return p.chunks[row >> kChunkShift]->data.get() +
         static_cast<size_t>(row & (kChunkRows - 1)) * stride_;
}

void SparseTable::Touch(const Partition& p, uint32_t row, int64_t clock,
                        uint32_t now) const {
  Chunk& c = *p.chunks[row >> kChunkShift];
  const uint32_t at = row & (kChunkRows - 1);
  std::atomic<int64_t>& t = c.use[at].touched;
  const int64_t last = t.load(std::memory_order_relaxed);
  if (eviction_.counts_uses()) {
    // Racy under a shared lock (a concurrent use may be lost): a count.
    c.use[at].count.store(
        eviction_.CountAfterUse(c.use[at].count.load(std::memory_order_relaxed),
                                last, clock),
        std::memory_order_relaxed);
  }
  if (last < clock) t.store(clock, std::memory_order_relaxed);
  Stamp(p, row, now);
  if (latest_clock_.load(std::memory_order_relaxed) < clock) {
    latest_clock_.store(clock, std::memory_order_relaxed);
  }
}

uint32_t SparseTable::Now() const {
  return epoch_ == nullptr ? 0 : epoch_->current();
}

void SparseTable::Stamp(const Partition& p, uint32_t row, uint32_t now) const {
  if (now == 0) return;
  std::atomic<uint32_t>& changed =
      p.chunks[row >> kChunkShift]->use[row & (kChunkRows - 1)].changed;
  // Read first: a row used again within an epoch is not written.
  if (changed.load(std::memory_order_relaxed) != now) {
    changed.store(now, std::memory_order_relaxed);
  }
}

uint32_t SparseTable::FindOrCreate(Partition& p, uint64_t id, int64_t clock,
                                   bool initialize, bool* created) {
  *created = false;
  const uint32_t found = Lookup(p, id);
  if (found != Batch::kNoRow) return found;
  uint32_t row;
  if (!p.free_rows.empty()) {
    row = p.free_rows.back();
    p.free_rows.pop_back();
  } else {
    row = p.next_row++;
    if ((row >> kChunkShift) >= p.chunks.size()) {
      p.chunks.push_back(std::make_unique<Chunk>(stride_));
    }
  }
  Chunk& c = *p.chunks[row >> kChunkShift];
  const uint32_t at = row & (kChunkRows - 1);
  c.ids[at] = id;
  c.versions[at] = 0;
  c.use[at].touched.store(clock, std::memory_order_relaxed);
  c.use[at].count.store(0.0f, std::memory_order_relaxed);
  c.tags[at] = 0;
  c.live[at] = true;
  c.use[at].changed.store(epoch_ == nullptr ? 0 : epoch_->current(),
                          std::memory_order_relaxed);
  if (initialize) {
    float* data = RowData(p, row);
    init_.Fill(id, data);
    updater_.InitState(data + dim_);
  }
  InsertSlot(p, id, row);
  rows_.fetch_add(1, std::memory_order_relaxed);
  *created = true;
  return row;
}

void SparseTable::Find(absl::Span<const uint64_t> ids, Batch* batch,
                       uint64_t* versions) const {
  const size_t n = ids.size();
  // Counting sort of the positions by partition.
  std::array<uint32_t, kPartitions + 1> count{};
  std::vector<uint8_t> part(n);
  for (size_t i = 0; i < n; ++i) {
    part[i] = static_cast<uint8_t>(PartitionOf(ids[i]));
    ++count[part[i] + 1];
  }
  for (int k = 0; k < kPartitions; ++k) count[k + 1] += count[k];
  batch->begin = count;
  batch->order.resize(n);
  for (size_t i = 0; i < n; ++i) {
    batch->order[count[part[i]]++] = static_cast<uint32_t>(i);
  }
  batch->rows.assign(n, Batch::kNoRow);
  batch->missing = 0;
  for (int k = 0; k < kPartitions; ++k) {
    if (batch->begin[k] == batch->begin[k + 1]) continue;
    const Partition& p = partitions_[k];
    absl::ReaderMutexLock l(&p.mu);
    for (uint32_t j = batch->begin[k]; j < batch->begin[k + 1]; ++j) {
      const uint32_t pos = batch->order[j];
      const uint32_t row = Lookup(p, ids[pos]);
      batch->rows[pos] = row;
      if (row == Batch::kNoRow) {
        ++batch->missing;
        if (versions != nullptr) versions[pos] = 0;
      } else if (versions != nullptr) {
        versions[pos] =
            p.chunks[row >> kChunkShift]->versions[row & (kChunkRows - 1)];
      }
    }
  }
}

uint64_t SparseTable::CreateMissing(Partition& p, int k,
                                    absl::Span<const uint64_t> ids,
                                    Batch* batch, int64_t clock, bool admit,
                                    uint64_t* budget, uint64_t* refused) {
  admit = admit && admission_.enabled();
  uint64_t created = 0;
  // With admission: the ids refused by this push (counted once each).
  std::vector<uint64_t> counted;
  for (uint32_t j = batch->begin[k]; j < batch->begin[k + 1]; ++j) {
    const uint32_t pos = batch->order[j];
    if (batch->rows[pos] != Batch::kNoRow) continue;
    const uint64_t id = ids[pos];
    if (admit) {
      const uint32_t row = Lookup(p, id);  // an earlier duplicate's
      if (row != Batch::kNoRow) {
        batch->rows[pos] = row;
        continue;
      }
      if (std::find(counted.begin(), counted.end(), id) != counted.end()) {
        continue;
      }
      if (!admission_.Admits(id, p.sketch->Add(id)) || *budget == 0) {
        counted.push_back(id);
        continue;
      }
    }
    bool fresh = false;
    batch->rows[pos] = FindOrCreate(p, id, clock, true, &fresh);
    created += fresh;
    if (*budget > 0) --*budget;
  }
  created_.fetch_add(created, std::memory_order_relaxed);
  if (admit) {
    admitted_.fetch_add(created, std::memory_order_relaxed);
    admission_refused_.fetch_add(counted.size(), std::memory_order_relaxed);
    *refused += counted.size();
  }
  return created;
}

uint64_t SparseTable::Admissible(absl::Span<const uint64_t> ids,
                                 Batch* batch) const {
  if (!admission_.enabled()) return batch->may_create = batch->missing;
  uint64_t admissible = 0;
  std::vector<uint64_t> seen;
  for (int k = 0; k < kPartitions; ++k) {
    if (batch->begin[k] == batch->begin[k + 1]) continue;
    const Partition& p = partitions_[k];
    absl::ReaderMutexLock l(&p.mu);
    seen.clear();
    for (uint32_t j = batch->begin[k]; j < batch->begin[k + 1]; ++j) {
      const uint32_t pos = batch->order[j];
      if (batch->rows[pos] != Batch::kNoRow) continue;
      const uint64_t id = ids[pos];
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
      seen.push_back(id);
      admissible += admission_.Admits(id, p.sketch->Estimate(id) + 1);
    }
  }
  return batch->may_create = admissible;
}

void SparseTable::CopyOut(const Partition& p, int k,
                          absl::Span<const uint64_t> ids, const Batch& batch,
                          int64_t clock, bool touch, WireDtype dtype, char* out,
                          uint64_t* versions) const {
  const size_t row_wire = static_cast<size_t>(dim_) * WireBytes(dtype);
  const uint32_t now = Now();
  std::vector<float> initial;
  for (uint32_t j = batch.begin[k]; j < batch.begin[k + 1]; ++j) {
    const uint32_t pos = batch.order[j];
    const uint32_t row = batch.rows[pos];
    const float* data;
    if (row == Batch::kNoRow) {  // a peek at a row that does not exist
      initial.resize(dim_);
      init_.Fill(ids[pos], initial.data());
      data = initial.data();
      versions[pos] = 0;
    } else {
      data = RowData(p, row);
      versions[pos] =
          p.chunks[row >> kChunkShift]->versions[row & (kChunkRows - 1)];
      if (touch) Touch(p, row, clock, now);
    }
    char* dst = out + pos * row_wire;
    if (dtype == WIRE_BF16) {
      EncodeBf16(data, dim_, dst);
    } else {
      std::memcpy(dst, data, row_wire);
    }
  }
}

uint64_t SparseTable::Read(absl::Span<const uint64_t> ids, Batch* batch,
                           int64_t clock, WireDtype dtype, char* out,
                           uint64_t* versions) {
  uint64_t created = 0;
  for (int k = 0; k < kPartitions; ++k) {
    const uint32_t begin = batch->begin[k], end = batch->begin[k + 1];
    if (begin == end) continue;
    Partition& p = partitions_[k];
    bool missing = false;
    for (uint32_t j = begin; j < end && !missing; ++j) {
      missing = batch->rows[batch->order[j]] == Batch::kNoRow;
    }
    // Rows are created under the exclusive lock; reading takes the shared
    // one. With admission, pulls create nothing.
    if (missing && admission_.enabled()) {
      absl::ReaderMutexLock l(&p.mu);
      CopyOut(p, k, ids, *batch, clock, true, dtype, out, versions);
    } else if (missing) {
      absl::MutexLock l(&p.mu);
      uint64_t budget = ~uint64_t{0}, refused = 0;
      created +=
          CreateMissing(p, k, ids, batch, clock, false, &budget, &refused);
      CopyOut(p, k, ids, *batch, clock, true, dtype, out, versions);
    } else {
      absl::ReaderMutexLock l(&p.mu);
      CopyOut(p, k, ids, *batch, clock, true, dtype, out, versions);
    }
  }
  CountPull(ids.size());
  return created;
}

void SparseTable::Peek(absl::Span<const uint64_t> ids, const Batch& batch,
                       WireDtype dtype, char* out, uint64_t* versions) const {
  for (int k = 0; k < kPartitions; ++k) {
    if (batch.begin[k] == batch.begin[k + 1]) continue;
    const Partition& p = partitions_[k];
    absl::ReaderMutexLock l(&p.mu);
    CopyOut(p, k, ids, batch, 0, false, dtype, out, versions);
  }
  pulls_.fetch_add(1, std::memory_order_relaxed);
  rows_pulled_.fetch_add(ids.size(), std::memory_order_relaxed);
}

template <typename Visit>
void SparseTable::ForEachPartitionCreating(absl::Span<const uint64_t> ids,
                                           Batch* batch, int64_t clock,
                                           bool admit, PushCounts* counts,
                                           Visit visit) {
  uint64_t budget = admit ? batch->may_create : ~uint64_t{0};
  for (int k = 0; k < kPartitions; ++k) {
    const uint32_t begin = batch->begin[k], end = batch->begin[k + 1];
    if (begin == end) continue;
    Partition& p = partitions_[k];
    absl::MutexLock l(&p.mu);
    counts->created += CreateMissing(p, k, ids, batch, clock, admit, &budget,
                                     &counts->refused_admission);
    visit(p, begin, end);
  }
}

SparseTable::PushCounts SparseTable::Assign(absl::Span<const uint64_t> ids,
                                            Batch* batch, const float* values,
                                            int64_t clock) {
  PushCounts counts;
  ForEachPartitionCreating(
      ids, batch, clock, /*admit=*/false, &counts,
      [&](Partition& p, uint32_t begin, uint32_t end) {
        p.mu.AssertHeld();  // by ForEachPartitionCreating
        // Read under p's lock: see Stamp.
        const uint32_t now = Now();
        for (uint32_t j = begin; j < end; ++j) {
          const uint32_t pos = batch->order[j];
          const uint32_t row = batch->rows[pos];
          Touch(p, row, clock, now);
          std::copy_n(values + static_cast<size_t>(pos) * dim_, dim_,
                      RowData(p, row));
          ++p.chunks[row >> kChunkShift]->versions[row & (kChunkRows - 1)];
          ++counts.applied;
        }
      });
  pushes_.fetch_add(1, std::memory_order_relaxed);
  rows_pushed_.fetch_add(counts.applied, std::memory_order_relaxed);
  return counts;
}

TableSpec SparseTable::Listed() const {
  TableSpec out = spec_;
  schedule_.Annotate(out.mutable_optimizer());
  return out;
}

SparseTable::PushCounts SparseTable::Apply(
    absl::Span<const uint64_t> ids, Batch* batch,
    absl::Span<const uint64_t> read_versions, float* grads,
    const StalenessRule& rule, int64_t clock) {
  PushCounts counts;
  const float lr_factor = schedule_.factor();
  // The oldest read version of each distinct row (duplicates take the
  // minimum), kept per position of its first occurrence.
  std::vector<uint64_t> read(ids.size(), 0);
  if (!read_versions.empty()) {
    std::copy(read_versions.begin(), read_versions.end(), read.begin());
  }
  constexpr uint32_t kMerged = Batch::kNoRow - 1;
  ForEachPartitionCreating(
      ids, batch, clock, /*admit=*/true, &counts,
      [&](Partition& p, uint32_t begin, uint32_t end) {
        p.mu.AssertHeld();  // by ForEachPartitionCreating
        // Read under p's lock: see Stamp.
        const uint32_t now = Now();
        // Duplicates: the first position of a row collects the others'
        // gradients. Tags name (this request, first position).
        if (++p.serial == 0) {
          for (auto& c : p.chunks)
            std::fill(std::begin(c->tags), std::end(c->tags), 0);
          p.serial = 1;
        }
        const uint64_t serial = static_cast<uint64_t>(p.serial) << 32;
        for (uint32_t j = begin; j < end; ++j) {
          const uint32_t pos = batch->order[j];
          const uint32_t row = batch->rows[pos];
          if (row == Batch::kNoRow) continue;  // not admitted
          uint64_t& tag =
              p.chunks[row >> kChunkShift]->tags[row & (kChunkRows - 1)];
          if ((tag & ~uint64_t{0xffffffff}) != serial) {
            tag = serial | pos;
            continue;
          }
          const uint32_t first = static_cast<uint32_t>(tag);
          float* into = grads + static_cast<size_t>(first) * dim_;
          const float* from = grads + static_cast<size_t>(pos) * dim_;
          for (int d = 0; d < dim_; ++d) into[d] += from[d];
          read[first] = std::min(read[first], read[pos]);
          batch->rows[pos] = kMerged;
        }
        for (uint32_t j = begin; j < end; ++j) {
          const uint32_t pos = batch->order[j];
          const uint32_t row = batch->rows[pos];
          if (row == kMerged || row == Batch::kNoRow) continue;
          Chunk& c = *p.chunks[row >> kChunkShift];
          const uint32_t at = row & (kChunkRows - 1);
          Touch(p, row, clock, now);
          uint64_t& version = c.versions[at];
          if (read[pos] > version) {
            ++counts.refused_restored;
            continue;
          }
          const uint64_t staleness = version - read[pos];
          counts.staleness_sum += staleness;
          counts.max_staleness = std::max(counts.max_staleness, staleness);
          if (rule.Refuses(staleness)) {
            ++counts.refused_stale;
            continue;
          }
          const float scale = rule.LrScale(staleness);
          float* data = RowData(p, row);
          ++version;
          updater_.Apply(data, data + dim_,
                         grads + static_cast<size_t>(pos) * dim_,
                         scale * lr_factor, version);
          ++counts.applied;
          counts.scaled += scale < 1.0f;
        }
      });
  pushes_.fetch_add(1, std::memory_order_relaxed);
  rows_pushed_.fetch_add(
      counts.applied + counts.refused_stale + counts.refused_restored,
      std::memory_order_relaxed);
  return counts;
}

uint64_t SparseTable::EvictBefore(int64_t clock, std::vector<uint64_t>* ids) {
  uint64_t evicted = 0;
  std::vector<uint64_t> idle;
  for (int k = 0; k < kPartitions; ++k) {
    Partition& p = partitions_[k];
    absl::MutexLock l(&p.mu);
    idle.clear();
    for (const Slot& s : p.slots) {
      if (s.row1 == 0) continue;
      const uint32_t row = s.row1 - 1;
      const Chunk& c = *p.chunks[row >> kChunkShift];
      if (c.use[row & (kChunkRows - 1)].touched.load(
              std::memory_order_relaxed) < clock) {
        idle.push_back(s.id);
      }
    }
    for (uint64_t id : idle) EraseRow(p, id);
    evicted += idle.size();
    if (ids != nullptr) ids->insert(ids->end(), idle.begin(), idle.end());
  }
  evicted_idle_.fetch_add(evicted, std::memory_order_relaxed);
  return evicted;
}

uint64_t SparseTable::EvictIds(absl::Span<const uint64_t> ids, bool idle) {
  uint64_t evicted = 0;
  for (uint64_t id : ids) {
    Partition& p = partitions_[PartitionOf(id)];
    absl::MutexLock l(&p.mu);
    if (Lookup(p, id) == Batch::kNoRow) continue;
    EraseRow(p, id);
    ++evicted;
  }
  (idle ? evicted_idle_ : evicted_cap_)
      .fetch_add(evicted, std::memory_order_relaxed);
  return evicted;
}

void SparseTable::EraseRow(Partition& p, uint64_t id) {
  if (track_removed_) p.removed.emplace_back(id, epoch_->current());
  FreeRow(p, Lookup(p, id));
  EraseSlot(p, id);
  rows_.fetch_sub(1, std::memory_order_relaxed);
}

void SparseTable::FreeRow(Partition& p, uint32_t row) {
  p.chunks[row >> kChunkShift]->live[row & (kChunkRows - 1)] = false;
  p.free_rows.push_back(row);
}

double SparseTable::ScoreOf(const Partition& p, uint32_t row,
                            int64_t now) const {
  const Chunk& c = *p.chunks[row >> kChunkShift];
  const uint32_t at = row & (kChunkRows - 1);
  return eviction_.Score(c.use[at].touched.load(std::memory_order_relaxed),
                         c.use[at].count.load(std::memory_order_relaxed), now);
}

double SparseTable::EvictionThreshold(uint64_t rows) const {
  constexpr size_t kSamplesPerPartition = 4096;
  const int64_t now = latest_clock_.load(std::memory_order_relaxed);
  std::vector<double> samples;
  uint64_t held = 0;
  for (int k = 0; k < kPartitions; ++k) {
    const Partition& p = partitions_[k];
    absl::ReaderMutexLock l(&p.mu);
    held += p.used;
    // Every stride-th row, in row order (sequential reads of the chunks):
    // an even sample of the partition's rows.
    const uint32_t stride =
        std::max<uint32_t>(1, p.used / kSamplesPerPartition);
    for (uint32_t row = 0; row < p.next_row; row += stride) {
      if (p.chunks[row >> kChunkShift]->live[row & (kChunkRows - 1)]) {
        samples.push_back(ScoreOf(p, row, now));
      }
    }
  }
  if (samples.empty() || held == 0) return -1;
  return ScoreQuantile(&samples, static_cast<double>(rows) / held);
}

uint64_t SparseTable::EvictPartition(int k, double threshold, uint64_t quota,
                                     std::vector<uint64_t>* ids) {
  const int64_t now = latest_clock_.load(std::memory_order_relaxed);
  Partition& p = partitions_[k];
  absl::MutexLock l(&p.mu);
  std::vector<uint64_t> cold;
  // In row order: the chunks are read sequentially (the index would visit
  // them at random).
  for (uint32_t row = 0; row < p.next_row && cold.size() < quota; ++row) {
    const Chunk& c = *p.chunks[row >> kChunkShift];
    const uint32_t at = row & (kChunkRows - 1);
    if (c.live[at] && ScoreOf(p, row, now) <= threshold) {
      cold.push_back(c.ids[at]);
    }
  }
  for (uint64_t id : cold) EraseRow(p, id);
  evicted_cap_.fetch_add(cold.size(), std::memory_order_relaxed);
  if (ids != nullptr) ids->insert(ids->end(), cold.begin(), cold.end());
  return cold.size();
}

absl::Status SparseTable::Export(
    absl::FunctionRef<absl::Status(const RowView&)> visit,
    uint32_t since) const {
  // Only a slotted map can hold imported rows of a move in progress.
  const ShardMap map = map_->get();
  for (int k = 0; k < kPartitions; ++k) {
    const Partition& p = partitions_[k];
    absl::ReaderMutexLock l(&p.mu);
    for (const Slot& s : p.slots) {
      if (s.row1 == 0) continue;
      const uint32_t row = s.row1 - 1;
      const Chunk& c = *p.chunks[row >> kChunkShift];
      const uint32_t at = row & (kChunkRows - 1);
      if (since > 0 &&
          c.use[at].changed.load(std::memory_order_relaxed) < since) {
        continue;
      }
      if (map.slotted() && map.RowHome(table_key_, s.id) != shard_index_) {
        continue;
      }
      RowView v;
      v.dim = dim_;
      v.state_floats = updater_.state_floats();
      v.id = s.id;
      v.version = c.versions[at];
      v.touched = c.use[at].touched.load(std::memory_order_relaxed);
      v.values = RowData(p, row);
      v.state = v.values + dim_;
      absl::Status st = visit(v);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

void SparseTable::RemovedSince(uint32_t since,
                               std::vector<uint64_t>* ids) const {
  for (int k = 0; k < kPartitions; ++k) {
    const Partition& p = partitions_[k];
    absl::ReaderMutexLock l(&p.mu);
    for (const auto& [id, epoch] : p.removed) {
      if (epoch >= since) ids->push_back(id);
    }
  }
}

void SparseTable::ForgetRemovedBefore(uint32_t epoch) {
  for (int k = 0; k < kPartitions; ++k) {
    Partition& p = partitions_[k];
    absl::MutexLock l(&p.mu);
    p.removed.erase(
        std::remove_if(p.removed.begin(), p.removed.end(),
                       [epoch](const std::pair<uint64_t, uint32_t>& r) {
                         return r.second < epoch;
                       }),
        p.removed.end());
  }
}

bool SparseTable::Contains(uint64_t id) const {
  const Partition& p = partitions_[PartitionOf(id)];
  absl::ReaderMutexLock l(&p.mu);
  return Lookup(p, id) != Batch::kNoRow;
}

bool SparseTable::Remove(uint64_t id) {
  Partition& p = partitions_[PartitionOf(id)];
  absl::MutexLock l(&p.mu);
  const uint32_t row = Lookup(p, id);
  if (row == Batch::kNoRow) return false;
  FreeRow(p, row);
  EraseSlot(p, id);
  rows_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

absl::Status SparseTable::Restore(uint64_t id, uint64_t version,
                                  int64_t touched, const float* values,
                                  const float* state, bool replace,
                                  bool* created) {
  const int home = map_->get().RowHome(table_key_, id);
  if (home != shard_index_) {
    return absl::InvalidArgumentError(
        absl::StrCat("row ", id, " of table ", QuoteName(spec_.name()),
                     " lives on shard ", home, ", not ", shard_index_));
  }
  return Put(id, version, touched, values, state, replace, created);
}

absl::Status SparseTable::Put(uint64_t id, uint64_t version, int64_t touched,
                              const float* values, const float* state,
                              bool replace, bool* created) {
  Partition& p = partitions_[PartitionOf(id)];
  absl::MutexLock l(&p.mu);
  if (!replace && Lookup(p, id) != Batch::kNoRow) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row ", id, " of table ", QuoteName(spec_.name()), " appears twice"));
  }
  bool fresh = false;
  const uint32_t row = FindOrCreate(p, id, touched, false, &fresh);
  if (created != nullptr) *created = fresh;
  float* data = RowData(p, row);
  std::memcpy(data, values, dim_ * sizeof(float));
  std::memcpy(data + dim_, state, updater_.state_floats() * sizeof(float));
  Chunk& c = *p.chunks[row >> kChunkShift];
  c.versions[row & (kChunkRows - 1)] = version;
  c.use[row & (kChunkRows - 1)].touched.store(touched,
                                              std::memory_order_relaxed);
  Stamp(p, row, Now());
  return absl::OkStatus();
}

bool SparseTable::Peek(uint64_t id, float* values, uint64_t* version) const {
  const Partition& p = partitions_[PartitionOf(id)];
  absl::ReaderMutexLock l(&p.mu);
  const uint32_t row = Lookup(p, id);
  if (row == Batch::kNoRow) return false;
  std::memcpy(values, RowData(p, row), dim_ * sizeof(float));
  *version = p.chunks[row >> kChunkShift]->versions[row & (kChunkRows - 1)];
  return true;
}

SparseTable::Counters SparseTable::counters() const {
  Counters c;
  c.rows = rows_.load(std::memory_order_relaxed);
  c.rows_created = created_.load(std::memory_order_relaxed);
  c.rows_evicted_idle = evicted_idle_.load(std::memory_order_relaxed);
  c.rows_evicted_cap = evicted_cap_.load(std::memory_order_relaxed);
  c.rows_admitted = admitted_.load(std::memory_order_relaxed);
  c.admission_refused = admission_refused_.load(std::memory_order_relaxed);
  c.pulls = pulls_.load(std::memory_order_relaxed);
  c.pushes = pushes_.load(std::memory_order_relaxed);
  c.rows_pulled = rows_pulled_.load(std::memory_order_relaxed);
  c.rows_pushed = rows_pushed_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace asyncps
