// RunView (membership/run_view.h) against a real etcd: the run's map and
// live members follow a watch with one listing; a listing comes again when
// the watch ended (etcd restarted or silent) and every relist_every; no
// map is NOT_FOUND.
#include "membership/run_view.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "membership/map_store.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/require_ok.h"
#include "tests/testing/shard_maps.h"
#include "tests/testing/subprocess.h"

namespace asyncps {
namespace {

// A test etcd, a client of it, and run `run`'s prefix there, holding
// TwoByTwoMap(run) when `with_map`.
struct Run {
  testing::EtcdProcess etcd;
  std::shared_ptr<EtcdClient> client;
  std::string prefix;

  MapStore maps() const { return MapStore(client.get(), prefix); }
};

Run StartRun(const std::string& run, bool with_map) {
  absl::StatusOr<testing::EtcdProcess> etcd = testing::StartEtcd();
  REQUIRE_OK(etcd.status());
  absl::StatusOr<std::shared_ptr<EtcdClient>> c = testing::ConnectToEtcd(*etcd);
  REQUIRE_OK(c.status());
  Run r{*std::move(etcd), *c, RunPrefix(run)};
  if (with_map) {
    REQUIRE_OK(r.maps().Initialize(testing::TwoByTwoMap(run)).status());
  }
  return r;
}

// Until `view` shows `want` (its reads may list or not).
void AwaitView(RunView* view, const std::string& what,
               const std::function<bool(const RunView::Snapshot&)>& want) {
  REQUIRE_OK(testing::WaitFor(
      [&] {
        absl::StatusOr<RunView::Snapshot> s = view->Read();
        return s.ok() && want(*s);
      },
      absl::Seconds(30), what, absl::Milliseconds(10)));
}

TEST_CASE("a RunView follows the map and the members with one listing",
          "[run_view]") {
  if (testing::SkipWithoutEtcd()) return;
  Run run = StartRun("run-v", /*with_map=*/false);
  EtcdClient* c = run.client.get();
  const std::string& prefix = run.prefix;
  // Only the watch may bring what changes after the first listing.
  RunView view(c, prefix, absl::Hours(1));
  CHECK(absl::IsNotFound(view.Read().status()));
  MapStore maps = run.maps();
  REQUIRE_OK(maps.Initialize(testing::TwoByTwoMap("run-v")).status());
  REQUIRE_OK(c->Put(prefix + "/members/a", "shard=0").status());
  absl::StatusOr<RunView::Snapshot> first = view.Read();
  REQUIRE_OK(first.status());
  CHECK(first->map.epoch() == 1);
  CHECK(first->live.contains("a"));
  CHECK(first->live.size() == 1);
  const int64_t listed = view.listings();

  REQUIRE_OK(c->Put(prefix + "/members/b", "shard=1").status());
  REQUIRE_OK(maps.Update([](ShardMapRecord* m) -> absl::StatusOr<bool> {
                   m->mutable_groups(0)->mutable_replicas()->SwapElements(0, 1);
                   return true;
                 })
                 .status());
  REQUIRE_OK(c->Delete(prefix + "/members/a").status());
  // Keys beside the map and the members (the slot map record) change
  // nothing.
  REQUIRE_OK(c->Put(prefix + "/slots", "x").status());
  AwaitView(&view, "epoch 2, members {b}", [](const RunView::Snapshot& s) {
    return s.map.epoch() == 2 && s.live.size() == 1 && s.live.contains("b");
  });
  absl::StatusOr<RunView::Snapshot> now = view.Read();
  REQUIRE_OK(now.status());
  CHECK(now->map.groups(0).replicas(0).address() == "10.0.0.1:7000");
  CHECK(view.listings() == listed);
}

TEST_CASE("a RunView lists again after an etcd restart and every relist_every",
          "[run_view]") {
  if (testing::SkipWithoutEtcd()) return;
  Run run = StartRun("run-w", /*with_map=*/true);
  EtcdClient* c = run.client.get();
  const std::string& prefix = run.prefix;
  RunView view(c, prefix, absl::Hours(1));
  REQUIRE_OK(view.Read().status());
  CHECK(view.listings() == 1);

  // The watch ends with etcd; the next read lists (and watches) anew.
  REQUIRE_OK(testing::RestartEtcd(&run.etcd));
  REQUIRE_OK(c->Put(prefix + "/members/c", "shard=0").status());
  AwaitView(&view, "member c after the restart",
            [](const RunView::Snapshot& s) { return s.live.contains("c"); });
  CHECK(view.listings() >= 2);
  // ... and the new watch brings the changes after it.
  const int64_t listed = view.listings();
  REQUIRE_OK(c->Delete(prefix + "/members/c").status());
  AwaitView(&view, "member c gone",
            [](const RunView::Snapshot& s) { return s.live.empty(); });
  CHECK(view.listings() == listed);

  // With a short relist_every, reads list that often (the watch alive).
  RunView often(c, prefix, absl::Milliseconds(50));
  REQUIRE_OK(often.Read().status());
  absl::SleepFor(absl::Milliseconds(120));
  REQUIRE_OK(often.Read().status());
  CHECK(often.listings() == 2);
}

TEST_CASE(
    "a RunView reads etcd once while its watch answers, and lists again "
    "once etcd stops answering and comes back",
    "[run_view][faults]") {
  if (testing::SkipWithoutEtcd()) return;
  Run run = StartRun("run-q", /*with_map=*/true);
  EtcdClientOptions o;
  o.call_timeout = absl::Seconds(1);
  o.watch_check_every = absl::Milliseconds(200);
  absl::StatusOr<std::shared_ptr<EtcdClient>> c =
      testing::ConnectToEtcd(run.etcd, o);
  REQUIRE_OK(c.status());
  RunView view(c->get(), run.prefix);  // the default relist_every
  REQUIRE_OK(view.Read().status());
  absl::StatusOr<int64_t> ranges = testing::EtcdCallsStarted(run.etcd, "Range");
  REQUIRE_OK(ranges.status());
  // A role thread's ticks for 2 s: no read of etcd (the watch's progress
  // requests are no calls), the view as fresh as the watch.
  for (int i = 0; i < 40; ++i) {
    REQUIRE_OK(view.Read().status());
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(view.listings() == 1);
  absl::StatusOr<int64_t> after = testing::EtcdCallsStarted(run.etcd, "Range");
  REQUIRE_OK(after.status());
  CHECK(*after == *ranges);

  // etcd stopped: within the check and the call timeout the watch ends and
  // reads fail (a listing that times out), instead of returning the view
  // the silent watch left.
  REQUIRE_OK(run.etcd.process->Signal(SIGSTOP));
  REQUIRE_OK(testing::WaitFor(
      [&] { return !view.Read().ok(); }, absl::Seconds(10),
      "a read to fail while etcd is stopped", absl::Milliseconds(50)));
  REQUIRE_OK(run.etcd.process->Signal(SIGCONT));
  // Back: one listing and a new watch, which brings what changes next.
  AwaitView(&view, "the view again",
            [](const RunView::Snapshot&) { return true; });
  const int64_t listed = view.listings();
  CHECK(listed >= 2);
  REQUIRE_OK((*c)->Put(run.prefix + "/members/d", "shard=1").status());
  AwaitView(&view, "member d",
            [](const RunView::Snapshot& s) { return s.live.contains("d"); });
  CHECK(view.listings() == listed);
}

}  // namespace
}  // namespace asyncps
