#include "membership/run_view.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "membership/member_record.h"

namespace asyncps {

RunView::RunView(EtcdClient* etcd, std::string prefix,
                 absl::Duration relist_every)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      map_key_(prefix_ + "/map"),
      members_(MembersPrefix(prefix_)),
      relist_every_(relist_every) {}

RunView::~RunView() {
  std::unique_ptr<EtcdClient::Watcher> w;
  {
    absl::MutexLock l(&list_mu_);
    w = std::move(watcher_);
  }
  w.reset();  // joins its thread, which may wait for mu_: not held here
}

int64_t RunView::listings() const {
  absl::MutexLock l(&mu_);
  return listings_;
}

absl::StatusOr<RunView::Snapshot> RunView::Read() {
  {
    absl::MutexLock l(&mu_);
    if (listed_ && watching_ && absl::Now() - listed_at_ < relist_every_) {
      return view_;
    }
  }
  absl::MutexLock l(&list_mu_);
  {
    // Listed by another caller meanwhile.
    absl::MutexLock m(&mu_);
    if (listed_ && watching_ && absl::Now() - listed_at_ < relist_every_) {
      return view_;
    }
  }
  return List();
}

absl::StatusOr<RunView::Snapshot> RunView::List() {
  absl::StatusOr<EtcdClient::Listing> listing = etcd_->List(prefix_);
  if (!listing.ok()) return listing.status();
  Snapshot s;
  bool has_map = false;
  for (const EtcdKeyValue& kv : listing->kvs) {
    if (kv.key == map_key_) {
      if (!s.map.ParseFromString(kv.value)) {
        return absl::DataLossError(
            absl::StrCat("the value at ", map_key_, " is no shard map"));
      }
      has_map = true;
    } else if (absl::StartsWith(kv.key, members_)) {
      s.live.insert(kv.key.substr(members_.size()));
    }
  }
  if (!has_map) {
    return absl::NotFoundError(absl::StrCat("no shard map at ", map_key_));
  }
  bool start_watch = false;
  uint64_t generation = 0;
  {
    absl::MutexLock l(&mu_);
    // What the watch applied past the listing's revision is newer.
    if (listing->revision >= revision_) {
      view_ = s;
      revision_ = listing->revision;
    }
    listed_ = true;
    listed_at_ = absl::Now();
    ++listings_;
    if (!watching_) {
      start_watch = true;
      generation = ++generation_;
      watching_ = true;
      revision_ = listing->revision;
      view_ = s;
    }
    s = view_;
  }
  if (start_watch) {
    // The old watch (ended) goes first, outside mu_ (its callbacks take it).
    watcher_.reset();
    watcher_ = etcd_->WatchPrefix(
        prefix_, listing->revision + 1,
        [this, generation](const std::vector<EtcdEvent>& events, int64_t) {
          Apply(generation, events);
        },
        [this, generation](const absl::Status&) { Ended(generation); });
  }
  return s;
}

void RunView::Apply(uint64_t generation, const std::vector<EtcdEvent>& events) {
  absl::MutexLock l(&mu_);
  if (generation != generation_) return;
  for (const EtcdEvent& e : events) {
    if (e.kv.mod_revision <= revision_) continue;
    revision_ = e.kv.mod_revision;
    if (e.kv.key == map_key_) {
      ShardMapRecord map;
      if (e.deleted || !map.ParseFromString(e.kv.value)) {
        listed_ = false;  // the next Read lists, and says what is wrong
        continue;
      }
      view_.map = std::move(map);
    } else if (absl::StartsWith(e.kv.key, members_)) {
      const std::string id = e.kv.key.substr(members_.size());
      if (e.deleted) {
        view_.live.erase(id);
      } else {
        view_.live.insert(id);
      }
    }
  }
}

void RunView::Ended(uint64_t generation) {
  absl::MutexLock l(&mu_);
  if (generation == generation_) watching_ = false;
}

}  // namespace asyncps
