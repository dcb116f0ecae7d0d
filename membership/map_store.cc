#include "membership/map_store.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

std::string RunPrefix(absl::string_view run_id) {
  return absl::StrCat("/asyncps/", run_id);
}

MapStore::MapStore(EtcdClient* etcd, std::string prefix)
    : etcd_(etcd), key_(std::move(prefix) + "/map") {}

absl::Status MapStore::Check(const ShardMapRecord& map) {
  if (map.epoch() < 1 || map.num_shards() < 1 || map.replicas() < 1 ||
      map.groups_size() != map.num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map: epoch and R must be >= 1 and there must be one group per "
        "shard; got epoch ",
        map.epoch(), ", R ", map.replicas(), ", ", map.groups_size(),
        " groups for ", map.num_shards(), " shards"));
  }
  absl::flat_hash_set<std::string> addresses;
  for (int i = 0; i < map.groups_size(); ++i) {
    const ShardGroupRecord& g = map.groups(i);
    if (g.shard() != i) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: group ", i, " is numbered ", g.shard()));
    }
    for (const ReplicaRecord& r : g.replicas()) {
      if (r.address().empty() || !addresses.insert(r.address()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard map: replica address '", r.address(),
                         "' is empty or holds two roles"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MapStore::Read> MapStore::Get() {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->Get(key_);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) {
    return absl::NotFoundError(absl::StrCat("no shard map at ", key_));
  }
  Read out;
  out.mod_revision = (*kv)->mod_revision;
  if (!out.map.ParseFromString((*kv)->value)) {
    return absl::DataLossError(
        absl::StrCat("the shard map at ", key_, " does not parse"));
  }
  Saw(out.map);
  return out;
}

ShardMapRecord MapStore::newest() const {
  absl::MutexLock l(&mu_);
  return newest_;
}

uint64_t MapStore::newest_epoch() const {
  absl::MutexLock l(&mu_);
  return newest_.epoch();
}

void MapStore::Saw(const ShardMapRecord& map) {
  absl::MutexLock l(&mu_);
  if (map.epoch() > newest_.epoch()) newest_ = map;
}

absl::StatusOr<bool> MapStore::Replace(const ShardMapRecord& map,
                                       int64_t mod_revision) {
  absl::Status s = Check(map);
  if (!s.ok()) return s;
  absl::StatusOr<EtcdClient::Swap> swap =
      etcd_->CompareAndSwap(key_, mod_revision, map.SerializeAsString());
  if (!swap.ok()) return swap.status();
  if (swap->swapped) Saw(map);
  return swap->swapped;
}

absl::StatusOr<ShardMapRecord> MapStore::Initialize(ShardMapRecord initial) {
  initial.set_epoch(1);
  absl::Status s = Check(initial);
  if (!s.ok()) return s;
  absl::StatusOr<EtcdClient::Swap> swap =
      etcd_->CompareAndSwap(key_, 0, initial.SerializeAsString());
  if (!swap.ok()) return swap.status();
  if (swap->swapped) {
    Saw(initial);
    return initial;
  }
  ShardMapRecord current;
  if (!swap->current.has_value() ||
      !current.ParseFromString(swap->current->value)) {
    return absl::DataLossError(
        absl::StrCat("the shard map at ", key_, " does not parse"));
  }
  if (current.run_id() != initial.run_id() ||
      current.num_shards() != initial.num_shards() ||
      current.replicas() != initial.replicas()) {
    return absl::FailedPreconditionError(absl::StrCat(
        key_, " holds the map of run '", current.run_id(), "' (",
        current.num_shards(), " shards x ", current.replicas(),
        "), not of run '", initial.run_id(), "' (", initial.num_shards(), " x ",
        initial.replicas(), "): one prefix per run"));
  }
  Saw(current);
  return current;
}

absl::StatusOr<ShardMapRecord> MapStore::Update(const Change& change,
                                                int max_attempts) {
  for (int attempt = 0; attempt < max_attempts; ++attempt) {
    absl::StatusOr<Read> read = Get();
    if (!read.ok()) return read.status();
    ShardMapRecord next = read->map;
    absl::StatusOr<bool> changed = change(&next);
    if (!changed.ok()) return changed.status();
    if (!*changed) return read->map;
    if (next.run_id() != read->map.run_id() ||
        next.num_shards() != read->map.num_shards() ||
        next.replicas() != read->map.replicas()) {
      return absl::InvalidArgumentError(
          "shard map change: the run, shard count and R stay as they are");
    }
    next.set_epoch(read->map.epoch() + 1);
    absl::Status s = Check(next);
    if (!s.ok()) return s;
    absl::StatusOr<EtcdClient::Swap> swap = etcd_->CompareAndSwap(
        key_, read->mod_revision, next.SerializeAsString());
    if (!swap.ok()) return swap.status();
    if (swap->swapped) {
      Saw(next);
      return next;
    }
    // Somebody else changed the map since it was read: again, from theirs.
  }
  return absl::AbortedError(
      absl::StrCat("shard map change: ", max_attempts,
                   " attempts all raced with other changes"));
}

std::unique_ptr<EtcdClient::Watcher> MapStore::Watch(
    int64_t from_revision, std::function<void(const ShardMapRecord&)> on_map,
    std::function<void(const absl::Status&)> on_end) {
  return etcd_->WatchPrefix(
      key_, from_revision,
      [this, on_map = std::move(on_map)](const std::vector<EtcdEvent>& events,
                                         int64_t) {
        for (const EtcdEvent& e : events) {
          ShardMapRecord map;
          if (e.deleted || e.kv.key != key_ ||
              !map.ParseFromString(e.kv.value)) {
            continue;
          }
          on_map(map);
        }
      },
      std::move(on_end));
}

}  // namespace asyncps
