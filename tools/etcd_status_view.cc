#include "tools/etcd_status_view.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "membership/map_store.h"
#include "membership/member_record.h"
#include "proto/membership.pb.h"
#include "server/group_records.h"

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

// From one listing of the run's members (membership/member_record.h): the
// standbys, members that say they stand by and that the map lists in no
// group (one that just joined may say so a moment longer), and the lost
// groups, which held a state and have no caught-up replica alive.
absl::Status ReadMembers(EtcdClient* etcd, const ShardMapRecord& map,
                         EtcdStatusView* view) {
  view->standbys = std::vector<EtcdStatusView::Standby>();
  view->lost_groups = std::vector<EtcdStatusView::LostGroup>();
  if (map.run_id().empty()) return absl::OkStatus();  // no map read
  // By process, not address: a process restarted at the address of a
  // record its group still lists (a lost group) stands by all the same.
  absl::flat_hash_set<std::string> listed;
  for (const ShardGroupRecord& g : map.groups()) {
    for (const ReplicaRecord& r : g.replicas()) {
      listed.insert(group_records::IdOf(r));
    }
  }
  const std::string prefix = MembersPrefix(RunPrefix(map.run_id()));
  absl::StatusOr<EtcdClient::Listing> members = etcd->List(prefix);
  if (!members.ok()) return members.status();
  absl::flat_hash_set<std::string> live;  // ReplicaIds
  for (const EtcdKeyValue& kv : members->kvs) {
    const std::string id(absl::string_view(kv.key).substr(prefix.size()));
    live.insert(id);
    const MemberValue v = ParseMemberValue(kv.value);
    const std::string address(ReplicaAddress(id));
    if (v.standby && !listed.contains(id)) {
      view->standbys->push_back({address, v.host, v.shard});
    }
  }
  for (const ShardGroupRecord& g : map.groups()) {
    if (!g.held_state() || g.replicas().empty()) continue;
    if (!group_records::WholeStateLive(g, live, /*self=*/"")) {
      view->lost_groups->push_back({g.shard(), group_records::NamedHolders(g)});
    }
  }
  return absl::OkStatus();
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
  if (router != nullptr) {
    if (absl::Status read = ReadMembers(etcd, router->map(), &view);
        !read.ok()) {
      view.standbys = read;
      view.lost_groups = read;
    }
  }
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
  if (view.lost_groups.ok()) {
    for (const EtcdStatusView::LostGroup& g : *view.lost_groups) {
      absl::StrAppend(&out, "shard ", g.shard,
                      " lost every replica holding its state: ");
      if (g.holders.empty()) {
        absl::StrAppend(&out,
                        "a process of the shard with a checkpoint claims it\n");
        continue;
      }
      absl::StrAppend(
          &out, "its last state is in the checkpoints of ",
          absl::StrJoin(g.holders, ", "),
          " (a process on one of their --checkpoint_dir claims it; one with "
          "an older checkpoint waits, or with --claim_without_checkpoint "
          "claims, losing what the group applied since)\n");
    }
  }
  return out;
}

void AddEtcdStatusDoc(const EtcdStatusView& view, Doc* doc) {
  if (!view.read) {
    doc->Set("etcd_alarms", Doc::Null());
    doc->Set("standby_replicas", Doc::Null());
    doc->Set("lost_groups", Doc::Null());
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
  if (!view.lost_groups.ok()) {
    doc->Set("lost_groups", Doc::String(NotRead(view.lost_groups)));
  } else {
    Doc lost = Doc::Array();
    for (const EtcdStatusView::LostGroup& g : *view.lost_groups) {
      Doc holders = Doc::Array();
      for (const std::string& h : g.holders) holders.Add(Doc::String(h));
      lost.Add(Doc::Object()
                   .Set("shard", Doc::Int(g.shard))
                   .Set("last_state_holders", std::move(holders)));
    }
    doc->Set("lost_groups", std::move(lost));
  }
}

}  // namespace asyncps
