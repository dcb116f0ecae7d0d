#include "server/slot_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/tensor_layout.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/checkpoint_records.h"
#include "store/lr_schedule.h"

namespace asyncps {

absl::StatusOr<SlotSet> SlotSet::Of(const ShardMap& map,
                                    absl::Span<const uint32_t> slots) {
  if (!map.slotted()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a set of slots needs a slotted map; got the ", map.DebugString()));
  }
  std::vector<bool> in(map.num_slots(), false);
  int size = 0;
  for (uint32_t slot : slots) {
    if (slot >= in.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", slot, " is not below the ", map.num_slots(),
                       " slots of the ", map.DebugString()));
    }
    if (!in[slot]) ++size;
    in[slot] = true;
  }
  return SlotSet(map, std::move(in), size);
}

absl::StatusOr<SlotCapture> CaptureSlots(ShardStore* store,
                                         const SlotSet& slots, uint32_t since) {
  const ShardMap map = store->map();
  if (!map.slotted() || map.num_slots() != slots.num_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a set of ", slots.num_slots(),
                     " slots does not fit this shard's ", map.DebugString()));
  }
  SlotCapture out;
  // Before reading: what changes from now on is stamped next_since or
  // later, so the next round holds what this one may miss.
  out.next_since = store->AdvanceChangeEpoch();
  RecordScope scope;
  scope.since = since;
  scope.slice = [&slots](const std::string& tensor, uint32_t index) {
    return slots.HasSlice(tensor, index);
  };
  // Rows come table by table: the table's key is hashed once.
  std::string keyed;
  ShardMap::TableKey key;
  scope.row = [&](const std::string& table, uint64_t id) {
    if (table != keyed) {
      keyed = table;
      key = ShardMap::KeyOf(table);
    }
    return slots.HasRow(key, id);
  };
  auto add = [&out](const CheckpointRecord& r) {
    out.records.push_back(r.SerializeAsString());
    out.bytes += out.records.back().size();
    if (r.has_slice()) ++out.slices;
    if (r.has_rows()) out.rows += r.rows().ids_size();
    if (r.has_removed()) out.removed_rows += r.removed().ids_size();
  };
  CaptureTensorRecords(*store, scope, add);
  CaptureTableRecords(store->tables(), scope, add);
  return out;
}

namespace {

// Whether two listed specs are the same apart from their schedules (a
// learning-rate change may reach the shards at different times).
template <typename Spec>
bool SameSpec(const Spec& a, const Spec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(Unlist(a).spec,
                                                            Unlist(b).spec);
}

}  // namespace

SlotStateApplier::SlotStateApplier(ShardStore* store, const SlotSet* slots)
    : store_(store), slots_(slots) {}

absl::Status SlotStateApplier::Apply(absl::string_view bytes) {
  const int64_t n = n_++;
  CheckpointRecord record;
  if (!record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot record ", n, " (", bytes.size(),
                     " bytes) is not a CheckpointRecord"));
  }
  switch (record.record_case()) {
    case CheckpointRecord::kTensor:
      last_spec_.assign(bytes.data(), bytes.size());
      return StartTensor(record.tensor());
    case CheckpointRecord::kSlice:
      return AddSlice(record.slice());
    case CheckpointRecord::kTable:
      last_spec_.assign(bytes.data(), bytes.size());
      return StartTable(record.table());
    case CheckpointRecord::kRows:
      return AddRows(record.rows());
    case CheckpointRecord::kRemoved:
      return RemoveRows(record.removed());
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("slot record ", n, " is of kind ",
                       static_cast<int>(record.record_case()),
                       ", which a slot move does not carry"));
  }
}

absl::Status SlotStateApplier::StartTensor(const TensorSpec& spec) {
  tensor_.clear();
  table_.clear();
  ++stats_.tensors;
  stats_.tensor_names.push_back(spec.name());
  for (const TensorSpec& here : store_->ListTensors()) {
    if (here.name() != spec.name()) continue;
    if (!SameSpec(here, spec)) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", QuoteName(spec.name()),
                       " of the moved slots has another spec on the shard "
                       "they leave than on this one"));
    }
    absl::Status s =
        FollowSchedule(spec.name(), here.optimizer(), spec.optimizer());
    if (!s.ok()) return s;
    tensor_ = spec.name();
    return absl::OkStatus();
  }
  absl::Status s = CreateTensor(spec);
  if (!s.ok()) return s;
  tensor_ = spec.name();
  return absl::OkStatus();
}

