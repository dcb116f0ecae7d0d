#!/usr/bin/env python3
"""Whole replicated groups lost and brought back, in random orders: what an
acknowledged push costs when every replica holding a group's state dies.

One group (1 shard, R = 2) and a standby on loopback (a process of the
shard, or with --any_spare a spare of any shard), three server
processes with a checkpoint directory each (`--checkpoint_every_s=1`), a
one-member etcd, and a push_client pushing ones to a tensor of 1,000
floats (SGD at rate 1, so every applied push takes exactly 1 off each
element). Each round:

  1. waits until the group holds R caught-up replicas (psctl status exits
     0) and reads the tensor's value;
  2. starts a new push_client and, once it is acknowledged, kills 2 or 3
     of the three processes (SIGKILL) in a random order with random gaps of
     0-3 s (between kills the standby may join and catch up, or a dropped
     replica's checkpoint may fall behind the group's state);
  3. kills the client, starts every killed process again on its own
     directory (new ports) in a random order with random gaps of 0-2 s, and
     waits for the group to hold R again (a group that never comes back
     fails the round);
  4. reads the value again: the pushes the group applied in the round,
     against the client's acknowledged ones.

A round passes when the group came back, no push was applied that was
neither acknowledged nor the one in flight, nothing of earlier rounds is
missing, and the acknowledged pushes that are missing (lost with the
group: none when a replica survived) were all acknowledged within
--bound_s of the last acknowledgement: the
checkpoint loss bound (the claimer's checkpoint is at most a checkpoint
interval, plus its capture, behind the group's last state). Before the
map named each replica's checkpoint directory, whichever process came back
first claimed the group, also one dropped seconds before, and took those
seconds' pushes with it.

    python3 tests/cluster/group_loss.py --bin "$(bazel info -c opt bazel-bin)" \\
        [--rounds 10] [--seed 1] [--any_spare]

Exits 1 if a round failed, 2 without etcd. Every process it starts is
killed at the end, also on failure; --keep keeps the logs' folder.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulated_cluster as ec  # noqa: E402
import loopback_group as lg  # noqa: E402

ELEMS = 1000
RUN = "group-loss"


class Group:
    """The three server processes ("slots"), each on its own checkpoint
    directory, and what reads the run."""

    def __init__(self, args, procs, endpoint):
        self.args = args
        self.procs = procs
        self.endpoint = endpoint
        self.slots = [None, None, None]  # Popen per slot, None when dead
        self.starts = [0, 0, 0]
        self.dirs = [os.path.join(procs.folder, f"ckpt{i}") for i in range(3)]
        self.psctl = ec.binary(args.bin, "tools", "psctl")
        self.push_client = ec.binary(args.bin, "tests/integration",
                                     "push_client")

    def start(self, i):
        self.starts[i] += 1
        argv = lg.server_argv(self.args.bin, self.endpoint, RUN, "abc"[i])
        argv += [f"--checkpoint_dir={self.dirs[i]}", "--checkpoint_every_s=1"]
        if i == 2 and self.args.any_spare:
            argv = [a for a in argv if not a.startswith("--shard_index=")]
            argv.append("--shard_index=any")
        self.slots[i] = self.procs.spawn(argv, f"slot{i}.{self.starts[i]}")

    def kill(self, i):
        self.slots[i].kill()
        self.slots[i].wait(10)
        self.slots[i] = None

    def exited(self):
        """Slots whose process exited without being killed."""
        return [i for i, p in enumerate(self.slots)
                if p is not None and p.poll() is not None]

    def whole(self, deadline_s):
        """Until the group holds R caught-up replicas (psctl exits 0)."""
        give_up = time.monotonic() + deadline_s
        while time.monotonic() < give_up:
            p = subprocess.run([self.psctl, "status",
                                f"--etcd_endpoints={self.endpoint}",
                                f"--run_id={RUN}"],
                               capture_output=True, text=True, timeout=30)
            if p.returncode == 0:
                return True
            time.sleep(0.3)
        return False

    def client(self, worker_id, pushes, extra=()):
        return [self.push_client, f"--etcd_endpoints={self.endpoint}",
                f"--run_id={RUN}", "--tensors=w", f"--worker_id={worker_id}",
                f"--pushes={pushes}", "--grad=1", "--log_level=warn", *extra]

    def value(self, worker_id):
        """The tensor's value (every element equal), or None."""
        p = subprocess.run(self.client(worker_id, 0, ["--print_value"]),
                           capture_output=True, text=True, timeout=120)
        for line in p.stdout.splitlines():
            if line.startswith("value w "):
                return float(line.split()[2])
        print(f"  reading the value failed: {p.stderr.strip()[-500:]}")
        return None


