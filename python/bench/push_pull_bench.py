#!/usr/bin/python3
"""Python binding vs C++ PsClient: pull and push throughput of one tensor.

Starts ps_server shards on loopback (port 0), creates one SGD tensor of
--bytes bytes, then, in every repetition and for each of pull and push,
times the same loop twice against the same shards: once through the
Python binding (Client.pull_into / Client.push) and once through the C++
PsClient (cpp_push_pull, a separate process). The order alternates between
repetitions. Prints one line per measurement, the medians and the ratio:

    op=pull impl=python mb_per_s=3012.4 (median of 5)
    op=pull impl=cpp mb_per_s=3150.2 (median of 5)
    op=pull ratio_python_over_cpp=0.956

Build first (any config; -c opt for numbers worth quoting):
    bazel build -c opt //server:ps_server //python:asyncps \\
        //python/bench:cpp_push_pull
    /usr/bin/python3 python/bench/push_pull_bench.py \\
        --bin "$(bazel info -c opt bazel-bin)"
"""

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bin", default="",
                   help="bazel-bin folder (default: `bazel info bazel-bin`)")
    p.add_argument("--bytes", type=int, default=4 << 20,
                   help="tensor size in bytes (a multiple of 4)")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0,
                   help="length of one timed loop")
    p.add_argument("--server_args", default="",
                   help="extra ps_server flags, space-separated")
    args = p.parse_args()
    if args.bytes <= 0 or args.bytes % 4:
        p.error("--bytes must be a positive multiple of 4")
    if args.shards < 1 or args.reps < 1 or args.seconds <= 0:
        p.error("--shards, --reps and --seconds must be positive")
    if not args.bin:
        args.bin = subprocess.run(["bazel", "info", "bazel-bin"], check=True,
                                  capture_output=True, text=True).stdout.strip()
    return args


def start_shards(args, tmp):
    procs, servers = [], []
    for i in range(args.shards):
        port_file = os.path.join(tmp, f"shard{i}.port")
        log = open(os.path.join(tmp, f"shard{i}.log"), "wb")
        procs.append(subprocess.Popen(
            [os.path.join(args.bin, "server/ps_server"), f"--shard_index={i}",
             f"--num_shards={args.shards}", "--host=127.0.0.1", "--port=0",
             f"--port_file={port_file}", *args.server_args.split()],
            stdout=log, stderr=subprocess.STDOUT))
        log.close()
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file)
                   and open(port_file).read().endswith("\n")):
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shard {i} did not start; see {tmp}")
            time.sleep(0.01)
        servers.append(f"127.0.0.1:{int(open(port_file).read())}")
    return procs, servers


def python_loop(client, name, buf, op, seconds):
    """MB/s of `op` through the binding: the same loop as cpp_push_pull."""
    for _ in range(2):
        client.pull_into({name: buf}, clock=0)
    call = ((lambda: client.pull_into({name: buf}, clock=0)) if op == "pull"
            else (lambda: client.push({name: buf}, clock=0)))
    for _ in range(2):
        call()
    start, calls, elapsed = time.perf_counter(), 0, 0.0
    while elapsed < seconds:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
    return buf.nbytes * calls / elapsed / 1e6


def cpp_loop(args, servers, name, op, worker_id):
    """MB/s of `op` through PsClient, in a fresh process. Every run gets its
    own worker id: a new process of the same id would need a higher
    incarnation than the last one's random one."""
    run = subprocess.run(
        [os.path.join(args.bin, "python/bench/cpp_push_pull"),
         f"--servers={','.join(servers)}", f"--tensor={name}", f"--op={op}",
         f"--seconds={args.seconds}", f"--worker_id={worker_id}"],
        capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"cpp_push_pull failed: {run.stderr.strip()}")
    fields = dict(kv.split("=") for kv in run.stdout.split())
    return float(fields["mb_per_s"])


def main():
    args = parse_args()
    sys.path.insert(0, os.path.join(args.bin, "python/site"))
    import numpy as np

    import asyncps

    asyncps.tune_malloc_for_large_messages()  # as the C++ side does
    with tempfile.TemporaryDirectory(prefix="asyncps-bench.") as tmp:
        procs, servers = start_shards(args, tmp)
        try:
            name = "bench"
            elems = args.bytes // 4
            with asyncps.Client(servers, worker_id=0) as client:
                client.create({name: asyncps.TensorSpec((elems,), lr=1e-6)})
                buf = np.zeros(elems, np.float32)
                print(f"shards={args.shards} bytes={args.bytes} reps={args.reps} "
                      f"seconds={args.seconds}", flush=True)
                results = {}
                cpp_ids = itertools.count(1)
                for rep in range(args.reps):
                    for op in ("pull", "push"):
                        order = ("python", "cpp") if rep % 2 == 0 else ("cpp", "python")
                        for impl in order:
                            mbs = (python_loop(client, name, buf, op, args.seconds)
                                   if impl == "python"
                                   else cpp_loop(args, servers, name, op,
                                                 next(cpp_ids)))
                            results.setdefault((op, impl), []).append(mbs)
                            print(f"rep={rep} op={op} impl={impl} "
                                  f"mb_per_s={mbs:.1f}", flush=True)
                for op in ("pull", "push"):
                    med = {impl: statistics.median(results[(op, impl)])
                           for impl in ("python", "cpp")}
                    for impl in ("python", "cpp"):
                        print(f"op={op} impl={impl} mb_per_s={med[impl]:.1f} "
                              f"(median of {args.reps})")
                    print(f"op={op} ratio_python_over_cpp="
                          f"{med['python'] / med['cpp']:.3f}", flush=True)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
