#include "server/etcd_map_record.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

absl::StatusOr<VersionedMapRecord> Parse(const std::optional<EtcdKeyValue>& kv,
                                         const std::string& key) {
  VersionedMapRecord out;
  if (!kv.has_value()) return out;  // never written: version 0
  if (!out.mutable_record()->ParseFromString(kv->value)) {
    return absl::DataLossError(
        absl::StrCat("the map record at etcd key ", key, " does not parse"));
  }
  out.set_version(static_cast<uint64_t>(kv->mod_revision));
  return out;
}

}  // namespace

absl::StatusOr<VersionedMapRecord> EtcdMapRecord::Read() {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->Get(key_);
  if (!kv.ok()) return kv.status();
  return Parse(*kv, key_);
}

absl::StatusOr<SwapMapRecordResponse> EtcdMapRecord::Swap(
    const MapRecord& record, uint64_t expected) {
  absl::StatusOr<EtcdClient::Swap> swap = etcd_->CompareAndSwap(
      key_, static_cast<int64_t>(expected), record.SerializeAsString());
  if (!swap.ok()) return swap.status();
  SwapMapRecordResponse out;
  out.set_swapped(swap->swapped);
  if (swap->swapped) {
    *out.mutable_current()->mutable_record() = record;
    out.mutable_current()->set_version(static_cast<uint64_t>(swap->revision));
    return out;
  }
  absl::StatusOr<VersionedMapRecord> now = Parse(swap->current, key_);
  if (!now.ok()) return now.status();
  *out.mutable_current() = *std::move(now);
  return out;
}

}  // namespace asyncps
