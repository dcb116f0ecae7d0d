#ifndef ASYNCPS_SERVER_SLOT_LOAD_METER_H_
#define ASYNCPS_SERVER_SLOT_LOAD_METER_H_

// What each slot of a slotted shard map costs the shard that owns it: the
// updates applied in it (slices and rows), their gradient bytes and the
// rows pushed, counted since the process started. psctl rebalance reads
// them (StatusRequest.slot_load) to move the hottest slots away from the
// busiest shards. Nothing is counted under a static map.
//
// Example (a shard, after a push was applied):
//
//   SlotLoadMeter load(store.map());
//   load.Record(request, grads, rows);
//   StatusResponse status;
//   load.Fill(&status);  // one SlotLoad per slot that saw a push
//
// Thread-safe: counters are relaxed atomics (24 bytes per slot: 96 KiB
// for 4096 slots).

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/types/span.h"
#include "common/payload.h"
#include "common/shard_map.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

class SlotLoadMeter {
 public:
  explicit SlotLoadMeter(const ShardMap& map);

  bool enabled() const { return map_.slotted(); }

  // An applied push: grads[i] is request.grads(i)'s payload, rows[k]
  // request.rows(k)'s.
  void Record(const PushRequest& request, absl::Span<const Payload> grads,
              absl::Span<const Payload> rows);

  // Appends one SlotLoad per slot with any update, in slot order.
  void Fill(StatusResponse* response) const;

 private:
  struct Counters {
    std::atomic<uint64_t> updates{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> rows{0};
  };

  const ShardMap map_;
  std::unique_ptr<Counters[]> slots_;  // num_slots of them; null if static
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLOT_LOAD_METER_H_
