#!/usr/bin/env python3
"""The emulated cluster (emulated_cluster.py) against real processes and sockets.

Three hosts; a TCP server in one, clients in the others. Checks connectivity,
two-way and one-way partitions (both modes) and heal, link down/up, kill -9 of
a host, tbf rate shaping, that asking for netem shaping without netem fails
loudly, and that nothing of a run remains after close(), after SIGTERM and,
with `cleanup --prefix`, after SIGKILL. Needs root; without it prints
ASYNCPS_SKIPPED and passes. Every wait has a deadline.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import emulated_cluster as ec  # noqa: E402

PROBE = os.path.join(HERE, "netprobe.py")
CLI = os.path.join(HERE, "emulated_cluster.py")
PY = sys.executable
BLOCKED_TIMEOUT_S = 1.0  # A blocked connect must fail within this.
TRANSFER_BYTES = 4 << 20
SLOW_RATE = "50mbit"


def log_dir():
    base = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or os.environ.get(
        "TEST_TMPDIR") or "/tmp"
    path = os.path.join(base, f"cluster-logs-{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    return path


def leftovers(prefix):
    """What `ip netns list` and `ip link` still show of a run."""
    ip = ec._tool("ip")
    names = subprocess.run([ip, "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout
    links = subprocess.run([ip, "-o", "link"], capture_output=True, text=True,
                           timeout=10).stdout
    return [line for line in (names + links).splitlines()
            if f"{prefix}-" in line]


class ClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = ec.EmulatedCluster(hosts=3, log_dir=log_dir(), log=print,
                                         verbose=True)
        cls.cluster.start()
        cls.h0, cls.h1, cls.h2 = cls.cluster.hosts
        cls.server = cls.h0.spawn([PY, PROBE, "tcp-server"], name="tcp-server")
        cls.port = cls.server.wait_for_log(r"^LISTENING (\d+)", 10).group(1)

    @classmethod
    def tearDownClass(cls):
        prefix = cls.cluster.prefix
        cls.cluster.close()
        left = leftovers(prefix)
        if left:
            raise AssertionError(f"left behind by {prefix}: {left}")
        print(f"nothing of {prefix} remains (ip netns list, ip link)")

    def tearDown(self):
        self.cluster.heal()

    def connect(self, src, dst=None, port=None, nbytes=4,
                timeout=BLOCKED_TIMEOUT_S):
        """Runs a tcp-client in host src to dst's server; returns its JSON."""
        dst = dst or self.h0
        out = src.run([PY, PROBE, "tcp-client", dst.ip, str(port or self.port),
                       "--bytes", str(nbytes), "--timeout", str(timeout)],
                      timeout=timeout + 60)
        self.assertTrue(out.stdout.strip(), f"no output: {out.stderr}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {src.name} -> {dst.name} ({nbytes} bytes): {result}")
        return result

    def assert_blocked(self, src, dst=None, port=None):
        start = time.monotonic()
        result = self.connect(src, dst, port)
        self.assertFalse(result["ok"], f"{src.name} still reaches its peer")
        self.assertLess(time.monotonic() - start, BLOCKED_TIMEOUT_S + 5)

    def test_hosts_reach_each_other_over_tcp(self):
        for src in (self.h1, self.h2):
            self.assertTrue(self.connect(src)["ok"])
        # and not through the loopback: h0's server is not in h1's namespace
        out = self.h1.run([PY, PROBE, "tcp-client", "127.0.0.1", self.port,
                           "--timeout", "1"])
        self.assertNotEqual(out.returncode, 0, out.stdout)

    def test_two_way_partition_blocks_until_heal(self):
        for mode in ("drop", "reject"):
            with self.subTest(mode=mode):
                self.cluster.partition([0], [1], mode=mode)
                self.assert_blocked(self.h1)
                self.assertTrue(self.connect(self.h2)["ok"], "h2 is not cut off")
                self.cluster.heal()
                self.assertTrue(self.connect(self.h1)["ok"])

    def test_one_way_partition_blocks_one_direction(self):
        listeners, tcp = {}, {}
        for host in (self.h1, self.h2):
            p = host.spawn([PY, PROBE, "udp-server"], name="udp-server")
            listeners[host.name] = (p, p.wait_for_log(r"^LISTENING (\d+)", 10).group(1))
            p = host.spawn([PY, PROBE, "tcp-server"], name="tcp-server")
            tcp[host.name] = (p, p.wait_for_log(r"^LISTENING (\d+)", 10).group(1))
        try:
            for mode in ("drop", "reject"):
                with self.subTest(mode=mode):
                    self.cluster.partition([1], [2], one_way=True, mode=mode)
                    tag = f"{mode}-{time.monotonic_ns()}"
                    for src, dst in ((self.h1, self.h2), (self.h2, self.h1)):
                        src.run([PY, PROBE, "udp-send", dst.ip,
                                 listeners[dst.name][1], f"{src.name}-{tag}"],
                                timeout=10)
                    # h2 -> h1 arrives ...
                    listeners["h1"][0].wait_for_log(f"^GOT h2-{tag}$", 5)
                    # ... h1 -> h2 does not (it was sent before h2's arrived).
                    time.sleep(0.2)
                    self.assertNotIn(f"h1-{tag}", listeners["h2"][0].log_text())
                    # TCP needs both directions: fails from either side.
                    self.assert_blocked(self.h2, self.h1, tcp["h1"][1])
                    self.assert_blocked(self.h1, self.h2, tcp["h2"][1])
                    self.cluster.heal()
                    self.assertTrue(self.connect(self.h2, self.h1, tcp["h1"][1])["ok"])
                    self.assertTrue(self.connect(self.h1, self.h2, tcp["h2"][1])["ok"])
                    self.h1.run([PY, PROBE, "udp-send", self.h2.ip,
                                 listeners["h2"][1], f"h1-{tag}-healed"], timeout=10)
                    listeners["h2"][0].wait_for_log(f"^GOT h1-{tag}-healed$", 5)
        finally:
            for p, _ in list(listeners.values()) + list(tcp.values()):
                p.signal(signal.SIGKILL)
                p.wait(10)

    def test_link_down_isolates_a_host(self):
        server2 = self.h2.spawn([PY, PROBE, "tcp-server"], name="tcp-server")
        port2 = server2.wait_for_log(r"^LISTENING (\d+)", 10).group(1)
        self.cluster.link_down(0)
        try:
            self.assert_blocked(self.h1)  # into h0
            self.assert_blocked(self.h0, self.h2, port2)  # out of h0
            self.assertTrue(self.connect(self.h1, self.h2, port2)["ok"])
        finally:
            self.cluster.link_up(0)
        # Carrier and ARP come back within moments; allow a few tries.
        deadline = time.monotonic() + 10
        while not self.connect(self.h1, timeout=1)["ok"]:
            self.assertLess(time.monotonic(), deadline, "h0 unreachable after link up")
        server2.signal(signal.SIGKILL)
        server2.wait(10)

    def test_kill_host_kills_exactly_that_hosts_processes(self):
        # A throwaway cluster: kill_host must not take this class's server.
        with ec.EmulatedCluster(hosts=3, log_dir=log_dir(), log=print) as c:
            sleepers = {h.name: [h.spawn(["sleep", "300"], name="sleep")]
                        for h in c.hosts}
            # plus a process h1 did not start directly: a grandchild
            sleepers["h1"].append(c.hosts[1].spawn(
                ["sh", "-c", "sleep 300 & echo child $!; wait"], name="parent"))
            grandchild = int(sleepers["h1"][1].wait_for_log(r"^child (\d+)", 10)
                             .group(1))
            killed = c.kill_host(1)
            print(f"  killed in h1: {killed}")
            self.assertIn(grandchild, killed)
            self.assertEqual(len(killed), 3)
            for p in sleepers["h1"]:
                self.assertEqual(p.wait(5), -signal.SIGKILL)
            self.assertEqual(c.hosts[1].pids(), [])
            for name in ("h0", "h2"):
                self.assertTrue(sleepers[name][0].alive(), f"{name} was hit")
                self.assertEqual(c.hosts[int(name[1])].pids(), [sleepers[name][0].pid])
            prefix = c.prefix
        self.assertEqual(leftovers(prefix), [])

    def test_rate_shaping_lowers_throughput(self):
        fast = self.connect(self.h1, nbytes=TRANSFER_BYTES, timeout=20)
        self.cluster.slow(0, SLOW_RATE)
        try:
            slow = self.connect(self.h1, nbytes=TRANSFER_BYTES, timeout=60)
        finally:
            self.cluster.shape(0)
        again = self.connect(self.h1, nbytes=TRANSFER_BYTES, timeout=20)
        self.assertTrue(fast["ok"] and slow["ok"] and again["ok"])
        mbit = lambda r: TRANSFER_BYTES * 8 / r["seconds"] / 1e6  # noqa: E731
        print(f"  throughput {TRANSFER_BYTES >> 20} MiB h1 -> h0: unshaped "
              f"{mbit(fast):.0f} Mbit/s, tbf {SLOW_RATE} {mbit(slow):.1f} Mbit/s, "
              f"unshaped again {mbit(again):.0f} Mbit/s")
        self.assertLess(mbit(slow), 0.5 * mbit(fast))
        self.assertLess(mbit(slow), 2 * ec.parse_rate(SLOW_RATE) / 1e6)
        self.assertGreater(mbit(again), 2 * mbit(slow))

    def test_missing_shaping_is_refused_loudly(self):
        caps = ec.capabilities()
        print(f"  shaping here: {caps}")
        self.assertTrue(caps["rate"], caps["why"])
        if caps["delay"]:
            self.cluster.shape(2, rate="1gbit", delay="1ms", loss="0%")
            self.cluster.shape(2)
        else:
            with self.assertRaisesRegex(ec.ShapingUnavailable, "netem"):
                self.cluster.shape(2, delay="1ms")