absl::Status SlotStateApplier::CreateTensor(const TensorSpec& spec) {
  // A shard that never saw CreateTensor (a standby started after it) gets
  // the tensor from the record. Only one that serves none of its slices:
  // restored slices start at zero, which is right for slices that are all
  // imported and wrong for ones this shard would serve at once.
  absl::StatusOr<TensorLayout> layout = TensorLayout::FromSpec(spec);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor record ",
                                                   QuoteName(spec.name()), ": ",
                                                   layout.status().message()));
  }
  const uint32_t served = store_->map().SlicesOn(
      spec.name(), layout->num_slices(), store_->options().shard_index);
  if (served > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", QuoteName(spec.name()),
        " of the moved slots does not exist on this shard, which serves ",
        served, " of its slices: create it here first"));
  }
  // The listed spec carries its schedule, restored with it.
  absl::Status s = store_->RestoreTensor(spec);
  if (!s.ok()) return s;
  ++stats_.tensors_created;
  return absl::OkStatus();
}

absl::Status SlotStateApplier::FollowSchedule(absl::string_view name,
                                              const OptimizerSpec& here,
                                              const OptimizerSpec& moved) {
  // A shard that missed SetLearningRate calls (a standby, or one that was
  // down) takes the source's step when it is newer, as SetLearningRates
  // would; an older or equal one leaves its own in effect.
  LearningRate theirs, ours;
  if (!ScheduleOf(name, moved, &theirs)) return absl::OkStatus();
  if (ScheduleOf(name, here, &ours) && ours.step() >= theirs.step()) {
    return absl::OkStatus();
  }
  SetLearningRateRequest request;
  *request.add_rates() = theirs;
  bool changed = false;
  absl::Status s = store_->SetLearningRates(request, &changed).status();
  if (!s.ok()) return s;
  stats_.schedules_adopted += changed;
  return absl::OkStatus();
}

absl::Status SlotStateApplier::AddSlice(const CheckpointSlice& slice) {
  if (tensor_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot record ", n_ - 1, ": a slice record (slice ",
                     slice.index(), ") not after a tensor record"));
  }
  if (slots_ != nullptr && !slots_->HasSlice(tensor_, slice.index())) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", slice.index(), " of tensor ", QuoteName(tensor_),
                     " is not in a slot of the move"));
  }
  absl::Status s = store_->ImportSlice(tensor_, slice.index(), slice.version(),
                                       slice.values(), SliceStateOf(slice));
  if (s.ok()) ++stats_.slices;
  return s;
}

absl::Status SlotStateApplier::StartTable(const TableSpec& spec) {
  tensor_.clear();
  table_.clear();
  ++stats_.tables;
  const SparseTable* here = store_->tables().Find(spec.name());
  if (here == nullptr) {
    absl::Status s = store_->tables().RestoreTable(spec);
    if (!s.ok()) return s;
    ++stats_.tables_created;
  } else if (!SameSpec(here->Listed(), spec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", QuoteName(spec.name()),
                     " of the moved slots has another spec on the shard "
                     "they leave than on this one"));
  } else {
    absl::Status s = FollowSchedule(spec.name(), here->Listed().optimizer(),
                                    spec.optimizer());
    if (!s.ok()) return s;
  }
  table_ = spec.name();
  table_key_ = ShardMap::KeyOf(table_);
  return absl::OkStatus();
}

absl::Status SlotStateApplier::AddRows(const CheckpointRows& rows) {
  if (table_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot record ", n_ - 1, ": a rows record not after a table record"));
  }
  const RowColumns c = ColumnsOf(rows);
  if (slots_ != nullptr) {
    for (uint64_t id : c.ids) {
      if (slots_->HasRow(table_key_, id)) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("row ", id, " of table ", QuoteName(table_),
                       " is not in a slot of the move"));
    }
  }
  absl::Status s =
      store_->tables().ImportRows(table_, c.ids, c.versions, c.touched,
                                  rows.values(), rows.optimizer_state());
  if (s.ok()) stats_.rows += rows.ids_size();
  return s;
}

absl::Status SlotStateApplier::RemoveRows(
    const CheckpointRemovedRows& removed) {
  if (table_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot record ", n_ - 1, ": a removed record not after a table record"));
  }
  const ShardMap map = store_->map();
  const int here = store_->options().shard_index;
  for (uint64_t id : removed.ids()) {
    // Rows this shard serves are its own business, not the move's.
    if (map.RowHome(table_key_, id) == here ||
        (slots_ != nullptr && !slots_->HasRow(table_key_, id))) {
      return absl::InvalidArgumentError(
          absl::StrCat("removed row ", id, " of table ", QuoteName(table_),
                       " is not in a slot of the move"));
    }
  }
  absl::Status s = store_->tables().RemoveRows(
      table_, absl::MakeConstSpan(removed.ids().data(), removed.ids_size()));
  if (s.ok()) stats_.removed_rows += removed.ids_size();
  return s;
}

absl::Status ApplySlotRecords(ShardStore* store,
                              absl::Span<const std::string> records,
                              SlotApplyStats* stats) {
  SlotStateApplier applier(store);
  absl::Status s;
  for (const std::string& r : records) {
    s = applier.Apply(r);
    if (!s.ok()) break;
  }
  if (stats != nullptr) *stats = applier.stats();
  return s;
}

}  // namespace asyncps
