// Export and import of a shard's dense state: whole, for checkpoints
// (Export, RestoreTensor, RestoreSlice), and by slots, for live slot moves
// (ImportSlice, CheckAdoptable, AdoptMap).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "store/lr_schedule.h"
#include "store/shard_store.h"
#include "store/shard_store_tensor.h"

namespace asyncps {

absl::Status ShardStore::Export(
    absl::FunctionRef<absl::Status(const TensorSpec&)> tensor,
    absl::FunctionRef<absl::Status(const SliceView&)> slice) const {
  // Tensors are never removed, so the pointers taken here stay valid after
  // the lock is let go; their slices are read under it (AdoptMap may drop
  // them).
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
  for (const Tensor* t : tensors) {
    absl::Status s = tensor(t->Listed());
    if (!s.ok()) return s;
    for (size_t i = 0; i < t->slices.size(); ++i) {
      absl::ReaderMutexLock l(&mu_);
      if (t->slices[i] == nullptr) continue;
      s = t->slices[i]->Read(slice);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ShardStore::RestoreTensor(const TensorSpec& listed) {
  // Slices are placed by a map that does not change meanwhile.
  absl::ReaderMutexLock change(&change_mu_);
  const Unlisted<TensorSpec> in = Unlist(listed);
  absl::StatusOr<TensorSpec> spec = Resolve(in.spec);
  if (!spec.ok()) return spec.status();
  if (in.rate.has_value()) {
    absl::Status s =
        LrSchedule(spec->optimizer()).Check(spec->name(), *in.rate);
    if (!s.ok()) return s;
  }
  {
    absl::ReaderMutexLock l(&mu_);
    if (FindTensor(spec->name()) != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", QuoteName(spec->name()), " exists already"));
    }
  }
  const uint64_t bytes = BytesOf(*spec);
  absl::Status reserved = ReserveBytes(
      bytes, absl::StrCat("tensor ", QuoteName(spec->name()), " needs"));
  if (!reserved.ok()) return reserved;
  std::unique_ptr<Tensor> t =
      BuildTensor(*spec, /*initialize=*/false, bytes, nullptr);
  if (in.rate.has_value()) t->schedule->Apply(*in.rate);
  absl::MutexLock l(&mu_);
  if (FindTensor(spec->name()) != nullptr) {
    reserved_bytes_ -= bytes;
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", QuoteName(spec->name()), " exists already"));
  }
  tensors_.emplace(spec->name(), std::move(t));
  return absl::OkStatus();
}

absl::Status ShardStore::CheckSliceState(
    const Tensor& t, uint32_t index, absl::string_view values,
    absl::Span<const absl::string_view> optimizer_state) {
  const std::string where =
      absl::StrCat("slice ", index, " of tensor ", QuoteName(t.spec.name()));
  if (index >= t.layout.num_slices()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", QuoteName(t.spec.name()), " has ", t.layout.num_slices(),
        " slices; slice ", index, " does not exist"));
  }
  const size_t bytes = t.layout.SliceSize(index) * sizeof(float);
  if (values.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " holds ", bytes, " bytes of values; got ", values.size()));
  }
  if (optimizer_state.size() != static_cast<size_t>(t.optimizer_buffers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": its optimizer keeps ", t.optimizer_buffers,
                     " state buffers; got ", optimizer_state.size()));
  }
  for (size_t i = 0; i < optimizer_state.size(); ++i) {
    if (optimizer_state[i].size() != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": optimizer state ", i, " must hold ", bytes,
                       " bytes; got ", optimizer_state[i].size()));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardStore::RestoreSlice(
    absl::string_view tensor, uint32_t index, uint64_t version,
    absl::string_view values,
    absl::Span<const absl::string_view> optimizer_state) {
  absl::ReaderMutexLock l(&mu_);
  const Tensor* t = FindTensor(tensor);
  SliceGradient g;
  g.set_tensor(std::string(tensor));
  g.set_slice(index);
  absl::StatusOr<DenseSlice*> slice = FindSlice(t, g);
  if (!slice.ok()) return absl::InvalidArgumentError(slice.status().message());
  absl::Status s = CheckSliceState(*t, index, values, optimizer_state);
  if (!s.ok()) return s;
  (*slice)->Import(version, values, optimizer_state);
  return absl::OkStatus();
}

