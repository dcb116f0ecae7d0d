"""Shared fixtures of the Python tests: real ps_server processes on loopback.

Each shard binds port 0 and writes the port it got to a file; the tests
read it back. Every process a test starts is stopped by PID when the test
ends (SIGTERM, then SIGKILL after a grace period) and dies with the test
process if that one is killed (PR_SET_PDEATHSIG). Every wait has a
deadline. Paths come from tests/python/run_pytest.sh (Bazel runfiles).
"""

import os
import sys
import time

import pytest

from asyncps.cluster import LocalCluster

PS_SERVER = os.environ.get("ASYNCPS_PS_SERVER", "")
EXAMPLES = os.environ.get("ASYNCPS_EXAMPLES", "")
if EXAMPLES and EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)


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


class Cluster:
    """Starts ps_server shards (asyncps.cluster.LocalCluster) for one test
    and stops all of them after."""

    def __init__(self, tmp_path):
        self._tmp = tmp_path
        self._clusters = []

    def start(self, num_shards=1, args=(), timeout=30.0):
        """Starts `num_shards` shards with extra flags `args`; returns them
        (asyncps.cluster.Shard) in shard order once each has its port."""
        assert PS_SERVER, "ASYNCPS_PS_SERVER is not set (run through Bazel)"
        workdir = self._tmp / f"cluster{len(self._clusters)}"
        workdir.mkdir()
        self._clusters.append(LocalCluster(num_shards, args, ps_server=PS_SERVER,
                                           workdir=str(workdir),
                                           timeout=timeout))
        return self._clusters[-1].shards

    def stop_all(self):
        for c in self._clusters:
            c.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def addresses(shards):
    return [s.address for s in shards]
