#!/usr/bin/env python3
"""What losing etcd's leader costs a replicated group.

One group of two replicas (1 shard, R = 2) on loopback with a three-member
etcd (--election-timeout=500, as every deploy here), a push_client pushing
as fast as it is answered, and in each round one etcd member disturbed while
it pushes, then watched for 8 s:

  leader-stop    the leader is stopped (SIGSTOP: its connections stay open
                 and silent, a host cut off), resumed after the watch
  leader-kill    the leader is killed (SIGKILL: its port refuses)
  follower-stop  a follower is stopped (for comparison)
  leader-slow    the leader is slow rather than gone: stopped for
                 --slow_stop_ms and resumed for --slow_run_ms, over and
                 over (below an election timeout, so it stays the leader
                 and everything it answers comes late)

A leader's loss costs an election (0.5-1 s here), during which etcd grants
and renews no lease; the replicas' 1 s leases may run out meanwhile, and a
replica whose lease ran out acknowledges nothing until it holds one again.
Per round it prints the longest time without an acknowledged push, the
replicas' log lines about their leases, and PASS/FAIL: a round fails when a
replica or the client exited, a replica started over (threw its state
away), or no push was acknowledged for longer than --max_gap_s.

    python3 tests/cluster/etcd_leader_loss.py --bin "$(bazel info -c opt bazel-bin)" \\
        [--cases leader-stop,leader-kill,follower-stop] [--rounds 3]

Exits 1 if a round failed. Every process it starts is killed at the end, also
on failure; --keep keeps the logs' folder.
"""

import argparse
import json
import os
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_group as lg  # noqa: E402

WATCH_S = 8


def start_etcd(procs, etcd):
    """Three members on loopback; returns their client ports."""
    client = [lg.free_port() for _ in range(3)]
    peer = [lg.free_port() for _ in range(3)]
    cluster = ",".join(f"n{i}=http://127.0.0.1:{peer[i]}" for i in range(3))
    members = []
    for i in range(3):
        members.append(procs.spawn(
            [etcd, f"--name=n{i}", f"--data-dir={procs.folder}/etcd{i}",
             f"--listen-client-urls=http://127.0.0.1:{client[i]}",
             f"--advertise-client-urls=http://127.0.0.1:{client[i]}",
             f"--listen-peer-urls=http://127.0.0.1:{peer[i]}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer[i]}",
             f"--initial-cluster={cluster}", "--initial-cluster-state=new",
             "--heartbeat-interval=50", "--election-timeout=500",
             "--log-level=warn"], f"etcd{i}"))
    return members, client


def status(port):
    """etcd's maintenance status through its JSON gateway."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/maintenance/status", data=b"{}")
    with urllib.request.urlopen(request, timeout=2) as r:
        return json.loads(r.read())


def leader_index(ports):
    give_up = time.monotonic() + 15
    while time.monotonic() < give_up:
        try:
            leader = status(ports[0])["leader"]
            for i, port in enumerate(ports):
                if status(port)["header"]["member_id"] == leader:
                    return i
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    return None


def run_round(args, case, n, tmp):
    folder = os.path.join(tmp, f"{case}-{n}")
    os.makedirs(folder)
    procs = lg.Processes(folder)
    try:
        members, ports = start_etcd(procs, args.etcd)
        leader = leader_index(ports)
        if leader is None:
            print(f"{case} #{n}: etcd elected no leader in 15 s; logs in "
                  + folder)
            return False
        endpoint = ",".join(f"127.0.0.1:{p}" for p in ports)
        acks = lg.start_group(procs, args.bin, endpoint, "leader")
        if acks is None:
            print(f"{case} #{n}: fewer than 200 pushes acknowledged in 30 s; "
                  "logs in " + folder)
            return False
        leader = leader_index(ports)  # the same unless it changed meanwhile
        victim = leader if case.startswith("leader") else (leader + 1) % 3
        logs = [procs.log("server0"), procs.log("server1")]
        before = len(lg.lease_lines(logs))
        t0 = time.monotonic()
        if case == "leader-slow":
            while time.monotonic() < t0 + WATCH_S:
                members[victim].send_signal(signal.SIGSTOP)
                time.sleep(args.slow_stop_ms / 1000)
                members[victim].send_signal(signal.SIGCONT)
                time.sleep(args.slow_run_ms / 1000)
        else:
            members[victim].send_signal(
                signal.SIGKILL if case == "leader-kill" else signal.SIGSTOP)
            time.sleep(WATCH_S)
        t1 = time.monotonic()
        gap, at = lg.longest_gap(acks, t0, t1)
        servers_and_client = procs.procs[3:]
        exited = [p.args[0] for p in servers_and_client
                  if p.poll() is not None]
        lines = lg.lease_lines(logs)[before:]
        restarted = [x for x in lines if "starts over" in x]
        lost = [x for x in lines if "lost its lease" in x]
        ok = not exited and not restarted and gap <= args.max_gap_s
        print(f"--- {case} #{n}: etcd member n{victim} "
              f"({'leader' if victim == leader else 'follower'})")
        for line in lines:
            print("  " + line)
        print(f"  acknowledged in {WATCH_S} s: {len(acks.since(t0))}; "
              f"longest without one: {gap * 1000:.0f} ms "
              f"(from {at * 1000:.0f} ms); leases lost: {len(lost)}; "
              f"exited: {exited or 'none'}  {'PASS' if ok else 'FAIL'}")
        return ok, gap, len(lost)
    finally:
        procs.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    lg.add_round_args(ap, "leader-stop,leader-kill,follower-stop", 3,
                      max_gap_s=2.0)
    ap.add_argument("--slow_stop_ms", type=int, default=300,
                    help="leader-slow: how long the leader is stopped each "
                         "time")
    ap.add_argument("--slow_run_ms", type=int, default=100,
                    help="leader-slow: how long it runs between")
    args = ap.parse_args()

    def summarize(case, rounds):
        gaps = sorted(gap for _, gap, _ in rounds)
        lost = sum(k for _, _, k in rounds)
        print(f"{case}: rounds {len(gaps)}, longest gap median "
              f"{gaps[len(gaps) // 2] * 1000:.0f} ms, max "
              f"{gaps[-1] * 1000:.0f} ms, leases lost {lost}")

    return lg.run_rounds(args, run_round, "etcd-leader-loss-", summarize)


if __name__ == "__main__":
    sys.exit(main())