absl::Status ShardStore::ImportSlice(
    absl::string_view tensor, uint32_t index, uint64_t version,
    absl::string_view values,
    absl::Span<const absl::string_view> optimizer_state) {
  // No AdoptMap meanwhile: the slice stays one of another shard's slots,
  // and one imported before stays where it is.
  absl::ReaderMutexLock change(&change_mu_);
  const ShardMap map = map_->get();
  Tensor* t = nullptr;
  DenseSlice* existing = nullptr;
  {
    absl::ReaderMutexLock l(&mu_);
    t = FindMutableTensor(tensor);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("unknown tensor ", QuoteName(tensor)));
    }
    absl::Status s = CheckSliceState(*t, index, values, optimizer_state);
    if (!s.ok()) return s;
    if (map.SliceHome(tensor, index) == options_.shard_index) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", index, " of tensor ", QuoteName(tensor),
                       " lives on this shard (", options_.shard_index,
                       ") under the ", map.DebugString(),
                       ": only slices of other shards' slots are "
                       "imported"));
    }
    auto it = t->incoming.find(index);
    if (it != t->incoming.end()) existing = it->second.get();
  }
  const uint32_t now = epoch_.current();
  if (existing != nullptr) {
    existing->Import(version, values, optimizer_state);
    existing->MarkChanged(now);
    return absl::OkStatus();
  }
  const uint64_t bytes = t->SliceBytes(index);
  absl::Status s =
      ReserveBytes(bytes, absl::StrCat("imported slice ", index, " of tensor ",
                                       QuoteName(tensor), " needs"));
  if (!s.ok()) return s;
  auto fresh = std::make_unique<DenseSlice>(t->spec, t->layout, index,
                                            /*initialize=*/false, nullptr);
  fresh->Import(version, values, optimizer_state);
  fresh->MarkChanged(now);
  absl::MutexLock l(&mu_);
  std::unique_ptr<DenseSlice>& slot = t->incoming[index];
  if (slot != nullptr) {
    // A concurrent import of the same slice won: this one overwrites it.
    slot->Import(version, values, optimizer_state);
    slot->MarkChanged(now);
    reserved_bytes_ -= bytes;
    return absl::OkStatus();
  }
  slot = std::move(fresh);
  t->reserved_bytes += bytes;
  return absl::OkStatus();
}

