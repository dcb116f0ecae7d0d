#include "membership/map_router.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace {

constexpr absl::Duration kMapPoll = absl::Milliseconds(200);

// The primary's address of shard group `g`, "" when the group is empty.
std::string PrimaryOf(const ShardGroupRecord& g) {
  return g.replicas_size() > 0 ? g.replicas(0).address() : std::string();
}

}  // namespace

absl::StatusOr<ShardMapRecord> MapRouter::ReadMap(EtcdClient* etcd,
                                                  const std::string& key,
                                                  int64_t* revision) {
  // A listing (not a get) for the store revision: the key's own revision
  // may be older than etcd's compaction.
  absl::StatusOr<EtcdClient::Listing> listing = etcd->List(key);
  if (!listing.ok()) return listing.status();
  *revision = listing->revision;
  for (const EtcdKeyValue& kv : listing->kvs) {
    if (kv.key != key) continue;  // "<prefix>/map..." of another kind
    ShardMapRecord map;
    if (!map.ParseFromString(kv.value)) {
      return absl::DataLossError(
          absl::StrCat("the shard map at ", key, " does not parse"));
    }
    if (absl::Status s = MapStore::Check(map); !s.ok()) return s;
    return map;
  }
  return absl::NotFoundError(absl::StrCat("no shard map at ", key));
}

absl::StatusOr<std::shared_ptr<MapRouter>> MapRouter::Start(
    std::shared_ptr<EtcdClient> etcd, std::string prefix,
    MapRouterOptions options) {
  if (etcd == nullptr) {
    return absl::InvalidArgumentError("MapRouter: no etcd client");
  }
  if (options.initial_backoff <= absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(
        "MapRouter: backoffs must be 0 < initial <= max");
  }
  if (options.logger == nullptr) {
    options.logger =
        std::make_shared<spdlog::logger>("map_router");  // no sinks
  }
  const std::string key = MapStore(etcd.get(), prefix).key();
  const absl::Time deadline = absl::Now() + options.wait_for_map;
  int64_t revision = 0;
  absl::StatusOr<ShardMapRecord> map = ReadMap(etcd.get(), key, &revision);
  // etcd not answering is said at once; a map not written yet (the shards
  // still starting) is waited for.
  if (absl::IsNotFound(map.status())) {
    while (!map.ok() && absl::Now() < deadline) {
      absl::SleepFor(std::min(kMapPoll, deadline - absl::Now()));
      map = ReadMap(etcd.get(), key, &revision);
    }
    if (absl::IsNotFound(map.status())) {
      return absl::NotFoundError(
          absl::StrCat("no shard map at ", key, " after ",
                       absl::FormatDuration(options.wait_for_map),
                       " (the run's shards write it when they start with the "
                       "same etcd and run id)"));
    }
  }
  if (!map.ok()) return map.status();
  std::shared_ptr<MapRouter> router(
      new MapRouter(std::move(etcd), std::move(prefix), options, *map));
  MapRouter* raw = router.get();
  router->follower_ =
      std::thread([raw, revision] { raw->Follow(revision + 1); });
  return router;
}

absl::StatusOr<std::shared_ptr<MapRouter>> MapRouter::Connect(
    const std::vector<std::string>& endpoints, absl::string_view run_id,
    MapRouterOptions options) {
  EtcdClientOptions o;
  o.endpoints = endpoints;
  o.call_timeout = options.etcd_call_timeout;
  o.access = options.etcd_access;
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Connect(o);
  if (!etcd.ok()) return etcd.status();
  absl::StatusOr<std::shared_ptr<MapRouter>> router =
      Start(std::shared_ptr<EtcdClient>(*std::move(etcd)), RunPrefix(run_id),
            std::move(options));
  if (router.ok()) return router;
  const absl::Status& s = router.status();
  const std::string where =
      absl::StrCat("etcd at ", absl::StrJoin(endpoints, ","));
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    return absl::UnavailableError(
        absl::StrCat(where, " does not answer (", s.message(),
                     "): check the endpoints, that etcd runs there, and "
                     "whether it serves TLS (--etcd_ca, --etcd_cert, "
                     "--etcd_key)"));
  }
  if (absl::IsNotFound(s)) {
    return absl::NotFoundError(absl::StrCat(
        where, ": ", s.message(), "; check the run id ('", run_id, "')"));
  }
  return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
}

