#!/usr/bin/env python3
"""How long a replicated group runs below R after its backup dies.

One group of two replicas (1 shard, R = 2) on loopback with a one-member
etcd and a push_client pushing as fast as it is answered; in each round the
backup is killed (kill -9) and the script watches the primary's log until
it says a backup caught up again (the group holds R replicas once more).
Cases:

  standby   a third server of the shard was started before the kill: it
            stands by (its group lists R) and joins once the dead backup
            leaves the map
  restart   the killed server is started again at once (a supervisor
            restarting it on the same host, on a new port)
  lost      nothing replaces it (its host is gone and no process waits):
            the group stays below R for the whole watch

Per round it prints when the primary dropped the dead backup and when a
backup caught up (ms after the kill), the longest time without an
acknowledged push, and PASS/FAIL: a round fails when a process exited that
was not killed, when (standby, restart) no backup caught up within
--watch_s, or when no push was acknowledged for longer than --max_gap_s.

    python3 tests/cluster/replica_replacement.py --bin "$(bazel info -c opt bazel-bin)" \\
        [--cases standby,restart,lost] [--rounds 3]

Exits 1 if a round failed. Every process it starts is killed at the end,
also on failure; --keep keeps the logs' folder.
"""

import argparse
import datetime
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_group as lg  # noqa: E402

# the stamp that starts every line of the logs: 2026-12-07 20:01:02.345
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) ")


def first_after(path, text, t):
    """The wall-clock time of the first line of `path` containing `text`
    stamped after `t` (time.time()), or None."""
    with open(path, errors="replace") as f:
        for line in f:
            m = STAMP.match(line)
            if not m or text not in line:
                continue
            at = datetime.datetime.strptime(
                m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
            if at >= t - 0.001:
                return at
    return None


def wait_for_line(path, text, deadline_s):
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        with open(path, errors="replace") as f:
            if text in f.read():
                return True
        time.sleep(0.05)
    return False


def run_round(args, case, n, tmp):
    folder = os.path.join(tmp, f"{case}-{n}")
    os.makedirs(folder)
    procs = lg.Processes(folder)
    endpoint = f"127.0.0.1:{lg.free_port()}"
    try:
        lg.start_etcd(procs, args.etcd, endpoint,
                      os.path.join(folder, "etcd-data"))
        time.sleep(1.5)
        acks = lg.start_group(procs, args.bin, endpoint, "replace")
        if acks is None:
            print(f"{case} #{n}: fewer than 200 pushes acknowledged in 30 s; "
                  "logs in " + folder)
            return False
        if case == "standby":
            procs.spawn(lg.server_argv(args.bin, endpoint, "replace", "c"),
                        "server2")
            if not wait_for_line(procs.log("server2"), "stands by", 20):
                print(f"{case} #{n}: the third server did not stand by")
                return False
            time.sleep(1)
        backup = procs.procs[2]  # etcd, server0 (claims), server1
        killed_at = time.time()
        t0 = time.monotonic()
        backup.send_signal(signal.SIGKILL)
        backup.wait()
        if case == "restart":
            procs.spawn(lg.server_argv(args.bin, endpoint, "replace", "b"),
                        "server1-again")
        primary_log = procs.log("server0")
        caught = None
        while time.monotonic() - t0 < args.watch_s and caught is None:
            time.sleep(0.1)
            caught = first_after(primary_log, "caught up", killed_at)
        time.sleep(max(0.0, min(2.0, args.watch_s - (time.monotonic() - t0))))
        dropped = first_after(primary_log, "dropped backup", killed_at)
        gap, at = lg.longest_gap(acks, t0, time.monotonic())
        exited = [os.path.basename(p.args[0]) for p in procs.procs
                  if p is not backup and p.poll() is not None]
        ok = (not exited and (caught is not None) == (case != "lost")
              and gap <= args.max_gap_s)

        def ms(t):
            return "never" if t is None else f"{(t - killed_at) * 1000:.0f} ms"

        print(f"{case} #{n}: dropped {ms(dropped)}, a backup caught up "
              f"{ms(caught)} after the kill; longest without an acknowledged "
              f"push {gap * 1000:.0f} ms (from {at * 1000:.0f} ms); exited: "
              f"{exited or 'none'}  {'PASS' if ok else 'FAIL'}")
        return ok, None if caught is None else caught - killed_at, gap
    finally:
        procs.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    lg.add_round_args(ap, "standby,restart,lost", 3, max_gap_s=2.0)
    ap.add_argument("--watch_s", type=float, default=15.0,
                    help="how long each round waits for a backup to catch up")
    args = ap.parse_args()

    def summarize(case, rounds):
        back = sorted(r[1] for r in rounds if r[1] is not None)
        median = f"{back[len(back) // 2] * 1000:.0f} ms" if back else "never"
        print(f"{case}: rounds {len(rounds)}, back at R after (median) "
              f"{median}, longest gap max "
              f"{max(r[2] for r in rounds) * 1000:.0f} ms")

    return lg.run_rounds(args, run_round, "replica-replacement-", summarize)


if __name__ == "__main__":
    sys.exit(main())
