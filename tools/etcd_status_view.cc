#include "tools/etcd_status_view.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "membership/map_store.h"
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

// The run's members that say they stand by and that the map lists in no
// group (one that just joined may say so a moment longer). A member's key
// ends in "<address>/<incarnation>", its value is "shard=N host=H", with
// " standby" while it stands by (server/replica_group.cc).
absl::StatusOr<std::vector<EtcdStatusView::Standby>> ReadStandbys(
    EtcdClient* etcd, const ShardMapRecord& map) {
  std::vector<EtcdStatusView::Standby> out;
  if (map.run_id().empty()) return out;  // no map read: nothing to compare
  absl::flat_hash_set<std::string> listed;
  for (const ShardGroupRecord& g : map.groups()) {
    for (const ReplicaRecord& r : g.replicas()) listed.insert(r.address());
  }
  const std::string prefix = absl::StrCat(RunPrefix(map.run_id()), "/members/");
  absl::StatusOr<EtcdClient::Listing> members = etcd->List(prefix);
  if (!members.ok()) return members.status();
  for (const EtcdKeyValue& kv : members->kvs) {
    const std::string id = kv.key.substr(prefix.size());
    const size_t slash = id.rfind('/');
    EtcdStatusView::Standby s;
    s.address = slash == std::string::npos ? id : id.substr(0, slash);
    bool standby = false;
    for (absl::string_view field : absl::StrSplit(kv.value, ' ')) {
      standby = standby || field == "standby";
      if (absl::ConsumePrefix(&field, "host=")) s.host = std::string(field);
      if (absl::ConsumePrefix(&field, "shard=") &&
          !absl::SimpleAtoi(field, &s.shard)) {
        s.shard = -1;
      }
    }
    if (standby && !listed.contains(s.address)) out.push_back(std::move(s));
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