namespace {

// CheckAdoptable's rules for going from the map served, `now`, to `next`.
absl::Status CheckNextMap(const ShardMap& now, const ShardMap& next) {
  if (!next.slotted() || !now.slotted()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "only a slotted map can replace a slotted map; this shard serves the ",
        now.DebugString(), ", the map to adopt is the ", next.DebugString()));
  }
  if (next.num_slots() != now.num_slots() ||
      next.num_shards() != now.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the map to adopt (", next.DebugString(),
                     ") has another slot or shard count than the ",
                     now.DebugString(), " this shard serves"));
  }
  if (next == now) return absl::OkStatus();
  if (next.epoch() <= now.epoch()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the map to adopt has epoch ", next.epoch(),
                     ", not above the epoch ", now.epoch(),
                     " of the map this shard "
                     "serves (",
                     now.DebugString(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardStore::CheckAdoptable(const ShardMap& next) const {
  return CheckNextMap(map_->get(), next);
}

absl::Status ShardStore::AdoptMap(const ShardMap& next) {
  return AdoptMap(next, [] { return absl::OkStatus(); });
}

absl::Status ShardStore::AdoptMap(const ShardMap& next,
                                  absl::FunctionRef<absl::Status()> check) {
  return AdoptMapMaking(next, check, /*remake_lost=*/false).status();
}

absl::StatusOr<uint64_t> ShardStore::AdoptMapRemakingLost(
    const ShardMap& next) {
  return AdoptMapMaking(
      next, [] { return absl::OkStatus(); }, /*remake_lost=*/true);
}

absl::StatusOr<uint64_t> ShardStore::AdoptMapMaking(
    const ShardMap& next, absl::FunctionRef<absl::Status()> check,
    bool remake_lost) {
  absl::MutexLock change(&change_mu_);
  absl::Status checked = check();
  if (!checked.ok()) return checked;
  const ShardMap prev = map_->get();
  absl::Status s = CheckNextMap(prev, next);
  if (!s.ok()) return s;
  if (next == prev) return 0;
  uint64_t made = 0;
  {
    // Freed after the lock is let go.
    std::vector<std::unique_ptr<DenseSlice>> dropped;
    absl::MutexLock l(&mu_);
    AdoptSlices(next, &dropped);
    if (remake_lost) made = RemakeMissingSlices();
    slices_remade_ += made;
  }
  tables_->AdoptMap(prev, next);
  return made;
}

uint64_t ShardStore::RemakeMissingSlices() {
  const ShardMap map = map_->get();
  const uint32_t now = epoch_.current();
  uint64_t made = 0;
  for (auto& [name, t] : tensors_) {
    for (uint32_t i = 0; i < t->slices.size(); ++i) {
      std::unique_ptr<DenseSlice>& local = t->slices[i];
      if (local != nullptr || map.SliceHome(name, i) != options_.shard_index) {
        continue;
      }
      local = std::make_unique<DenseSlice>(t->spec, t->layout, i,
                                           /*initialize=*/true,
                                           /*given=*/nullptr);
      local->MarkChanged(now);
      const uint64_t bytes = t->SliceBytes(i);
      t->reserved_bytes += bytes;
      reserved_bytes_ += bytes;
      ++made;
    }
  }
  return made;
}

void ShardStore::AdoptSlices(
    const ShardMap& next, std::vector<std::unique_ptr<DenseSlice>>* dropped) {
  map_->Set(next);
  const uint32_t now = epoch_.current();
  for (auto& [name, t] : tensors_) {
    for (uint32_t i = 0; i < t->slices.size(); ++i) {
      std::unique_ptr<DenseSlice>& local = t->slices[i];
      const bool mine = next.SliceHome(name, i) == options_.shard_index;
      if (local != nullptr && !mine) {
        const uint64_t bytes = t->SliceBytes(i);
        t->reserved_bytes -= bytes;
        reserved_bytes_ -= bytes;
        dropped->push_back(std::move(local));
      } else if (local == nullptr && mine) {
        auto it = t->incoming.find(i);
        if (it == t->incoming.end()) continue;
        local = std::move(it->second);
        t->incoming.erase(it);
        local->MarkChanged(now);
      }
    }
  }
}

std::pair<uint64_t, uint64_t> ShardStore::DropImports() {
  absl::MutexLock change(&change_mu_);
  const ShardMap now = map_->get();
  uint64_t slices = 0;
  {
    // Freed after the lock is let go.
    std::vector<std::unique_ptr<DenseSlice>> dropped;
    absl::MutexLock l(&mu_);
    for (auto& [name, t] : tensors_) {
      for (auto& [index, slice] : t->incoming) {
        const uint64_t bytes = t->SliceBytes(index);
        t->reserved_bytes -= bytes;
        reserved_bytes_ -= bytes;
        dropped.push_back(std::move(slice));
      }
      t->incoming.clear();
    }
    slices = dropped.size();
  }
  if (!now.slotted()) return {slices, 0};
  // The rows held here that the map served homes elsewhere are imported
  // ones: dropped as a change from a map giving this shard every slot.
  const std::vector<uint16_t> all(static_cast<size_t>(now.num_slots()),
                                  static_cast<uint16_t>(options_.shard_index));
  const absl::StatusOr<ShardMap> everything =
      ShardMap::Slotted(now.num_shards(), all, now.epoch());
  return {slices, tables_->AdoptMap(*everything, now)};
}

}  // namespace asyncps
