#include "tools/etcd_alarms_view.h"

#include "absl/strings/str_cat.h"

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

}  // namespace

EtcdAlarmsView ReadEtcdAlarms(EtcdClient* etcd) {
  EtcdAlarmsView view;
  if (etcd == nullptr) return view;
  view.read = true;
  view.alarms = etcd->Alarms();
  return view;
}

bool AlarmRaised(const EtcdAlarmsView& view) {
  return view.read && view.alarms.ok() && !view.alarms->empty();
}

std::string EtcdAlarmsText(const EtcdAlarmsView& view) {
  if (!view.read) return "";
  if (!view.alarms.ok()) {
    return absl::StrCat(
        "etcd: alarms not read: ", view.alarms.status().message(), "\n");
  }
  std::string out;
  for (const EtcdClient::Alarm& a : *view.alarms) {
    absl::StrAppend(&out, "etcd: alarm ", a.type, " raised by member ",
                    MemberId(a.member), ": ", WhatToDo(a.type), "\n");
  }
  return out;
}

Doc EtcdAlarmsDoc(const EtcdAlarmsView& view) {
  if (!view.read) return Doc::Null();
  if (!view.alarms.ok()) {
    return Doc::String(
        absl::StrCat("not read: ", view.alarms.status().message()));
  }
  Doc alarms = Doc::Array();
  for (const EtcdClient::Alarm& a : *view.alarms) {
    alarms.Add(Doc::Object()
                   .Set("alarm", Doc::String(a.type))
                   .Set("member", Doc::String(MemberId(a.member))));
  }
  return alarms;
}

}  // namespace asyncps
