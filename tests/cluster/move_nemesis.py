#!/usr/bin/env python3
"""Live slot moves under network partitions on the emulated multi-host cluster.

Five hosts (network namespaces on one bridge, emulated_cluster.py): h0 runs
the workers and psctl, h1..h4 one shard process each (a run of 4 shard
processes, 64 slots, slots on shards 0 and 1 at first: --serving_shards=2).
Workers (tests/integration:push_client) push integer gradients (worker w
pushes w + 1 to every element of a 2000-slice tensor), so the sums are exact
in float32. Over and over, `psctl scale` moves slots to 3, 4 or 2 shards
while the workers train, and from up to 1 s before the move to 0.5 s into
it the nemesis cuts the move's source (a shard that gives slots away) off: from everyone,
from the destinations only, or from the workers only, for a few seconds,
then heals. A scale may fail (psctl exits non-zero and says why); the move
it was in must then end one way or the other (committed or rolled back),
never half. At the end one more `psctl scale --shards=2` without a
nemesis must succeed, every worker must have exited 0 with every push
acknowledged, and a verifier reads every element: it must equal
1 - sum(grad x pushes) exactly (0 pushes lost, 0 applied twice).

  tests/cluster/move_nemesis.py --bin "$(bazel info bazel-bin)" \\
      [--seconds 60] [--workers 2] [--pushes 6000] [--keep]

Needs root (namespaces). Prints one line per scale and nemesis event and a
closing "ledger: ..." line; exits 1 on any violation. The logs' folder (named at the
start) is removed when the run passes, unless --keep.
"""

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import emulated_cluster as ec  # noqa: E402
import push_ledger  # noqa: E402

PORT = 7000
SHARDS = 4
# The shards that give slots away when the serving set goes from `before`
# to `after` shards (psctl's plan keeps shards 0..after-1 serving).
SCALES = (3, 4, 2)


def sources(before, after):
    """Shard indices that lose slots going from `before` to `after` shards."""
    if after < before:
        return list(range(after, before))
    return list(range(before))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="bazel-bin (or a flat dir)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pushes", type=int, default=6000)
    ap.add_argument("--cut", type=float, default=3,
                    help="seconds a source stays cut off")
    ap.add_argument("--keep", action="store_true",
                    help="keep the logs' folder also when the run passes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", action="store_true",
                    help="workers send each push with the next pull "
                    "(StepStream)")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    ps_server = ec.binary(args.bin, "server", "ps_server")
    push_client = ec.binary(args.bin, "tests/integration", "push_client")
    psctl = ec.binary(args.bin, "tools", "psctl")
    ec.install_signal_handlers()
    with ec.EmulatedCluster(1 + SHARDS, log=print) as c:
        h0 = c.host(0)
        addresses = [f"{c.host(1 + i).ip}:{PORT}" for i in range(SHARDS)]
        servers = ",".join(addresses)
        shards = [
            c.host(1 + i).spawn(
                [ps_server, f"--host={c.host(1 + i).ip}", f"--port={PORT}",
                 f"--shard_index={i}", f"--num_shards={SHARDS}",
                 "--num_slots=64", "--serving_shards=2", "--run_id=moves"],
                name="ps_server")
            for i in range(SHARDS)]
        for s in shards:
            s.wait_for_log(r"serving on", 30)
        common = [f"--servers={servers}", "--run_id=moves", "--tensors=w",
                  "--log_level=warn"]
        workers = push_ledger.start_workers(h0, push_client, common,
                                            args.workers, args.pushes,
                                            ["--create_elems=200000",
                                             *push_ledger.step_flags(args)])

        def scale(to, name):
            return h0.spawn([psctl, "scale", f"--servers={servers}",
                             f"--shards={to}"], name=name)

        serving = 2
        end = time.monotonic() + args.seconds
        events = scales_ok = scales_failed = 0
        while time.monotonic() < end and any(w.alive() for w in workers):
            to = SCALES[events % len(SCALES)]
            events += 1
            source = rng.choice(sources(serving, to) if serving is not None
                                else list(range(SHARDS)))
            kind = rng.choice(["everyone", "destinations", "workers and psctl"])
            if kind == "everyone":
                others = [i for i in range(1 + SHARDS) if i != 1 + source]
            elif kind == "workers and psctl":
                others = [0]
            else:
                others = [1 + i for i in range(SHARDS) if i != source]
            # The cut starts up to 1 s before the scale (the move starts
            # against an unreachable source) or up to 0.5 s into it.
            lead = rng.uniform(-1.0, 0.5)
            print(f"event {events}: scale {serving or '?'} -> {to}; cut shard "
                  f"{source} (h{1 + source}) off from {kind} for {args.cut} s, "
                  f"{lead:+.2f} s from the scale's start", flush=True)
            if lead < 0:
                c.partition([1 + source], others)
                time.sleep(-lead)
                p = scale(to, f"scale{events}")
                time.sleep(args.cut + lead)
            else:
                p = scale(to, f"scale{events}")
                time.sleep(lead)
                c.partition([1 + source], others)
                time.sleep(args.cut)
            c.heal()
            code = p.wait(180)
            tail = p.log_text().strip().splitlines()[-1:] or [""]
            print(f"  psctl scale --shards={to}: exit {code}: {tail[0]}",
                  flush=True)
            if code == 0:
                scales_ok += 1
                serving = to
            else:
                # The map stands wherever the failed scale left it: the next
                # cut picks among every shard.
                scales_failed += 1
                serving = None

        p = scale(2, "final_scale")
        final = p.wait(180)
        print(f"final psctl scale --shards=2: exit {final}: "
              f"{p.log_text().strip()[-300:]}")
        failed, verified, expect = push_ledger.settle(
            h0, push_client, common, workers, args.pushes)
        ok = failed == 0 and verified and final == 0
        if ok and not args.keep:
            c.passed()  # its logs go with it
        print(f"ledger: {args.workers} workers x {args.pushes} pushes through "
              f"{events} scales ({scales_ok} completed, {scales_failed} "
              f"failed under the nemesis): every push acknowledged; final "
              f"values equal {expect} (0 lost, 0 applied twice)" if ok else
              f"ledger: VIOLATED (workers failed {failed}, verifier "
              f"{'read' if verified else 'did NOT read'} {expect}, final "
              f"scale exit {final})")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