def one_by_one(rng, slots, max_gap_s, act, verb, plan):
    """act(i) for each slot in order, random gaps of 0..max_gap_s between,
    written into `plan`."""
    for k, i in enumerate(slots):
        if k > 0:
            gap = rng.uniform(0, max_gap_s)
            plan.append(f"{gap:.1f}s")
            time.sleep(gap)
        act(i)
        plan.append(f"{verb} {i}")


def run_round(g, rng, n, bound_s):
    if not g.whole(60):
        print(f"round {n}: the group does not hold R before the round")
        return False
    before = g.value(10000 + n)
    if before is None:
        return False
    client = g.procs.spawn(g.client(n, 100000000), f"client{n}",
                           stdout=subprocess.PIPE)
    acks = lg.Acks(client)
    if not acks.wait_for(100, 30):
        print(f"round {n}: the client was not acknowledged")
        return False
    victims = rng.sample(range(3), rng.choice((2, 3)))
    plan = []
    one_by_one(rng, victims, 3, g.kill, "kill", plan)
    time.sleep(1.5)  # a surviving replica takes over meanwhile
    client.kill()
    client.wait(10)
    time.sleep(0.2)  # the reader thread reads the last lines
    times = acks.since(0)
    one_by_one(rng, rng.sample(victims, len(victims)), 2, g.start, "start",
               plan)
    back = g.whole(60)
    after = g.value(20000 + n) if back else None
    exited = g.exited()
    if not back or after is None or exited:
        print(f"round {n}: {' '.join(plan)}: FAIL (group back: {back}, "
              f"exited: {exited})")
        return False
    acked = len(times)
    applied = int(round(before - after))
    lost = acked - applied
    if applied < 0:
        # Older than the round's start: pushes of earlier rounds lost too.
        what = f", the group came back {-applied} pushes before the round"
        ok = False
    elif lost > 0:
        span = times[-1] - times[applied]
        what = f" (acknowledged within the last {span:.2f}s)"
        ok = span <= bound_s
    else:
        what = ""
        ok = applied <= acked + 1  # the push in flight may be applied
    print(f"round {n}: {' '.join(plan)}: {acked} acknowledged, "
          f"{max(applied, 0)} applied, {max(lost, 0)} lost{what}: "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True,
                    help="bazel-bin of a -c opt build, or a flat folder")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bound_s", type=float, default=2.0,
                    help="the most seconds of acknowledged pushes a lost "
                         "group may lose (checkpoint interval 1 s + capture)")
    ap.add_argument("--any_spare", action="store_true",
                    help="the third process is a spare of any shard "
                         "(--shard_index=any) rather than of shard 0")
    ap.add_argument("--keep", action="store_true",
                    help="keep the logs' folder")
    args = ap.parse_args()
    etcd = shutil.which("etcd")
    if etcd is None:
        print("etcd not installed (deploy/install_deps.sh installs it)")
        return 2
    ec.install_signal_handlers()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="asyncps-group-loss-")
    procs = lg.Processes(tmp)
    failed = 0
    try:
        endpoint = f"127.0.0.1:{lg.free_port()}"
        lg.start_etcd(procs, etcd, endpoint, os.path.join(tmp, "etcd"))
        g = Group(args, procs, endpoint)
        for i in range(3):
            g.start(i)
            time.sleep(2)  # the first claims, the second joins, the third
            # stands by
        creator = subprocess.run(
            g.client(9999, 0, [f"--create_elems={ELEMS}"]),
            capture_output=True, text=True, timeout=120)
        if creator.returncode != 0:
            print(f"cannot create the tensor: {creator.stderr[-500:]}")
            return 1
        for n in range(1, args.rounds + 1):
            failed += 0 if run_round(g, rng, n, args.bound_s) else 1
    finally:
        procs.stop()
        lg.leave_folder(tmp, args.keep)
    print(f"{failed} of {args.rounds} round(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
