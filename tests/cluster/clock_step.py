#!/usr/bin/env python3
"""What a step of the real-time clock does to a replicated group.

STEPS THIS MACHINE'S REAL-TIME CLOCK (clock_settime) and puts it back
afterwards (to where it would have been, from the monotonic clock), also on
failure. Needs root. Run it on a test machine only, never beside anything
that minds its clock jumping: it is a script outside CI, like the nemeses.

One group of two replicas (1 shard, R = 2) on loopback with a one-member
etcd, and a push_client pushing as fast as it is answered. Each case steps
the clock while the client pushes, then watches for STEP + 6 s (a wait in
progress at a step back would end STEP s late):

  back      the clock goes back STEP s; etcd answers throughout.
            A lease must not notice: no replica loses it. And the
            checkpoints (each replica's, every 2 s) go on on schedule:
            none put off by the STEP s.
  forward   the clock goes forward STEP s; the same.
  frozen    etcd stopped with SIGSTOP, then the clock goes back STEP s. No
            renewal can succeed, so every replica's lease runs out 1 s
            (--lease_ms) after its last renewal: a push acknowledged later
            than that was acknowledged without a lease (which is what
            keeps a partitioned primary from acknowledging once another
            may have taken over). Counts those acknowledgements.

Prints, per case, the replicas' log lines about their leases, the pushes
acknowledged in each second, how soon pushes are acknowledged again once the
clock is put back (and etcd resumed), and PASS/FAIL; a case fails also when
200 more pushes are not acknowledged within 30 s. Exits 1 if a case failed.

    python3 tests/cluster/clock_step.py --bin "$(bazel info -c opt bazel-bin)" \\
        [--step 20] [--cases back,forward,frozen]
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulated_cluster as ec  # noqa: E402  (install_signal_handlers)
import loopback_group as lg  # noqa: E402


CHECKPOINT_EVERY_S = 2


def checkpoints_written(log_paths):
    count = 0
    for path in log_paths:
        with open(path, errors="replace") as f:
            count += sum(1 for line in f if "checkpoint written" in line
                         or "checkpoint delta" in line and "written" in line)
    return count


class SteppedClock:
    """Steps CLOCK_REALTIME and puts it back where it would have been."""

    def __init__(self):
        self.offset = 0.0  # seconds added so far

    def step(self, seconds):
        now = time.clock_gettime(time.CLOCK_REALTIME)
        time.clock_settime(time.CLOCK_REALTIME, now + seconds)
        self.offset += seconds

    def restore(self):
        if self.offset:
            self.step(-self.offset)


def run_case(args, case, clock, tmp):
    folder = os.path.join(tmp, case)
    os.makedirs(folder)
    procs = lg.Processes(folder)
    endpoint = f"127.0.0.1:{lg.free_port()}"
    try:
        etcd = lg.start_etcd(procs, args.etcd, endpoint, f"{folder}/etcd")
        time.sleep(1.5)
        # Each replica writes checkpoints of its own, every 2 s.
        acks = lg.start_group(
            procs, args.bin, endpoint, "clock", args.lease_ms,
            lambda i: [f"--checkpoint_dir={folder}/checkpoints{i}",
                       f"--checkpoint_every_s={CHECKPOINT_EVERY_S}"])
        if acks is None:
            print(f"{case}: the client acknowledged fewer than 200 pushes in "
                  "30 s; logs in " + folder)
            return False
        logs = [procs.log("server0"), procs.log("server1")]
        before = len(lg.lease_lines(logs))
        written_before = checkpoints_written(logs)
        t0 = time.monotonic()
        if case == "frozen":
            etcd.send_signal(signal.SIGSTOP)
        clock.step(args.step if case == "forward" else -args.step)
        watch_s = int(args.step) + 6
        time.sleep(watch_s)
        if case == "frozen":
            etcd.send_signal(signal.SIGCONT)
        written = checkpoints_written(logs) - written_before
        clock.restore()
        t1 = time.monotonic()
        late = acks.since(t0)
        # Training goes on once etcd is back (a fenced primary resumes).
        recovered = acks.wait_for(acks.count() + 200, 30)
        resumed = acks.since(t1)
        back_after = (f"{resumed[199] - t1:.1f} s" if recovered
                      else "not within 30 s")
        per_second = [sum(1 for x in late if t0 + s <= x < t0 + s + 1)
                      for s in range(watch_s)]
        lines = lg.lease_lines(logs)[before:]
        print(f"--- {case}: clock {'+' if case == 'forward' else '-'}"
              f"{args.step} s" + (", etcd stopped" if case == "frozen" else ""))
        for line in lines:
            print("  " + line)
        print(f"  pushes acknowledged in each second after: {per_second}")
        print(f"  200 more acknowledged after the clock was put back "
              f"(and etcd resumed): {back_after}")
        # Two replicas on schedule (not counted frozen: no lease, no steps).
        expected = 2 * (watch_s // CHECKPOINT_EVERY_S)
        if case != "frozen":
            print(f"  checkpoints written in the {watch_s} s: {written} "
                  f"(two replicas every {CHECKPOINT_EVERY_S} s: {expected})")
        if case == "frozen":
            # The last renewal was at most a lease before the freeze.
            bound = t0 + args.lease_ms / 1000 + 0.2
            unleased = sum(1 for x in late if x > bound)
            ok = unleased == 0
            print(f"  acknowledged more than {args.lease_ms + 200} ms after "
                  f"etcd stopped: {unleased}  {'PASS' if ok else 'FAIL'}")
        else:
            lost = [x for x in lines if "lost its lease" in x]
            ok = not lost and written >= expected - 2
            print(f"  replicas that lost their lease: {len(lost)}  "
                  f"{'PASS' if ok else 'FAIL'}")
        return ok and recovered
    finally:
        clock.restore()
        procs.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True,
                    help="bazel-bin of a -c opt build, or a flat folder")
    ap.add_argument("--step", type=float, default=20,
                    help="seconds the clock is stepped by")
    ap.add_argument("--cases", default="back,forward,frozen")
    ap.add_argument("--lease_ms", type=int, default=1000)
    ap.add_argument("--keep", action="store_true",
                    help="keep the logs' folder")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("clock_step.py steps the real-time clock: run it as root")
        return 2
    args.etcd = shutil.which("etcd")
    if args.etcd is None:
        print("etcd not installed (deploy/install_deps.sh installs it)")
        return 2
    ec.install_signal_handlers()
    clock = SteppedClock()
    tmp = tempfile.mkdtemp(prefix="clock-step-")
    failed = 0
    try:
        for case in args.cases.split(","):
            if not run_case(args, case, clock, tmp):
                failed += 1
    finally:
        clock.restore()
        lg.leave_folder(tmp, args.keep)
    print(f"{failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
