#include "server/slot_load_meter.h"

namespace asyncps {

SlotLoadMeter::SlotLoadMeter(const ShardMap& map) : map_(map) {
  if (map_.slotted()) {
    slots_ =
        std::make_unique<Counters[]>(static_cast<size_t>(map_.num_slots()));
  }
}

void SlotLoadMeter::Record(const PushRequest& request,
                           absl::Span<const Payload> grads,
                           absl::Span<const Payload> rows) {
  if (slots_ == nullptr) return;
  for (int i = 0; i < request.grads_size(); ++i) {
    const SliceGradient& g = request.grads(i);
    Counters& c = slots_[map_.SliceSlot(g.tensor(), g.slice())];
    c.updates.fetch_add(1, std::memory_order_relaxed);
    if (static_cast<size_t>(i) < grads.size()) {
      c.bytes.fetch_add(grads[i].size(), std::memory_order_relaxed);
    }
  }
  for (int k = 0; k < request.rows_size(); ++k) {
    const RowsGradient& r = request.rows(k);
    if (r.ids().empty()) continue;
    const uint64_t key = ShardMap::KeyOf(r.table()).value;
    const uint64_t per_row =
        static_cast<size_t>(k) < rows.size()
            ? rows[k].size() / static_cast<uint64_t>(r.ids_size())
            : 0;
    for (const uint64_t id : r.ids()) {
      Counters& c = slots_[map_.RowSlot(key, id)];
      c.updates.fetch_add(1, std::memory_order_relaxed);
      c.rows.fetch_add(1, std::memory_order_relaxed);
      c.bytes.fetch_add(per_row, std::memory_order_relaxed);
    }
  }
}

void SlotLoadMeter::Fill(StatusResponse* response) const {
  if (slots_ == nullptr) return;
  for (int s = 0; s < map_.num_slots(); ++s) {
    const Counters& c = slots_[s];
    const uint64_t updates = c.updates.load(std::memory_order_relaxed);
    if (updates == 0) continue;
    SlotLoad* out = response->add_slot_load();
    out->set_slot(static_cast<uint32_t>(s));
    out->set_updates(updates);
    out->set_push_bytes(c.bytes.load(std::memory_order_relaxed));
    out->set_rows_pushed(c.rows.load(std::memory_order_relaxed));
  }
}

}  // namespace asyncps
