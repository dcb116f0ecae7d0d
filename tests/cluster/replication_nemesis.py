#!/usr/bin/env python3
"""Replicated shards under a nemesis on the emulated multi-host cluster.

Six hosts (network namespaces on one bridge, emulated_cluster.py): h0 runs
the workers, h5 etcd; h1..h4 run a 2-shard x R=2 cluster (shard 0 on h1 and
h2, shard 1 on h3 and h4, each replica with its host's label); with
--replicas R, hosts h1..h2R hold the two groups and h(2R+1) etcd, and the
nemesis may also kill two replicas of one group 0.5 s apart (R >= 3). Workers
(tests/integration:push_client, following the shard map in etcd) push
integer gradients (worker w pushes w + 1 to every element), so the sums are
exact in float32. Every --every seconds the nemesis picks one of: kill -9 a
random server process, kill -9 every process of a random server host, cut a
random server host off from everyone for a few seconds, split it from its
shard's other replica and etcd only (the workers still reach it: an old
primary that keeps receiving pushes must acknowledge none once its backup
took over), or kill -9 etcd and start it again on its data 2-4 s later
(every replica loses its lease: each must keep its state and resume its
role); a killed server process is started again (it rejoins as a spare).
With --etcd_members 3 etcd is a cluster of three members on hosts of their
own (every process is given all three), "etcd away" kills every member,
and two more events strike one member: kill -9 it and start it again 2-4 s
later, or cut its host off from everyone for a few seconds (a member that
stops answering with its connections open: the processes using it must
move to another without losing their leases or the run's progress). With
--scale the run is slotted (64 slots, on shard 0 at first) and each event
also moves slots between the groups: `psctl scale` (through etcd) to 2 or
back to 1 group, started up to 0.5 s before the nemesis strikes; a scale
may fail, and must leave its move committed or rolled back; one more scale
to 2 without a nemesis must succeed at the end. With --spares K, K hosts
after etcd's run a spare of any shard each (ps_server --shard_index=any):
they stand by, join a group that lost a replica (the killed process, started
again, then stands by in its place), and are struck like the others. At the
end the workers must all
have exited 0 with every push acknowledged, a verifier reads every
element: it must equal 1 - sum(grad x pushes) exactly (0 pushes lost, 0
applied twice), and `psctl status --digests` must find every group back
at R caught-up replicas with equal state digests (within a minute).

With --mlp EPOCHS the workers are ps_worker processes training the MLP on
Fashion-MNIST through the map instead (no ledger): each must exit 0, and
the run prints the final test accuracy and the examples/s, to compare with
an undisturbed run of the same flags and --seconds 0.

  tests/cluster/replication_nemesis.py --bin "$(bazel info bazel-bin)" \\
      [--seconds 60] [--every 4] [--workers 4] [--pushes 3000] [--scale]
      [--mlp EPOCHS] [--etcd_members 3] [--keep]

Needs root (namespaces). Prints one line per nemesis event and a closing
"ledger: ..." line; exits 1 on any violation. The logs' folder (named at the
start) is removed when the run passes, unless --keep.
"""

import argparse
import os
import random
import re
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import emulated_cluster as ec  # noqa: E402
import push_ledger  # noqa: E402

PORT = 7000
ETCD_PORT = 2379


def start_trainers(cluster, host, args, endpoint):
    """ps_worker processes training the MLP through the map in etcd."""
    ps_worker = ec.binary(args.bin, "worker", "ps_worker")
    tmp = os.path.join(cluster.log_dir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, TMPDIR=tmp, OPENBLAS_NUM_THREADS="1")
    return [host.spawn([ps_worker, f"--etcd_endpoints={endpoint}",
                        "--run_id=nemesis", f"--worker_id={w}",
                        f"--num_workers={args.workers}",
                        f"--epochs={args.mlp}"], name=f"worker{w}", env=env)
            for w in range(args.workers)]


