#include "tools/map_record_view.h"

#include "absl/strings/str_cat.h"
#include "membership/map_store.h"
#include "server/etcd_map_record.h"
#include "server/map_record_store.h"

namespace asyncps {

MapRecordView ReadMapRecordView(const std::vector<ShardResult>& results,
                                EtcdClient* etcd,
                                const SecurityOptions& security,
                                absl::Duration timeout) {
  MapRecordView view;
  std::string run_id;
  for (const ShardResult& r : results) {
    if (!r.up) continue;
    view.slotted = view.slotted || r.status.map().num_slots() > 0;
    run_id = r.status.run_id();
  }
  if (!view.slotted) return view;
  if (etcd != nullptr) {
    EtcdMapRecord record(etcd, RunPrefix(run_id));
    view.where = record.Where();
    view.record = record.Read();
    return view;
  }
  if (results.empty() || !results[0].up) {
    // Not asked again: its Status already did not answer.
    view.where = "shard 0";
    view.record = absl::UnavailableError("shard 0 does not answer");
    return view;
  }
  RemoteMapRecord record(results[0].address, run_id, security, timeout);
  view.where = absl::StrCat("shard 0 at ", results[0].address);
  view.record = record.Read();
  return view;
}

namespace {

std::string DescribeMove(const MapReservation& r) {
  return absl::StrCat("shard ", r.destination_index(), " (", r.destination(),
                      ") moving ", r.slots(), " slots in from shard ",
                      r.source_index());
}

}  // namespace

std::string MapRecordText(const MapRecordView& view) {
  if (!view.slotted) return "";
  std::string line = absl::StrCat("map record (", view.where, "): ");
  if (!view.record.ok()) {
    return absl::StrCat(line, "unreadable: ", view.record.status().ToString(),
                        "\n");
  }
  const MapRecord& m = view.record->record();
  absl::StrAppend(&line, m.has_committed()
                             ? absl::StrCat("epoch ", m.committed().epoch())
                             : std::string("no move committed"));
  if (m.has_pending()) {
    absl::StrAppend(&line, "; a move holds epoch ",
                    m.pending().next_map().epoch(), ": ",
                    DescribeMove(m.pending()));
  } else {
    absl::StrAppend(&line, "; no move in progress");
  }
  return line + "\n";
}

Doc MapRecordDoc(const MapRecordView& view) {
  if (!view.slotted) return Doc::Null();
  Doc doc = Doc::Object();
  doc.Set("where", Doc::String(view.where));
  if (!view.record.ok()) {
    doc.Set("error", Doc::String(view.record.status().ToString()));
    return doc;
  }
  const MapRecord& m = view.record->record();
  doc.Set("committed_epoch",
          m.has_committed() ? Doc::Uint(m.committed().epoch()) : Doc::Null());
  if (!m.has_pending()) {
    doc.Set("pending", Doc::Null());
    return doc;
  }
  const MapReservation& p = m.pending();
  doc.Set("pending",
          Doc::Object()
              .Set("epoch", Doc::Uint(p.next_map().epoch()))
              .Set("destination", Doc::Int(p.destination_index()))
              .Set("destination_address", Doc::String(p.destination()))
              .Set("source", Doc::Int(p.source_index()))
              .Set("slots", Doc::Uint(p.slots())));
  return doc;
}

}  // namespace asyncps
