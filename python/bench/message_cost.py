#!/usr/bin/python3
"""Per-call CPU of the Python client: pulls and pushes of 4 floats, 100k
floats and a whole 784-128-10 MLP (its four parameters in one call, a push
and the next pull as one call (push_pull_into), and through
asyncps.torch.Worker.step with an empty closure), against real
ps_server shards on loopback.

Each measurement runs in a fresh process (its own worker id) that loops
the call for --seconds and prints the process's CPU time per call (every
thread of the client: Python, the binding, gRPC) and the wall time per
call; the shards' CPU per call is read from /proc around it. Builds given
with --site NAME=DIR (a folder holding the asyncps package, e.g. a copy of
bazel-bin/python/site from another commit) alternate in every repetition,
so that a before/after comparison shares the machine's load. The bare
bound is measured beside them when python/bench:cpp_push_pull is built:
the same pulls and pushes through the C++ PsClient (site cpp), and an
empty unary RPC to every shard from C++ (case bare_heartbeat, the
Heartbeat RPC), what one gRPC call costs here. Prints one line per
measurement, then the medians and, for every build after the first (and
the C++ client), the median ratio of its client CPU per call to the first
build's within each repetition:

    case=pull4 site=new client_us=76.7 wall_us=186.0 shard_us=65.2 (median of 7)
    case=pull4 client_us new/base=0.86 (median of 7 paired ratios, 0.60-0.95)

Build first, then run (in the source tree):
    bazel build //server:ps_server //python:asyncps //python/bench:cpp_push_pull
    /usr/bin/python3 python/bench/message_cost.py \\
        --site base=/tmp/base/site --site new=bazel-bin/python/site
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = ("pull4", "push4", "pull100k", "push100k", "model_pull",
         "model_push", "model_step", "torch_step")
# The 784-128-10 MLP's parameters, as asyncps.torch names them.
# The cases the C++ PsClient runs too (cpp_push_pull --op, --tensor), and
# an empty RPC: the bare cost of a call from C++.
CPP_CASES = {"pull4": ("pull", "t4"), "push4": ("push", "t4"),
             "pull100k": ("pull", "t100k"), "push100k": ("push", "t100k"),
             "bare_heartbeat": ("heartbeat", "t4")}
MLP = {"0.weight": (128, 784), "0.bias": (128,), "2.weight": (10, 128),
       "2.bias": (10,)}


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bin", default="bazel-bin",
                   help="bazel-bin folder holding server/ps_server (and "
                   "python/bench/cpp_push_pull for the bare figure)")
    p.add_argument("--site", action="append", default=[],
                   help="NAME=DIR of a build of the package; repeat to "
                   "alternate builds (default: new=BIN/python/site)")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0,
                   help="length of one measured loop")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--servers", default="", help=argparse.SUPPRESS)
    p.add_argument("--worker_id", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.site:
        args.site = [f"new={os.path.join(args.bin, 'python/site')}"]
    args.sites = dict(s.split("=", 1) for s in args.site)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = set(args.cases) - set(CASES)
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    return args


# ------------------------------------------------------------ the child


def child_call(client, case, np):
    """The call `case` measures, as a function of no arguments."""
    if case in ("pull4", "push4"):
        buf = {"t4": np.ones(4, np.float32)}
    elif case in ("pull100k", "push100k"):
        buf = {"t100k": np.ones(100000, np.float32)}
    else:
        buf = {n: np.full(s, 1e-3, np.float32) for n, s in MLP.items()}
    if case.startswith("pull") or case == "model_pull":
        return lambda: client.pull_into(buf, clock=0)
    if case.startswith("push") or case == "model_push":
        client.pull_into(buf, clock=0)  # what the pushes are tagged with
        return lambda: client.push(buf, clock=0)
    if case == "model_step":
        client.pull_into(buf, clock=0)
        grads = {n: b.copy() for n, b in buf.items()}
        return lambda: client.push_pull_into(grads, buf, clock=0)
    import torch

    import asyncps.torch
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    worker = asyncps.torch.Worker(model, client, create=False)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    return lambda: worker.step(lambda: None)


def child(args):
    import numpy as np

    import asyncps
    asyncps.tune_malloc_for_large_messages()
    with asyncps.Client(args.servers.split(","),
                        worker_id=args.worker_id) as client:
        client.wait_for(["t4", "t100k", *MLP])
        call = child_call(client, args.child, np)
        for _ in range(20):  # warm: connections, caches
            call()
        calls = 0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - wall0 < args.seconds:
            for _ in range(10):
                call()
            calls += 10
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"calls": calls, "cpu_s": cpu, "wall_s": wall}))
    return 0


# ------------------------------------------------------------ the parent


def cpu_of(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(args, site, case, servers, shards, worker_id):
    """{client_us, wall_us, shard_us} per call of `case` through the
    package in `site`, or through the C++ PsClient when site is None."""
    if site is None:
        op, tensor = CPP_CASES[case]
        command = [os.path.join(args.bin, "python/bench/cpp_push_pull"),
                   f"--servers={','.join(servers)}", f"--tensor={tensor}",
                   f"--op={op}", f"--seconds={args.seconds}",
                   f"--worker_id={worker_id}"]
        env = None
    else:
        command = [sys.executable, os.path.abspath(__file__),
                   f"--child={case}", f"--servers={','.join(servers)}",
                   f"--worker_id={worker_id}", f"--seconds={args.seconds}"]
        env = dict(os.environ, PYTHONPATH=site, OMP_NUM_THREADS="1")
    before = sum(cpu_of(p.proc.pid) for p in shards)
    run = subprocess.run(command, env=env, capture_output=True, text=True,
                         timeout=300)
    shard_cpu = sum(cpu_of(p.proc.pid) for p in shards) - before
    if run.returncode != 0:
        raise RuntimeError(f"{case} with {site or 'C++'} failed:\n"
                           f"{run.stderr}")
    if site is None:
        fields = dict(kv.split("=") for kv in run.stdout.split())
        n = int(fields["calls"])
        r = {"calls": n, "wall_s": float(fields["seconds"]),
             "cpu_s": float(fields["cpu_us_per_call"]) * n * 1e-6}
    else:
        r = json.loads(run.stdout.strip().splitlines()[-1])
        n = r["calls"]
    # Shard CPU over the whole child (its start-up included), per call of
    # the loop: an upper bound.
    return {"client_us": 1e6 * r["cpu_s"] / n, "wall_us": 1e6 * r["wall_s"] / n,
            "shard_us": 1e6 * shard_cpu / n}


def print_ratios(results, first):
    """Client CPU per call of every other build (and of C++) over the first
    site's, as the median of the ratios within each repetition: runs next
    to each other share the machine's load, whose drift the medians of
    absolute figures do not cancel."""
    for (case, name), rs in sorted(results.items()):
        base = results.get((case, first))
        if name == first or base is None:
            continue
        ratios = [r["client_us"] / b["client_us"] for r, b in zip(rs, base)]
        print(f"case={case} client_us {name}/{first}="
              f"{statistics.median(ratios):.2f} (median of {len(ratios)} "
              f"paired ratios, {min(ratios):.2f}-{max(ratios):.2f})")


def main():
    args = parse_args()
    if args.child:
        return child(args)
    first_site = next(iter(args.sites.values()))
    sys.path.insert(0, first_site)
    import asyncps
    from asyncps.cluster import LocalCluster
    ps_server = os.path.join(args.bin, "server/ps_server")
    with tempfile.TemporaryDirectory(prefix="asyncps-cost.") as tmp:
        with LocalCluster(args.shards, ps_server=ps_server,
                          workdir=tmp) as cluster:
            servers = cluster.addresses
            with asyncps.Client(servers, worker_id=0) as c:
                specs = {"t4": asyncps.TensorSpec((4,), lr=1e-9),
                         "t100k": asyncps.TensorSpec((100000,), lr=1e-9)}
                specs.update((n, asyncps.TensorSpec(s, lr=1e-9, init="zeros"))
                             for n, s in MLP.items())
                c.create(specs)
            print(f"shards={args.shards} reps={args.reps} "
                  f"seconds={args.seconds} sites={args.sites}", flush=True)
            cpp = os.path.exists(
                os.path.join(args.bin, "python/bench/cpp_push_pull"))
            runs = [(case, name, site) for case in args.cases
                    for name, site in args.sites.items()]
            if cpp:
                runs += [(case, "cpp", None) for case in CPP_CASES
                         if case in args.cases or case == "bare_heartbeat"]
            results = {}
            worker_id = 1
            for rep in range(args.reps):
                for case, name, site in (runs if rep % 2 == 0 else
                                         reversed(runs)):
                    r = measure(args, site, case, servers, cluster.shards,
                                worker_id)
                    worker_id += 1
                    results.setdefault((case, name), []).append(r)
                    print(f"rep={rep} case={case} site={name} " +
                          " ".join(f"{k}={v:.1f}" for k, v in r.items()),
                          flush=True)
            for (case, name), rs in sorted(results.items()):
                med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                print(f"case={case} site={name} " +
                      " ".join(f"{k}={v:.1f}" for k, v in med.items()) +
                      f" (median of {len(rs)})")
            print_ratios(results, list(args.sites)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