def settle_trainers(workers):
    """Waits for the trainers; prints each one's exit status, examples/s
    and the final test accuracy. Returns how many did not exit 0."""
    failed = 0
    for w, proc in enumerate(workers):
        code = proc.wait(900)
        text = proc.log_text()
        rate = re.findall(r"done: .* ([0-9]+) examples/s", text)
        accuracy = re.findall(r"^final test accuracy: ([0-9.]+)$", text,
                              re.MULTILINE)
        print(f"worker {w}: exit {code}, "
              f"{rate[-1] if rate else '?'} examples/s, final test accuracy "
              f"{accuracy[-1] if accuracy else '-'}", flush=True)
        if code != 0:
            failed += 1
            print(text[-2000:])
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="bazel-bin (or a flat dir)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--every", type=float, default=4)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pushes", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", action="store_true",
                    help="workers send each push with the next pull "
                    "(StepStream)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the logs' folder also when the run passes")
    ap.add_argument("--replicas", type=int, default=2,
                    help="R: processes per shard group (hosts 1..2R); with "
                    "R >= 3 the nemesis also kills two replicas of one "
                    "group 0.5 s apart")
    ap.add_argument("--mlp", type=int, default=0, metavar="EPOCHS",
                    help="train the MLP for EPOCHS epochs instead of the "
                    "ledger's pushes")
    ap.add_argument("--scale", action="store_true",
                    help="move slots between the groups at every event")
    ap.add_argument("--spares", type=int, default=0, metavar="K",
                    help="K more server processes of --shard_index=any, each "
                    "on a host of its own (after etcd's), which stand by and "
                    "join a group that loses a replica; the nemesis strikes "
                    "them too")
    ap.add_argument("--etcd_members", type=int, default=1, choices=(1, 3),
                    help="etcd members, each on a host of its own; with 3 "
                    "the nemesis also kills or cuts off one member")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    ps_server = ec.binary(args.bin, "server", "ps_server")
    push_client = ec.binary(args.bin, "tests/integration", "push_client")
    psctl = ec.binary(args.bin, "tools", "psctl")
    slotted = ["--num_slots=64", "--serving_shards=1"] if args.scale else []
    # Moves carry slices of a tensor of 2000 slices.
    elems = 200000 if args.scale else 1000
    etcd = shutil.which("etcd")
    if etcd is None:
        print("etcd not installed (deploy/install_deps.sh installs it)")
        return 1
    ec.install_signal_handlers()
    r = args.replicas
    server_hosts = list(range(1, 2 * r + 1))
    etcd_hosts = list(range(2 * r + 1, 2 * r + 1 + args.etcd_members))
    spare_hosts = [etcd_hosts[-1] + 1 + k for k in range(args.spares)]
    num_hosts = 2 * r + 1 + args.etcd_members + args.spares
    with ec.EmulatedCluster(num_hosts, log=print) as c:
        h0 = c.host(0)
        members = [c.host(h) for h in etcd_hosts]
        endpoint = ",".join(f"{m.ip}:{ETCD_PORT}" for m in members)
        initial = ",".join(f"n{i}=http://{m.ip}:2380"
                           for i, m in enumerate(members))

        def start_etcd(i):
            m = members[i]
            return m.spawn(
                [etcd, f"--name=n{i}", f"--data-dir={c.log_dir}/etcd{i}",
                 f"--listen-client-urls=http://{m.ip}:{ETCD_PORT}",
                 f"--advertise-client-urls=http://{m.ip}:{ETCD_PORT}",
                 f"--listen-peer-urls=http://{m.ip}:2380",
                 f"--initial-advertise-peer-urls=http://{m.ip}:2380",
                 f"--initial-cluster={initial}",
                 "--heartbeat-interval=50", "--election-timeout=500",
                 "--pre-vote=true",  # as deploy/k8s/replicated runs it
                 "--log-level=warn"], name=f"etcd{i}")

        etcd_processes = [start_etcd(i) for i in range(len(members))]
        time.sleep(2)

        def start_server(h):
            host = c.host(h)
            shard = "any" if h in spare_hosts else (h - 1) // r
            return host.spawn(
                [ps_server, f"--host={host.ip}", f"--port={PORT}",
                 f"--shard_index={shard}", "--num_shards=2",
                 f"--replicas={r}", f"--etcd_endpoints={endpoint}",
                 "--run_id=nemesis", f"--host_label={host.name}"] + slotted,
                name="ps_server")

        firsts = (1, 1 + r)
        servers = {h: start_server(h) for h in firsts}
        time.sleep(2)  # the first of each group claims it
        servers.update({h: start_server(h) for h in server_hosts
                        if h not in firsts})
        time.sleep(3)
        servers.update({h: start_server(h) for h in spare_hosts})
        common = [f"--etcd_endpoints={endpoint}", "--run_id=nemesis",
                  "--tensors=w", "--log_level=warn"]
        if args.mlp:
            workers = start_trainers(c, h0, args, endpoint)
        else:
            workers = push_ledger.start_workers(
                h0, push_client, common, args.workers, args.pushes,
                [f"--create_elems={elems}", *push_ledger.step_flags(args)])

        def scale(to, name):
            return h0.spawn([psctl, "scale", f"--etcd_endpoints={endpoint}",
                             "--run_id=nemesis", f"--shards={to}"], name=name)

        def whole(deadline_s):
            # Every group at R caught-up replicas (psctl status exits 0).
            give_up = time.monotonic() + deadline_s
            while True:
                p = h0.spawn([psctl, "status", f"--etcd_endpoints={endpoint}",
                              "--run_id=nemesis", "-o", "json"],
                             name="whole")
                if p.wait(30) == 0:
                    return True
                if time.monotonic() > give_up:
                    return False
                time.sleep(0.5)

        end = time.monotonic() + args.seconds
        events = scales_ok = not_whole = 0
        while time.monotonic() < end and any(w.alive() for w in workers):
            time.sleep(args.every)
            # R replicas survive R - 1 faults at a time: the next one waits
            # until every group is whole again (a replica cut off long
            # enough to be dropped, then the other one killed, is two).
            if not whole(60):
                not_whole += 1
                print("nemesis: a group is still below R caught-up replicas "
                      "after 60 s", flush=True)
            events += 1
            h = rng.choice(server_hosts + spare_hosts)
            kinds = ["kill process", "kill host", "partition", "split",
                     "etcd away"]
            if args.etcd_members > 1:
                kinds += ["etcd member away", "etcd member cut"]
            kind = rng.choice(kinds + (["double kill"] if r >= 3 else []))
            # Which group a spare is in (if any) is the map's: it is cut
            # off from everyone, or killed.
            if h in spare_hosts:
                kind = {"split": "partition",
                        "double kill": "kill process"}.get(kind, kind)
            mover = None
            if args.scale:
                to = 1 + events % 2
                lead = rng.uniform(0, 0.5)
                print(f"nemesis {events}: scale to {to}, {kind} h{h} "
                      f"{lead:.2f} s later", flush=True)
                mover = scale(to, f"scale{events}")
                time.sleep(lead)
            else:
                print(f"nemesis {events}: {kind} h{h}", flush=True)
            if kind in ("partition", "split"):
                group = (h - 1) // r
                partners = [i for i in server_hosts
                            if (i - 1) // r == group and i != h]
                others = (partners + etcd_hosts if kind == "split" else
                          [i for i in range(num_hosts) if i != h])
                c.partition([h], others)
                time.sleep(3)
                c.heal()
            elif kind == "double kill":
                # Two replicas of one group, the second before the first
                # came back and caught up: R - 1 = 2 may be lost.
                group = (h - 1) // r
                second = rng.choice([i for i in server_hosts
                                     if (i - 1) // r == group and i != h])
                servers[h].signal(9)
                time.sleep(0.5)
                servers[second].signal(9)
                for k in (h, second):
                    servers[k].wait(10)
                    servers[k] = start_server(k)
            elif kind == "etcd away":
                # Every replica loses its lease: each must keep its state
                # and resume its role once etcd is back (same data).
                for p in etcd_processes:
                    p.signal(9)
                for p in etcd_processes:
                    p.wait(10)
                time.sleep(rng.uniform(2, 4))
                etcd_processes = [start_etcd(i) for i in range(len(members))]
            elif kind == "etcd member away":
                m = rng.randrange(len(members))
                print(f"  etcd member n{m} killed", flush=True)
                etcd_processes[m].signal(9)
                etcd_processes[m].wait(10)
                time.sleep(rng.uniform(2, 4))
                etcd_processes[m] = start_etcd(m)
            elif kind == "etcd member cut":
                m = rng.randrange(len(members))
                print(f"  etcd member n{m} cut off", flush=True)
                c.partition([etcd_hosts[m]],
                            [i for i in range(num_hosts)
                             if i != etcd_hosts[m]])
                time.sleep(3)
                c.heal()
            elif kind == "kill host":
                c.kill_host(h)
                servers[h] = start_server(h)
            else:
                servers[h].signal(9)
                servers[h].wait(10)
                servers[h] = start_server(h)
            if mover is not None:
                code = mover.wait(180)
                scales_ok += code == 0
                tail = mover.log_text().strip().splitlines()[-1:] or [""]
                print(f"  psctl scale: exit {code}: {tail[0]}", flush=True)

        final = 0
        if args.scale:
            for attempt in range(10):  # a failover may still be under way
                p = scale(2, f"final_scale{attempt}")
                final = p.wait(180)
                if final == 0:
                    break
                time.sleep(2)
            print(f"final psctl scale --shards=2: exit {final}: "
                  f"{p.log_text().strip()[-300:]}", flush=True)

        if args.mlp:
            failed, verified, expect = settle_trainers(workers), True, None
        else:
            failed, verified, expect = push_ledger.settle(
                h0, push_client, common, workers, args.pushes)
        # Every group back to R caught-up replicas, with equal state
        # digests at one entry (psctl status --digests exits 0); restarted
        # spares may still be catching up: up to a minute.
        digests = None
        for attempt in range(30):
            p = h0.spawn([psctl, "status", f"--etcd_endpoints={endpoint}",
                          "--run_id=nemesis", "--digests"],
                         name=f"digests{attempt}")
            digests = p.wait(60)
            if digests == 0:
                break
            time.sleep(2)
        print(f"psctl status --digests: exit {digests}:\n"
              f"{p.log_text().strip()[-1500:]}", flush=True)
        ok = (failed == 0 and verified and final == 0 and digests == 0
              and not_whole == 0)
        if ok and not args.keep:
            c.passed()  # its logs go with it
        moved = f" ({scales_ok} scales completed)" if args.scale else ""
        if args.mlp:
            print(f"mlp: {args.workers} workers x {args.mlp} epochs through "
                  f"{events} nemesis events{moved}: {failed} worker(s) "
                  f"failed; final scale exit {final}; digests exit {digests}; "
                  f"{not_whole} strike(s) on a group not whole")
            return 0 if ok else 1
        print(f"ledger: {args.workers} workers x {args.pushes} pushes through "
              f"{events} nemesis events{moved}: "
              f"{'every' if failed == 0 else 'NOT every'} "
              f"push acknowledged; final values "
              f"{'equal' if verified else 'DIFFER from'} {expect} "
              f"(0 lost, 0 applied twice); replica digests equal" if ok else
              f"ledger: VIOLATED (workers failed {failed}, verifier "
              f"{'read' if verified else 'did NOT read'} {expect}, final "
              f"scale exit {final}, digests exit {digests}, "
              f"{not_whole} strike(s) on a group not whole)")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
