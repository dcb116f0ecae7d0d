#include "tools/etcd_status_view.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "membership/map_store.h"
#include "membership/member_record.h"
#include "proto/membership.pb.h"

namespace asyncps {
namespace {

std::string MemberId(uint64_t member) {
  return absl::StrCat(absl::Hex(member, absl::kZeroPad16));
}

// What an operator must do about `type`.
std::string WhatToDo(const std::string& type) {
  if (type == "NOSPACE") {
    return "etcd refuses every write (no failover, no change of backups, no "
           "server can join) until its database is compacted and "
           "defragmented and the alarm disarmed (etcdctl compact, defrag, "
           "alarm disarm)";
  }
  if (type == "CORRUPT") {
    return "a member's data differs from the others': etcd refuses writes; "
           "replace that member (etcd's documentation, \"data corruption\")";
  }
  return "see etcd's documentation";
}

// The run's members that say they stand by (membership/member_record.h)
// and that the map lists in no group (one that just joined may say so a
// moment longer).
absl::StatusOr<std::vector<EtcdStatusView::Standby>> ReadStandbys(
    EtcdClient* etcd, const ShardMapRecord& map) {
  std::vector<EtcdStatusView::Standby> out;
  if (map.run_id().empty()) return out;  // no map read: nothing to compare
  absl::flat_hash_set<std::string> listed;
  for (const ShardGroupRecord& g : map.groups()) {
    for (const ReplicaRecord& r : g.replicas()) listed.insert(r.address());
  }
  const std::string prefix = MembersPrefix(RunPrefix(map.run_id()));
  absl::StatusOr<EtcdClient::Listing> members = etcd->List(prefix);
  if (!members.ok()) return members.status();
  for (const EtcdKeyValue& kv : members->kvs) {
    const MemberValue v = ParseMemberValue(kv.value);
    const std::string address(
        ReplicaAddress(absl::string_view(kv.key).substr(prefix.size())));
    if (v.standby && !listed.contains(address)) {
      out.push_back({address, v.host, v.shard});
    }
  }
  return out;
}

// "" or "not read: WHY".
template <typename T>
std::string NotRead(const absl::StatusOr<T>& read) {
  return read.ok() ? "" : absl::StrCat("not read: ", read.status().message());
}

}  // namespace

EtcdStatusView ReadEtcdStatus(EtcdClient* etcd, const MapRouter* router) {
  EtcdStatusView view;
  if (etcd == nullptr) return view;
  view.read = true;
  view.alarms = etcd->Alarms();
  if (router != nullptr) view.standbys = ReadStandbys(etcd, router->map());
  return view;
}

bool AlarmRaised(const EtcdStatusView& view) {
  return view.read && view.alarms.ok() && !view.alarms->empty();
}

std::string EtcdStatusText(const EtcdStatusView& view) {
  if (!view.read) return "";
  std::string out;
  if (!view.alarms.ok()) {
    absl::StrAppend(&out, "etcd: alarms ", NotRead(view.alarms), "\n");
  } else {
    for (const EtcdClient::Alarm& a : *view.alarms) {
      absl::StrAppend(&out, "etcd: alarm ", a.type, " raised by member ",
                      MemberId(a.member), ": ", WhatToDo(a.type), "\n");
    }
  }
  if (!view.standbys.ok()) {
    absl::StrAppend(&out, "standby replicas ", NotRead(view.standbys), "\n");
  } else {
    for (const EtcdStatusView::Standby& s : *view.standbys) {
      absl::StrAppend(
          &out, "standby replica: ", s.address, " (host ", s.host,
          ") waits to join ",
          s.shard < 0 ? "any shard" : absl::StrCat("shard ", s.shard), "\n");
    }
  }
  return out;
}

void AddEtcdStatusDoc(const EtcdStatusView& view, Doc* doc) {
  if (!view.read) {
    doc->Set("etcd_alarms", Doc::Null());
    doc->Set("standby_replicas", Doc::Null());
    return;
  }
  if (!view.alarms.ok()) {
    doc->Set("etcd_alarms", Doc::String(NotRead(view.alarms)));
  } else {
    Doc alarms = Doc::Array();
    for (const EtcdClient::Alarm& a : *view.alarms) {
      alarms.Add(Doc::Object()
                     .Set("alarm", Doc::String(a.type))
                     .Set("member", Doc::String(MemberId(a.member))));
    }
    doc->Set("etcd_alarms", std::move(alarms));
  }
  if (!view.standbys.ok()) {
    doc->Set("standby_replicas", Doc::String(NotRead(view.standbys)));
  } else {
    Doc standbys = Doc::Array();
    for (const EtcdStatusView::Standby& s : *view.standbys) {
      standbys.Add(Doc::Object()
                       .Set("address", Doc::String(s.address))
                       .Set("host", Doc::String(s.host))
                       .Set("shard", s.shard < 0 ? Doc::String("any")
                                                 : Doc::Int(s.shard)));
    }
    doc->Set("standby_replicas", std::move(standbys));
  }
}

}  // namespace asyncps
