"""The exact ledger of the nemesis runs: push_client workers, worker w
pushing w + 1 to every element `pushes` times, then a verifier that reads
every element, which must equal 1 - sum((w + 1) x pushes): no acknowledged
push lost, none applied twice (integer sums are exact in float32).

    workers = push_ledger.start_workers(h0, push_client, common, 4, 3000,
                                        ["--create_elems=1000"])
    ... nemesis ...
    failed, verified, expect = push_ledger.settle(h0, push_client, common,
                                                  workers, 3000)
"""


def start_workers(host, push_client, common, count, pushes, extra=()):
    """Starts `count` workers in `host`; `common` flags are every
    push_client's (servers or etcd, run id, tensors)."""
    return [host.spawn([push_client, *common, f"--worker_id={w}",
                        f"--pushes={pushes}", f"--grad={w + 1}", *extra],
                       name=f"worker{w}")
            for w in range(count)]


def step_flags(args):
    """The push_client flags of a nemesis run's --steps: each push sent
    with the next round's pull, one StepStream request per shard."""
    return ["--steps"] if args.steps else []


def settle(host, push_client, common, workers, pushes):
    """Waits for the workers (printing each that did not exit 0 with every
    push acknowledged) and runs the verifier. Returns (workers failed,
    whether the verifier read the exact sum, that sum)."""
    failed = 0
    for w, proc in enumerate(workers):
        code = proc.wait(300)
        acked = proc.log_text().count("acked ")
        if code != 0 or acked != pushes:
            failed += 1
            print(f"worker {w}: exit {code}, {acked} of {pushes} "
                  f"acknowledged:\n{proc.log_text()[-2000:]}")
    expect = 1 - sum((w + 1) * pushes for w in range(len(workers)))
    verifier = host.spawn([push_client, *common, "--worker_id=99",
                           "--pushes=0", f"--expect={expect}"],
                          name="verifier")
    code = verifier.wait(120)
    print(verifier.log_text().strip())
    return failed, code == 0, expect