class CleanupTest(unittest.TestCase):
    """Clean-up on an error, on SIGTERM and, by the CLI, after SIGKILL."""

    def test_error_in_with_block_removes_everything(self):
        with self.assertRaisesRegex(RuntimeError, "boom"):
            with ec.EmulatedCluster(hosts=2, log_dir=log_dir()) as c:
                sleeper = c.hosts[0].spawn(["sleep", "300"])
                prefix = c.prefix
                raise RuntimeError("boom")
        self.assertEqual(sleeper.wait(5), -signal.SIGKILL)
        self.assertEqual(leftovers(prefix), [])

    def test_logs_folder_goes_only_after_a_pass(self):
        saved = tempfile.tempdir
        tempfile.tempdir = log_dir()  # where mkdtemp makes the folders
        try:
            with ec.EmulatedCluster(hosts=1) as kept:
                self.assertEqual(kept.hosts[0].run(["true"]).returncode, 0)
            self.assertTrue(os.path.isdir(kept.log_dir))  # for a look
            with ec.EmulatedCluster(hosts=1) as passed:
                passed.passed()
            self.assertFalse(os.path.exists(passed.log_dir))
            given = log_dir()  # a folder given to it stays either way
            with ec.EmulatedCluster(hosts=1, log_dir=given) as c:
                c.passed()
            self.assertTrue(os.path.isdir(given))
        finally:
            tempfile.tempdir = saved

    def test_taken_prefix_fails_and_leaves_the_owner_alone(self):
        with ec.EmulatedCluster(hosts=1, log_dir=log_dir()) as owner:
            with self.assertRaisesRegex(ec.ClusterError, "taken"):
                ec.EmulatedCluster(hosts=1, prefix=owner.prefix).start()
            self.assertEqual(len(leftovers(owner.prefix)), 3)  # ns, bridge, veth
            self.assertEqual(owner.hosts[0].run(["true"]).returncode, 0)

    def start_holder(self):
        proc = subprocess.Popen([PY, CLI, "demo", "--hosts", "2", "--hold", "120",
                                 "--log_dir", log_dir()],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        deadline = time.monotonic() + 30
        for line in proc.stdout:  # ends at EOF if the CLI dies
            print(f"  cli: {line.rstrip()}")
            if line.startswith("READY prefix="):
                prefix = line.split()[1].split("=")[1]
                self.assertTrue(leftovers(prefix))
                return proc, prefix
            if time.monotonic() > deadline:
                break
        proc.kill()
        proc.wait(10)
        self.fail("the CLI did not get its cluster ready")

    def test_sigterm_removes_everything(self):
        proc, prefix = self.start_holder()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        print("  cli: " + out.replace("\n", "\n  cli: "))
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM)
        self.assertEqual(leftovers(prefix), [])

    def test_cleanup_prefix_removes_what_sigkill_left(self):
        proc, prefix = self.start_holder()
        proc.kill()
        proc.communicate(timeout=30)
        self.assertTrue(leftovers(prefix), "SIGKILL should leave the cluster")
        out = subprocess.run([PY, CLI, "cleanup", "--prefix", prefix],
                             capture_output=True, text=True, timeout=60)
        print(f"  cleanup: {out.stdout} {out.stderr}")
        self.assertEqual(out.returncode, 0)
        self.assertEqual(leftovers(prefix), [])


def main():
    if os.geteuid() != 0:
        print("ASYNCPS_SKIPPED: network namespaces need root")
        return 0
    try:
        ec.capabilities()  # makes and removes one namespace
    except ec.NotPermitted as e:
        print(f"ASYNCPS_SKIPPED: cannot create network namespaces here: {e}")
        return 0
    ec.install_signal_handlers()
    result = unittest.main(exit=False, verbosity=2).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