MapRouter::MapRouter(std::shared_ptr<EtcdClient> etcd, std::string prefix,
                     MapRouterOptions options, const ShardMapRecord& first)
    : etcd_(std::move(etcd)),
      store_(etcd_.get(), std::move(prefix)),
      options_(std::move(options)),
      num_shards_(first.num_shards()) {
  absl::MutexLock l(&mu_);
  map_ = first;
  for (const ShardGroupRecord& g : first.groups()) {
    addresses_.push_back(PrimaryOf(g));
  }
}

MapRouter::~MapRouter() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (follower_.joinable()) follower_.join();
}

std::string MapRouter::Address(int shard) const {
  absl::MutexLock l(&mu_);
  return addresses_[shard];
}

ShardMapRecord MapRouter::map() const {
  absl::MutexLock l(&mu_);
  return map_;
}

void MapRouter::Apply(const ShardMapRecord& map) {
  absl::MutexLock l(&mu_);
  if (map.epoch() <= map_.epoch()) return;  // seen, or older
  if (map.groups_size() != num_shards_) {
    options_.logger->error(
        "shard map at {} epoch {} has {} shards, this run {}: ignored",
        store_.key(), map.epoch(), map.groups_size(), num_shards_);
    return;
  }
  bool moved = false;
  for (int s = 0; s < num_shards_; ++s) {
    std::string address = PrimaryOf(map.groups(s));
    if (address == addresses_[s]) continue;
    moved = true;
    options_.logger->info("shard map epoch {}: shard {} primary {} -> {}",
                          map.epoch(), s,
                          addresses_[s].empty() ? "(none)" : addresses_[s],
                          address.empty() ? "(none)" : address);
    addresses_[s] = std::move(address);
  }
  map_ = map;
  if (moved) generation_.fetch_add(1, std::memory_order_acq_rel);
}

bool MapRouter::Pause(absl::Duration d) {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), d);
  return !stop_;
}

void MapRouter::Follow(int64_t from_revision) {
  absl::Duration backoff = options_.initial_backoff;
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      watch_ended_ = false;
    }
    std::unique_ptr<EtcdClient::Watcher> watcher = store_.Watch(
        from_revision, [this](const ShardMapRecord& map) { Apply(map); },
        [this](const absl::Status& s) {
          absl::MutexLock l(&mu_);
          watch_ended_ = true;
          watch_end_ = s;
        });
    absl::Status ended;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &MapRouter::StoppedOrEnded));
      ended = watch_end_;
    }
    watcher.reset();  // before anything else touches etcd
    // Read the map again (what the watch may have missed), then watch on.
    for (int failures = 0;; ++failures) {
      if (!Pause(backoff)) return;
      backoff = std::min(backoff * 2, options_.max_backoff);
      int64_t revision = 0;
      absl::StatusOr<ShardMapRecord> map =
          ReadMap(etcd_.get(), store_.key(), &revision);
      if (!map.ok()) {
        if (failures % 10 == 0) {  // about every 20 s while etcd is away
          options_.logger->warn(
              "following the shard map at {}: the watch ended ({}) and "
              "reading the map fails: {}; retrying",
              store_.key(), ended.ToString(), map.status().ToString());
        }
        continue;
      }
      Apply(*map);
      options_.logger->info(
          "following the shard map at {} again from revision {} (the watch "
          "ended: {})",
          store_.key(), revision + 1, ended.ToString());
      from_revision = revision + 1;
      backoff = options_.initial_backoff;
      break;
    }
  }
}

}  // namespace asyncps
