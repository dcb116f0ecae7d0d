"""Shared fixtures of the Python tests: real ps_server processes on loopback.

Each shard binds port 0 and writes the port it got to a file; the tests
read it back. Every process a test starts is stopped by PID when the test
ends (SIGTERM, then SIGKILL after a grace period) and dies with the test
process if that one is killed (PR_SET_PDEATHSIG). Every wait has a
deadline. Paths come from tests/python/run_pytest.sh (Bazel runfiles).
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

import pytest

PS_SERVER = os.environ.get("ASYNCPS_PS_SERVER", "")
EXAMPLES = os.environ.get("ASYNCPS_EXAMPLES", "")
if EXAMPLES and EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def wait_until(condition, timeout, what, poll=0.01):
    """Polls `condition` until it is true; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


class Shard:
    """One ps_server process."""

    def __init__(self, proc, address, log_path):
        self.proc = proc
        self.address = address
        self.log_path = log_path

    def log_tail(self, n=4000):
        with open(self.log_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def stop(self, grace=5.0):
        """SIGTERM, SIGKILL after `grace` seconds; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(grace)


class Cluster:
    """Starts ps_server shards for one test and stops all of them after."""

    def __init__(self, tmp_path):
        self._tmp = tmp_path
        self._shards = []

    def start(self, num_shards=1, args=(), timeout=30.0):
        """Starts `num_shards` shards with extra flags `args`; returns them
        in shard order once each has written its port."""
        assert PS_SERVER, "ASYNCPS_PS_SERVER is not set (run through Bazel)"
        started = []
        for i in range(num_shards):
            n = len(self._shards)
            port_file = self._tmp / f"shard{n}.port"
            log_path = self._tmp / f"shard{n}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [PS_SERVER, f"--shard_index={i}", f"--num_shards={num_shards}",
                     "--host=127.0.0.1", "--port=0", f"--port_file={port_file}",
                     *args],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent)
            shard = Shard(proc, None, log_path)
            self._shards.append(shard)
            started.append((shard, port_file))
        for shard, port_file in started:
            deadline = time.monotonic() + timeout
            while True:
                if port_file.exists():
                    text = port_file.read_text()
                    if text.endswith("\n"):
                        shard.address = f"127.0.0.1:{int(text)}"
                        break
                if shard.proc.poll() is not None:
                    pytest.fail(f"ps_server exited with {shard.proc.returncode}:\n"
                                f"{shard.log_tail()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"ps_server wrote no port within {timeout} s:\n"
                                f"{shard.log_tail()}")
                time.sleep(0.01)
        return [s for s, _ in started]

    def stop_all(self):
        for shard in self._shards:
            shard.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def addresses(shards):
    return [s.address for s in shards]
