#ifndef ASYNCPS_COMMON_SHARD_MAP_H_
#define ASYNCPS_COMMON_SHARD_MAP_H_

// Where every key of a run lives: the one place that answers "which shard
// owns this slice / this row". Clients route pulls and pushes by it, shards
// check that what they are sent is theirs by it, and checkpoints, reshard,
// psctl, ps_serve and the Python binding ask it too; nothing else computes
// a home.
//
// A map has an epoch. Every pull and push carries the epoch of the map it
// was routed with (PullRequest.map_epoch / PushRequest.map_epoch), and a
// shard refuses a request routed with another map than its own, before it
// reads the request's keys, so that a request can never be applied by a
// shard that no longer owns its keys: one routed with an older map is
// refused with the shard's map (the client routes it again by that), one
// routed with a newer map is retried (the shard learns it soon).
//
// Two forms. A static map (the default of a run) places keys by its shard
// count: slices of a tensor go round-robin over the shards from a start
// chosen by a stable hash of the tensor's name, and rows by a hash of
// (table, id) modulo the shard count, at epoch kStaticEpoch. A slotted map
// (ps_server --num_slots) hashes every key into one of a fixed number of
// slots by the same hashes modulo the slot count, and lists the shard that
// owns each slot: a map change moves slots, not every key. The even slotted
// map (slot s on shard s mod N) places every key where the static map of N
// shards does whenever N divides the slot count. The values of these
// functions are part of the checkpoint format (a checkpoint holds the keys
// its shard owned), so they never change.
//
// Example:
//
//   absl::StatusOr<ShardMap> map = ShardMap::Static(servers.size());
//   if (!map.ok()) return map.status();
//   const int home = map->SliceHome("fc0/w", 3);          // slice 3
//   const ShardMap::TableKey emb = ShardMap::KeyOf("emb");
//   const int row_home = map->RowHome(emb, 123456789);    // row 123456789
//   request.set_map_epoch(map->epoch());
//
// A value type: cheap to copy, immutable, thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace asyncps {

class ShardMap {
 public:
  // The epoch of every static map. 0 on a request means "not routed by a
  // map" (an older client): shards accept it.
  static constexpr uint64_t kStaticEpoch = 1;

  // A table's precomputed hash, for loops over its row ids.
  struct TableKey {
    uint64_t value = 0;
  };

  // The map of a one-shard run.
  ShardMap() : ShardMap(1, kStaticEpoch) {}

  // The static map of a run of `num_shards` shards; INVALID_ARGUMENT unless
  // 1 <= num_shards <= kMaxShards.
  static absl::StatusOr<ShardMap> Static(int num_shards);
  static constexpr int kMaxShards = 1 << 16;

  // A slotted map of `num_shards` shards at `epoch` (>= 1): owners[s] is
  // the shard of slot s. INVALID_ARGUMENT (naming the first bad value)
  // unless 1 <= num_shards <= kMaxShards, 1 <= owners.size() <= kMaxSlots
  // and every owner is below num_shards. A shard may own no slot.
  static absl::StatusOr<ShardMap> Slotted(int num_shards,
                                          std::vector<uint16_t> owners,
                                          uint64_t epoch);
  // The even slotted map: slot s on shard s mod num_shards, at
  // kStaticEpoch. INVALID_ARGUMENT unless num_shards <= num_slots.
  static absl::StatusOr<ShardMap> EvenSlots(int num_shards, int num_slots);
  static constexpr int kMaxSlots = 1 << 20;

  int num_shards() const { return num_shards_; }
  uint64_t epoch() const { return epoch_; }
  bool slotted() const { return owners_ != nullptr; }
  // 0 for a static map.
  int num_slots() const {
    return owners_ != nullptr ? static_cast<int>(owners_->size()) : 0;
  }
  // The owner of every slot (empty for a static map).
  absl::Span<const uint16_t> owners() const {
    return owners_ != nullptr ? absl::Span<const uint16_t>(*owners_)
                              : absl::Span<const uint16_t>();
  }
  // The shards that own at least one slot (every shard of a static map),
  // in order: the ones a client talks to. A slotted run may keep shards
  // that own no slot (ps_server --serving_shards, psctl scale): they take
  // no part until a move gives them slots, and may be stopped.
  const std::vector<int>& serving_shards() const { return serving_->shards; }
  // The position of `shard` in serving_shards(), or -1 when it owns no slot:
  // a client's per-call state is indexed by it, so that a run declared with
  // many more shards than serve costs a call nothing more.
  // REQUIRES: 0 <= shard < num_shards().
  int ServingPosition(int shard) const { return serving_->position[shard]; }

  // The slot of a slice / a row. REQUIRES: slotted().
  uint32_t SliceSlot(absl::string_view tensor, uint32_t slice) const;
  uint32_t RowSlot(uint64_t table_key, uint64_t id) const;

  // The shard that owns slice `slice` of tensor `tensor`.
  int SliceHome(absl::string_view tensor, uint32_t slice) const;
  // How many of the first `num_slices` slices of `tensor` `shard` owns
  // (closed form of counting SliceHome(tensor, i) == shard).
  uint32_t SlicesOn(absl::string_view tensor, uint32_t num_slices,
                    int shard) const;

  static TableKey KeyOf(absl::string_view table);
  // The shard that owns row `id` of the table of `key` / named `table`.
  int RowHome(TableKey key, uint64_t id) const;
  int RowHome(absl::string_view table, uint64_t id) const {
    return RowHome(KeyOf(table), id);
  }

  // OK when a request routed with map epoch `routed` may be served under
  // this map: the same epoch, or 0 (not routed by a map). An older epoch is
  // FAILED_PRECONDITION naming both (the caller must route the request
  // again by this map; common/shard_map_proto.h RefuseRouted attaches it),
  // a newer one UNAVAILABLE (this shard has not learnt that map yet: retry).
  absl::Status CheckRouted(uint64_t routed) const;

  // "static map of 3 shards, epoch 1" / "map of 4096 slots over 3
  // shards, epoch 7", for messages.
  std::string DebugString() const;

  friend bool operator==(const ShardMap& a, const ShardMap& b) {
    return a.num_shards_ == b.num_shards_ && a.epoch_ == b.epoch_ &&
           a.owners() == b.owners() && a.slotted() == b.slotted();
  }
  friend bool operator!=(const ShardMap& a, const ShardMap& b) {
    return !(a == b);
  }

 private:
  ShardMap(int num_shards, uint64_t epoch,
           std::shared_ptr<const std::vector<uint16_t>> owners = nullptr);

  int num_shards_;
  uint64_t epoch_;
  // Null for a static map; shared by copies (immutable).
  std::shared_ptr<const std::vector<uint16_t>> owners_;
  // Computed once per map: clients read it per call.
  struct Serving {
    std::vector<int> shards;
    std::vector<int> position;  // per shard
  };
  std::shared_ptr<const Serving> serving_;
};

// Whether `shard` owns the same keys under `a` and `b`: two slotted maps of
// one slot count in which every slot is `shard`'s in both or in neither, or
// two static maps of one shard count. A map change that passes leaves the
// shard's own state as it is (the AdoptMap RPC of proto/slot_moves.proto
// accepts only such a map).
bool OwnsSameSlots(const ShardMap& a, const ShardMap& b, int shard);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SHARD_MAP_H_
