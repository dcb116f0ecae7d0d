"""Ctrl-C ends any blocking call of asyncps.Client promptly.

Each case runs a script in its own Python process (signals go to a
process's main thread), sends it SIGINT once its call blocks, and checks
that the call ended with KeyboardInterrupt, long before its deadline. The
script prints how long the call lasted after the signal; the tests bound it
by deadlines that only catch a hang.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import addresses, wait_until

SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import asyncps
    servers, mode = sys.argv[1], sys.argv[2]
    c = asyncps.Client(servers, 1, rpc_timeout=300, call_deadline=300)
    spec = asyncps.TensorSpec((4,), init="constant", init_value=1.0, lr=1.0)
    out = {"t": np.zeros(4, np.float32)}
    if mode in ("pull", "step"):
        c.wait_for(["t"], timeout=30)
    if mode == "step":
        c.pull_into(out, clock=0)
    print("blocking", flush=True)
    start = time.monotonic()
    try:
        if mode == "create":
            c.create({"t": spec})
        elif mode == "step":
            # The push applies; the pull for clock 1 that rides with it waits.
            c.push_pull_into({"t": np.ones(4, np.float32)}, out, clock=0)
        else:
            c.pull(["t"], clock=1)
        print("returned", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted {time.monotonic() - start:.3f}", flush=True)
""")


def run_and_interrupt(tmp_path, servers, mode):
    script = tmp_path / "block.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{mode}.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, str(script), servers, mode],
                                stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ))
    try:
        wait_until(lambda: "blocking" in out.read_text(), 60, "the call")
        time.sleep(1.0)  # well inside the call
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        waited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    print(f"{mode}: the process ended {waited:.3f} s after SIGINT\n{text}")
    assert "interrupted" in text, text
    assert "returned" not in text
    assert proc.returncode == 0
    return waited


def test_ctrl_c_ends_a_create_against_shards_that_do_not_answer(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lasted = run_and_interrupt(tmp_path, f"127.0.0.1:{port}", "create")
    assert lasted < 30  # the call's own deadline is 300 s


def bsp_shard_and_a_worker_at_clock_0(cluster):
    """One BSP shard holding "t" and a client live there at clock 0 (the
    returned Client, to close), so that a pull for clock 1 waits."""
    import asyncps
    shards = cluster.start(1, ["--consistency=bsp",
                               "--pull_wait_timeout_ms=300000",
                               "--worker_lease_ms=300000"])
    other = asyncps.Client(addresses(shards), 0)
    other.create({"t": asyncps.TensorSpec((4,), lr=1.0)})
    other.heartbeat(clock=0)
    return shards, other


def wait_until_no_pull_waits(other):
    def waiting():
        return sum(w.get("waiting_pulls", 0)
                   for shard in other.status()["shards"]
                   for w in shard["status"].get("workers", []))
    wait_until(lambda: waiting() == 0, 30, "the shard to drop the wait")


def test_ctrl_c_ends_a_pull_held_back_by_bsp(cluster, tmp_path):
    shards, other = bsp_shard_and_a_worker_at_clock_0(cluster)
    with other:
        lasted = run_and_interrupt(tmp_path, ",".join(addresses(shards)),
                                   "pull")
        assert lasted < 30
        wait_until_no_pull_waits(other)


def test_ctrl_c_ends_a_step_whose_pull_waits_and_keeps_its_push(cluster,
                                                                tmp_path):
    shards, other = bsp_shard_and_a_worker_at_clock_0(cluster)
    with other:
        lasted = run_and_interrupt(tmp_path, ",".join(addresses(shards)),
                                   "step")
        assert lasted < 30
        # The push was applied once; the shard dropped the pull's wait.
        got = other.pull(["t"], clock=0)["t"]
        assert other.versions("t") == [1]
        assert list(got) == [-1.0] * 4
        wait_until_no_pull_waits(other)
