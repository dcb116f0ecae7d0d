#!/usr/bin/env python3
"""What etcd's loss of its data costs a replicated group.

One group of two replicas (1 shard, R = 2) on loopback with a one-member
etcd, a push_client pushing as fast as it is answered, and in each round
(but `garbage`) etcd killed, its data directory removed, and etcd started
again on the same port --down_s later: the run's map, members and leases
are gone, the replicas' state and roles are not. The replicas put back the newest map they saw
(server/map_recovery.h) and go on. Cases:

  wipe           as above
  wipe-newcomer  a third server of the shard is started --newcomer_after_s
                 after etcd is back: it finds no map, writes a new run's
                 first one and claims the shard with its (empty) checkpoint;
                 the replicas put theirs back over it, and it must end up
                 standing by (or their backup), not their primary
  garbage        etcd is not touched; the run's map key is overwritten with
                 bytes that are no map (an operator's mistake), through
                 etcd's JSON gateway

Per round it prints the longest time without an acknowledged push after
the kill, the pushes acknowledged in the last 5 s of the watch (--watch_s),
the servers' log lines about the map, and PASS/FAIL: a round fails when a
process exited, one of the two replicas started over (threw its state away),
nothing was acknowledged in the last 5 s, or the gap exceeded --max_gap_s.

    python3 tests/cluster/etcd_data_loss.py --bin "$(bazel info -c opt bazel-bin)" \\
        [--cases wipe,wipe-newcomer,garbage] [--rounds 2]

Exits 1 if a round failed. Every process it starts is killed at the end, also
on failure; --keep keeps the logs' folder.
"""

import argparse
import base64
import json
import os
import shutil
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_group as lg  # noqa: E402


def map_lines(log_paths):
    lines = []
    for path in log_paths:
        if not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            for line in f:
                if ("shard map" in line or "starts over" in line
                        or "claimed" in line or "spare" in line
                        or "stands by" in line):
                    lines.append(f"{os.path.basename(path)}: {line.rstrip()}")
    return lines


def put_garbage(endpoint, key):
    """Writes bytes that are no shard map at `key` (etcd's JSON gateway)."""
    body = json.dumps({
        "key": base64.b64encode(key.encode()).decode(),
        "value": base64.b64encode(b"\xff\xff\xff\xff not a map").decode(),
    }).encode()
    request = urllib.request.Request(f"http://{endpoint}/v3/kv/put",
                                     data=body)
    with urllib.request.urlopen(request, timeout=5) as r:
        r.read()


def run_round(args, case, n, tmp):
    folder = os.path.join(tmp, f"{case}-{n}")
    os.makedirs(folder)
    procs = lg.Processes(folder)
    endpoint = f"127.0.0.1:{lg.free_port()}"
    data = os.path.join(folder, "etcd-data")
    try:
        etcd = lg.start_etcd(procs, args.etcd, endpoint, data)
        time.sleep(1.5)
        acks = lg.start_group(procs, args.bin, endpoint, "wipe")
        if acks is None:
            print(f"{case} #{n}: fewer than 200 pushes acknowledged in 30 s; "
                  "logs in " + folder)
            return False
        logs = [procs.log(f"server{i}") for i in range(3)]
        before = len(map_lines(logs))
        t0 = time.monotonic()
        if case == "garbage":
            put_garbage(endpoint, "/asyncps/wipe/map")
        else:
            etcd.kill()
            etcd.wait()
            shutil.rmtree(data)
            time.sleep(args.down_s)
            lg.start_etcd(procs, args.etcd, endpoint, data, "etcd-again")
        if case == "wipe-newcomer":
            time.sleep(args.newcomer_after_s)
            procs.spawn(lg.server_argv(args.bin, endpoint, "wipe", "c"),
                        "server2")
        time.sleep(args.watch_s - (time.monotonic() - t0))
        t1 = time.monotonic()
        gap, at = lg.longest_gap(acks, t0, t1)
        late = len([x for x in acks.since(t1 - 5) if x <= t1])
        exited = [os.path.basename(p.args[0]) for p in procs.procs
                  if "etcd" not in p.args[0] and p.poll() is not None]
        lines = map_lines(logs)[before:]
        restarted = [x for x in lines
                     if "starts over" in x and not x.startswith("server2")]
        ok = (not exited and not restarted and late > 0
              and gap <= args.max_gap_s)
        print(f"--- {case} #{n}: " + (
            "the map key overwritten" if case == "garbage" else
            f"etcd back without its data after {args.down_s} s"))
        for line in lines:
            print("  " + line)
        print(f"  longest without an acknowledged push: {gap * 1000:.0f} ms "
              f"(from {at * 1000:.0f} ms); acknowledged in the last 5 s: "
              f"{late}; exited: {exited or 'none'}  "
              f"{'PASS' if ok else 'FAIL'}")
        return ok, gap
    finally:
        procs.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    lg.add_round_args(ap, "wipe,wipe-newcomer,garbage", 2, max_gap_s=8.0)
    ap.add_argument("--down_s", type=float, default=1.0,
                    help="how long etcd stays down")
    ap.add_argument("--newcomer_after_s", type=float, default=0.3,
                    help="wipe-newcomer: when the third server starts, after "
                         "etcd is back")
    ap.add_argument("--watch_s", type=float, default=20.0,
                    help="how long each round watches from the kill")
    args = ap.parse_args()

    def summarize(case, rounds):
        print(f"{case}: rounds {len(rounds)}, longest gap max "
              f"{max(gap for _, gap in rounds) * 1000:.0f} ms")

    return lg.run_rounds(args, run_round, "etcd-data-loss-", summarize)


if __name__ == "__main__":
    sys.exit(main())
