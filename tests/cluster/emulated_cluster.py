#!/usr/bin/env python3
"""An emulated multi-host cluster on one Linux machine, for tests and benchmarks.

Each host is a network namespace with its own loopback and one interface,
eth0, a veth pair whose other end is a port of one Linux bridge in the root
namespace. Hosts get addresses in a private /24 (10.231.<k>.0/24) that exists
only inside the namespaces: the bridge and its ports have no address, no host
has a default route, so nothing leaves the machine. Every name starts with a
per-run prefix (`aps<pid>` by default), so parallel runs never collide.

Processes run inside a host (`ip netns exec`), their output in a log file per
process. Nemeses: kill -9 every process of a host, take a host's link down and
up, partition one group of hosts from another (both directions or one), heal,
and shape a host's link (rate with tbf; delay and loss with netem, only where
the kernel has it: `capabilities()` says which, and asking for what is missing
raises ShapingUnavailable, never silently does nothing).

Everything a cluster makes (namespaces, bridge, veths, processes) is removed by
close(): at the end of a `with` block, at interpreter exit, on SIGINT/SIGTERM/
SIGHUP once install_signal_handlers() ran, and, for what a SIGKILLed run left,
by `emulated_cluster.py cleanup --prefix aps1234`. Every wait has a deadline.
Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). Python 3 standard library only.

Example:
    import emulated_cluster as ec
    ec.install_signal_handlers()
    with ec.EmulatedCluster(hosts=3, log=print) as cluster:
        h0, h1, h2 = cluster.hosts
        server = h0.spawn(["python3", "-m", "http.server", "8000"], name="http")
        h1.run(["python3", "client.py", h0.ip])   # reaches 10.231.k.1
        cluster.partition([0], [1, 2])             # h0 cut off both ways
        cluster.partition([1], [2], one_way=True)  # h1 cannot send to h2
        cluster.heal()
        cluster.shape(2, rate="10mbit")            # a slow link
        cluster.kill_host(0)                       # kill -9 all of h0
        cluster.link_down(1); cluster.link_up(1)

Partitions. mode="drop" (default) loses the packets silently, as a real
network split does (a connect times out): the sending side gets a permanent
neighbour entry for each blocked address that points at a MAC address no host
has, so the bridge floods the frames and every host drops them. mode="reject"
puts blackhole routes in the sending side instead: sends there fail at once
with EINVAL. Neither needs netfilter. A one-way partition blocks what the
first group sends to the second; note that TCP then fails both ways (a
handshake needs both directions), datagrams do not.
"""

import argparse
import atexit
import ipaddress
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import zlib

COMMAND_TIMEOUT_S = 10.0  # Deadline of every ip/tc command.
KILL_TIMEOUT_S = 10.0  # Deadline for a host's processes to be gone.
MAX_HOSTS = 64
# A locally administered unicast MAC address that no veth gets (the kernel
# gives random ones, which could collide only with probability 2^-46).
UNUSED_MAC = "02:a5:9c:00:00:01"
_NAME_KINDS = r"(h\d+|br|v\d+|p\d+)"  # namespace, bridge, veth root end, peer


class ClusterError(Exception):
    """A command failed, a deadline passed, or something could not be removed."""


class ShapingUnavailable(ClusterError):
    """Asked for a kind of shaping this kernel cannot do (e.g. netem missing)."""


class NotPermitted(ClusterError):
    """This process may not create network namespaces (not root, no caps)."""


def _tool(name):
    """Absolute path of an iproute2 tool; sbin may be missing from PATH."""
    found = shutil.which(name) or shutil.which(
        name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not found:
        raise ClusterError(f"{name} not found (install iproute2)")
    return found


def binary(bin_dir, pkg, name):
    """The binary `name` of Bazel package `pkg` under bin_dir (a bazel-bin),
    or bin_dir/name when bin_dir is a flat folder of binaries."""
    flat = os.path.join(bin_dir, name)
    return flat if os.path.exists(flat) else os.path.join(bin_dir, pkg, name)


def run_cmd(argv, timeout=COMMAND_TIMEOUT_S, check=True, log=None):
    """Runs argv with a deadline; returns CompletedProcess (text output).

    With check, a non-zero exit raises ClusterError naming the command and
    its stderr (NotPermitted when the kernel said "Operation not permitted").
    """
    if log:
        log("$ " + " ".join(argv))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(argv)}: no answer within {timeout} s")
    if check and proc.returncode != 0:
        msg = f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}"
        if "Operation not permitted" in proc.stderr:
            raise NotPermitted(msg)
        raise ClusterError(msg)
    return proc


def _ip(*args, **kw):
    return run_cmd([_tool("ip"), *args], **kw)


def _in_ns(ns, *argv, **kw):
    return run_cmd([_tool("ip"), "netns", "exec", ns, *argv], **kw)


def parse_rate(rate):
    """Rate in bit/s from an int or '100mbit' / '2gbit' / '500kbit' / '8000bit'."""
    if isinstance(rate, (int, float)):
        return int(rate)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)bit\s*", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: want e.g. 100mbit, 2gbit, 500kbit")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return int(float(m.group(1)) * scale)


def tbf_args(rate):
    """tc tbf parameters for a rate: a burst of ~4 ms (>= 32 KiB), 50 ms queue."""
    bits = parse_rate(rate)
    if bits <= 0:
        raise ValueError(f"rate {rate!r} must be positive")
    burst = max(bits // 8 // 250, 32 * 1024)
    return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "50ms"]


# ---------------------------------------------------------------- capabilities

_capabilities = None


def capabilities(probe_ns=None):
    """Which link shaping this kernel offers: {'rate', 'delay', 'loss', 'why'}.

    Probed once (tbf and netem on the loopback of a namespace: probe_ns, or
    a scratch one) and cached; 'why' says what is missing and why.
    """
    global _capabilities
    if _capabilities is not None:
        return _capabilities
    scratch = None
    if probe_ns is None:
        scratch = probe_ns = f"apsprobe{os.getpid()}"
        _ip("netns", "add", scratch)
    try:
        found = {}
        for kind, args in (("tbf", tbf_args("1gbit")),
                           ("netem", ["netem", "delay", "1ms"])):
            proc = _in_ns(probe_ns, _tool("tc"), "qdisc", "add", "dev", "lo",
                          "root", *args, check=False)
            found[kind] = (proc.returncode == 0, proc.stderr.strip())
            if proc.returncode == 0:
                _in_ns(probe_ns, _tool("tc"), "qdisc", "del", "dev", "lo", "root")
    finally:
        if scratch:
            _ip("netns", "del", scratch, check=False)
    why = []
    if not found["tbf"][0]:
        why.append(f"no rate shaping: tc tbf failed: {found['tbf'][1]}")
    if not found["netem"][0]:
        why.append("no delay or loss: this kernel lacks the netem qdisc "
                   f"(tc answered: {found['netem'][1]})")
    _capabilities = {"rate": found["tbf"][0], "delay": found["netem"][0],
                     "loss": found["netem"][0],
                     "why": "; ".join(why) or "rate, delay and loss"}
    return _capabilities


# ------------------------------------------------------------------- processes

class HostProcess:
    """One process started inside a host; output in log_path."""

    def __init__(self, host, name, popen, log_path):
        self.host = host
        self.name = name
        self.popen = popen  # `ip netns exec` execs argv, so this is its pid.
        self.log_path = log_path

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def wait(self, timeout):
        """Exit status (negative: killed by that signal); raises on the deadline."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{self}: still running after {timeout} s")

    def signal(self, sig):
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_for_log(self, pattern, timeout):
        """First match of regex pattern in the log; raises on deadline or exit."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log_text(), re.MULTILINE)
            if m:
                return m
            if not self.alive():
                raise ClusterError(f"{self} exited ({self.popen.returncode}) "
                                   f"before printing {pattern!r}: {self.log_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{self}: no {pattern!r} in its log within "
                                   f"{timeout} s: {self.log_text()[-2000:]}")
            time.sleep(0.02)

    def __repr__(self):
        return f"<{self.host.name}/{self.name} pid {self.pid}>"


class Host:
    """One emulated host: a namespace, its address and the processes started in it."""

    def __init__(self, cluster, index, ip):
        self.cluster = cluster
        self.index = index
        self.name = f"h{index}"
        self.namespace = f"{cluster.prefix}-h{index}"
        self.root_veth = f"{cluster.prefix}-v{index}"  # bridge port
        self.ip = ip
        self.processes = []

    def spawn(self, argv, name=None, env=None):
        """Starts argv inside this host; stdout and stderr go to a log file."""
        name = name or os.path.basename(argv[0])
        log_path = os.path.join(
            self.cluster.log_dir, f"{self.name}-{name}-{len(self.processes)}.log")
        self.cluster.log(f"[{self.name}] start {name}: {' '.join(argv)} "
                         f"(log {log_path})")
        if env is None:
            # Temporary files of a process (a replica's snapshot directory)
            # go beside the logs, also when the process is killed.
            tmp = os.path.join(self.cluster.log_dir, "tmp")
            os.makedirs(tmp, exist_ok=True)
            env = dict(os.environ, TMPDIR=tmp)
        with open(log_path, "wb") as log_file:
            popen = subprocess.Popen(
                [_tool("ip"), "netns", "exec", self.namespace, *argv],
                stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        proc = HostProcess(self, name, popen, log_path)
        self.processes.append(proc)
        return proc

    def run(self, argv, timeout=COMMAND_TIMEOUT_S, check=False):
        """Runs argv inside this host to completion (deadline: timeout)."""
        return _in_ns(self.namespace, *argv, timeout=timeout, check=check,
                      log=self.cluster.log if self.cluster.verbose else None)

    def pids(self):
        """Every process in this host's namespace, whoever started it."""
        proc = _ip("netns", "pids", self.namespace, check=False)
        return [int(p) for p in proc.stdout.split()]

    def __repr__(self):
        return f"<host {self.name} {self.ip} ns {self.namespace}>"


# --------------------------------------------------------------------- cluster

_live_clusters = []


class EmulatedCluster:
    """H hosts on one bridge. Not thread-safe: drive it from one thread."""

    def __init__(self, hosts, prefix=None, log_dir=None, log=None,
                 verbose=False):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{MAX_HOSTS}, got {hosts}")
        if prefix is not None and not re.fullmatch(r"[a-z][a-z0-9]{1,9}", prefix):
            raise ValueError(f"prefix {prefix!r}: 2-10 of [a-z0-9], a letter first")
        self.num_hosts = hosts
        self._wanted_prefix = prefix
        self.prefix = None  # Set once claimed: close() removes only what is ours.
        self.log = log or (lambda line: None)
        self.verbose = verbose
        # Made once the cluster is ours (start()), so that a refused start
        # leaves nothing behind; kept afterwards for the logs it holds.
        self.log_dir = log_dir
        self._made_log_dir = False  # log_dir is a folder start() made
        self._drop_logs = False  # passed(): close() removes that folder
        self.hosts = []
        self.bridge = None
        self.subnet = None
        self._blocked = set()  # (from host index, to host index, mode)
        self._closed = False
        self._started = False

    # ---- life cycle

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except ClusterError as e:
            if exc is None:
                raise
            print(f"emulated cluster: cleanup after an error: {e}", file=sys.stderr)
        return False

    def _cmd_log(self):
        return self.log if self.verbose else None

    def start(self):
        if os.geteuid() != 0:
            raise NotPermitted("network namespaces need root")
        _live_clusters.append(self)
        self._started = True
        try:
            self._claim_prefix()
            if self.log_dir is None:
                self.log_dir = tempfile.mkdtemp(prefix="emulated-cluster-")
                self._made_log_dir = True
            self.subnet = _choose_subnet(self.prefix)
            self.log(f"cluster {self.prefix}: {self.num_hosts} hosts on bridge "
                     f"{self.bridge}, subnet {self.subnet}, logs in {self.log_dir}")
            addrs = list(self.subnet.hosts())
            for i in range(self.num_hosts):
                host = Host(self, i, str(addrs[i]))
                self.hosts.append(host)
                self._make_host(host)
            caps = capabilities(self.hosts[0].namespace)
            self.log(f"link shaping available here: {caps['why']}")
        except BaseException:
            self.close()
            raise
        return self

    def _claim_prefix(self):
        """Creates the bridge: its name is the run's claim on the prefix."""
        candidates = [self._wanted_prefix] if self._wanted_prefix else (
            [f"aps{os.getpid()}"] +
            ["aps" + "".join(random.choices(string.ascii_lowercase + string.digits, k=7))
             for _ in range(4)])
        for prefix in candidates:
            bridge = f"{prefix}-br"
            proc = _ip("link", "add", bridge, "type", "bridge", check=False,
                       log=self._cmd_log())
            if proc.returncode == 0:
                self.prefix, self.bridge = prefix, bridge
                break
            if "Operation not permitted" in proc.stderr:
                raise NotPermitted(f"ip link add {bridge}: {proc.stderr.strip()}")
            if "exists" not in proc.stderr:
                raise ClusterError(f"ip link add {bridge} type bridge: {proc.stderr.strip()}")
        else:
            raise ClusterError(f"every candidate prefix is taken: {candidates} "
                               "(see `emulated_cluster.py list`)")
        # No IPv6 link-local address: the root namespace stays off the bridge.
        _ip("link", "set", self.bridge, "addrgenmode", "none", check=False)
        _ip("link", "set", self.bridge, "up", log=self._cmd_log())

    def _make_host(self, host):
        log = self._cmd_log()
        ns, veth, peer = host.namespace, host.root_veth, f"{self.prefix}-p{host.index}"
        self.log(f"host {host.name}: namespace {ns}, address {host.ip}, "
                 f"bridge port {veth}")
        _ip("netns", "add", ns, log=log)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer, log=log)
        _ip("link", "set", veth, "addrgenmode", "none", check=False)
        _ip("link", "set", peer, "netns", ns, log=log)
        _ip("-n", ns, "link", "set", peer, "name", "eth0", log=log)
        _ip("-n", ns, "addr", "add", f"{host.ip}/{self.subnet.prefixlen}",
            "dev", "eth0", log=log)
        _ip("-n", ns, "link", "set", "lo", "up", log=log)
        _ip("-n", ns, "link", "set", "eth0", "up", log=log)
        _ip("link", "set", veth, "master", self.bridge, log=log)
        _ip("link", "set", veth, "up", log=log)

    def close(self):
        """Kills every process of every host, removes what this run made.

        Idempotent. Signals are held back meanwhile, so a Ctrl-C cannot stop
        it half-way; raises ClusterError naming anything left behind.
        """
        if self._closed or not self._started:
            return
        self._closed = True
        old = signal.pthread_sigmask(
            signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            if self.prefix:
                self.log(f"cluster {self.prefix}: removing hosts, bridge, veths")
                for host in self.hosts:
                    for p in host.processes:
                        p.signal(signal.SIGKILL)
                leftovers = cleanup_prefix(self.prefix, log=self._cmd_log())
                for host in self.hosts:  # reap, so no zombie stays
                    for p in host.processes:
                        try:
                            p.popen.wait(timeout=KILL_TIMEOUT_S)
                        except subprocess.TimeoutExpired:
                            leftovers.append(f"process {p}")
                if leftovers:
                    raise ClusterError(f"cluster {self.prefix}: could not remove "
                                       f"{leftovers}")
                self.log(f"cluster {self.prefix}: removed")
            if self._drop_logs and self._made_log_dir:
                shutil.rmtree(self.log_dir, ignore_errors=True)
        finally:
            if self in _live_clusters:
                _live_clusters.remove(self)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def passed(self):
        """The run on this cluster passed: close() also removes the logs'
        folder start() made (hundreds of MB after a long nemesis run; a
        folder given as log_dir stays). Not called, the folder stays for a
        look at what failed."""
        self._drop_logs = True

    # ---- nemeses

    def host(self, i):
        return self.hosts[i]

    def _hosts(self, group):
        return [self.hosts[i] if isinstance(i, int) else i for i in group]

    def kill_host(self, i, timeout=KILL_TIMEOUT_S):
        """kill -9 every process in host i (also those it did not start).

        Returns the pids killed; raises if any is still there at the deadline.
        """
        host = self._hosts([i])[0]
        killed = set()
        deadline = time.monotonic() + timeout
        while True:
            pids = host.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{host}: processes {pids} survive kill -9")
            time.sleep(0.01)
        for p in host.processes:  # reap ours
            if p.pid in killed or p.alive():
                try:
                    p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise ClusterError(f"{p} not reaped after kill -9")
        self.log(f"nemesis: kill -9 host {host.name}: pids {sorted(killed)}")
        return sorted(killed)

    def link_down(self, i):
        """Cuts host i's cable: its bridge port down, its eth0 without carrier."""
        host = self._hosts([i])[0]
        self.log(f"nemesis: link of {host.name} down")
        _ip("link", "set", host.root_veth, "down", log=self._cmd_log())

    def link_up(self, i):
        host = self._hosts([i])[0]
        self.log(f"nemesis: link of {host.name} up")
        _ip("link", "set", host.root_veth, "up", log=self._cmd_log())

    def partition(self, group_a, group_b, one_way=False, mode="drop"):
        """Hosts of group_a stop reaching group_b (and back, unless one_way).

        mode "drop": packets vanish (timeouts); "reject": sends fail at once.
        Adds to partitions already in place; heal() removes them all.
        """
        if mode not in ("drop", "reject"):
            raise ValueError(f"mode {mode!r}: want 'drop' or 'reject'")
        a, b = self._hosts(group_a), self._hosts(group_b)
        if {h.index for h in a} & {h.index for h in b}:
            raise ValueError("a host cannot be on both sides of a partition")
        arrow = "->" if one_way else "<->"
        self.log(f"nemesis: partition ({mode}) {[h.name for h in a]} {arrow} "
                 f"{[h.name for h in b]}")
        pairs = [(x, y) for x in a for y in b]
        if not one_way:
            pairs += [(y, x) for x in a for y in b]
        for src, dst in pairs:
            self._block(src, dst, mode)

    def _block(self, src, dst, mode):
        key = (src.index, dst.index)
        if any(k[:2] == key for k in self._blocked):
            return
        if mode == "drop":
            _ip("-n", src.namespace, "neigh", "replace", dst.ip, "lladdr",
                UNUSED_MAC, "dev", "eth0", "nud", "permanent", log=self._cmd_log())
        else:
            _ip("-n", src.namespace, "route", "add", "blackhole",
                f"{dst.ip}/32", log=self._cmd_log())
        self._blocked.add((src.index, dst.index, mode))

    def heal(self):
        """Removes every partition."""
        self.log("nemesis: heal all partitions")
        for src_i, dst_i, mode in sorted(self._blocked):
            src, dst = self.hosts[src_i], self.hosts[dst_i]
            if mode == "drop":
                _ip("-n", src.namespace, "neigh", "del", dst.ip, "dev", "eth0",
                    log=self._cmd_log())
            else:
                _ip("-n", src.namespace, "route", "del", "blackhole",
                    f"{dst.ip}/32", log=self._cmd_log())
        self._blocked.clear()

    def shape(self, i, rate=None, delay=None, loss=None):
        """Shapes host i's link, both directions (what it sends, what it gets).

        rate: e.g. "100mbit" (tbf); delay: e.g. "1ms" and loss: e.g. "0.5%"
        (netem) are added per direction of this link, so a path between two
        shaped hosts crosses two of them. All None: unshaped. Raises
        ShapingUnavailable when the kernel cannot do what is asked.
        """
        host = self._hosts([i])[0]
        caps = capabilities(host.namespace)
        if (delay or loss) and not caps["delay"]:
            raise ShapingUnavailable(
                f"shape {host.name}: delay={delay} loss={loss} asked, but "
                f"{caps['why']}; only rate shaping (tbf) works here")
        if rate and not caps["rate"]:
            raise ShapingUnavailable(f"shape {host.name}: {caps['why']}")
        self.log(f"nemesis: shape link of {host.name}: rate={rate or 'unlimited'}"
                 f" delay={delay or 0} loss={loss or 0}")
        for ns_args in ((), ("-n", host.namespace)):
            dev = "eth0" if ns_args else host.root_veth
            tc = [_tool("tc"), *ns_args]
            # "No such file" / "Cannot delete qdisc with handle of zero" when
            # none is set: the default qdisc stays, which is what we want.
            run_cmd([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
            netem = []
            if delay:
                netem += ["delay", delay]
            if loss:
                netem += ["loss", loss]
            log = self._cmd_log()
            if netem:
                run_cmd([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                         "netem", *netem], log=log)
                if rate:
                    run_cmd([*tc, "qdisc", "add", "dev", dev, "parent", "1:1",
                             "handle", "10:", *tbf_args(rate)], log=log)
            elif rate:
                run_cmd([*tc, "qdisc", "add", "dev", dev, "root", *tbf_args(rate)],
                        log=log)

    def slow(self, i, rate):
        """Changes host i's link rate (tbf), e.g. slow(1, "1mbit")."""
        self.shape(i, rate=rate)


# --------------------------------------------------------- names and leftovers

def _choose_subnet(prefix):
    """10.231.<k>.0/24, k from the prefix, avoiding subnets the root namespace uses.

    The subnet exists only on this run's bridge, so two runs that draw the
    same k cannot see each other; k differs per prefix only to ease reading.
    """
    used = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    start = zlib.crc32(prefix.encode()) % 250
    for step in range(250):
        k = (start + step) % 250 + 1
        if f"10.231.{k}." not in used:
            return ipaddress.ip_network(f"10.231.{k}.0/24")
    raise ClusterError("no free subnet in 10.231.0.0/16")


def list_resources(prefix=None):
    """{'namespaces': [...], 'links': [...]} made by emulated clusters.

    With prefix: only that run's; without: every run's (names aps*-...).
    """
    pat = re.compile((re.escape(prefix) if prefix else r"aps[a-z0-9]{1,7}")
                     + "-" + _NAME_KINDS + "$")
    namespaces = [line.split()[0] for line in
                  _ip("netns", "list").stdout.splitlines() if line.strip()]
    links = []
    for line in _ip("-o", "link", "show").stdout.splitlines():
        # "12: aps1-v0@if11: <...>" -> aps1-v0
        parts = line.split(":", 2)
        if len(parts) > 1:
            links.append(parts[1].strip().split("@")[0])
    return {"namespaces": [n for n in namespaces if pat.match(n)],
            "links": [link for link in links if pat.match(link)]}


def cleanup_prefix(prefix, log=None):
    """Removes every process, namespace, veth and bridge of the run `prefix`.

    Returns what could not be removed (empty when all is gone).
    """
    if not re.fullmatch(r"[a-z][a-z0-9]{1,9}", prefix):
        raise ValueError(f"prefix {prefix!r}: 2-10 of [a-z0-9], a letter first")
    found = list_resources(prefix)
    for ns in found["namespaces"]:
        # A namespace with processes in it outlives `ip netns del`: kill first.
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while time.monotonic() < deadline:
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        _ip("netns", "del", ns, check=False, log=log)
    for link in list_resources(prefix)["links"]:
        _ip("link", "del", link, check=False, log=log)
    # veths vanish with their namespaces asynchronously: wait a little.
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while True:
        left = list_resources(prefix)
        if not left["namespaces"] and not left["links"]:
            return []
        if time.monotonic() > deadline:
            return left["namespaces"] + left["links"]
        time.sleep(0.05)


def _close_live_clusters():
    for cluster in list(_live_clusters):
        try:
            cluster.close()
        except ClusterError as e:
            print(f"emulated cluster: {e}", file=sys.stderr)


atexit.register(_close_live_clusters)


def install_signal_handlers():
    """SIGTERM and SIGHUP raise SystemExit (SIGINT: KeyboardInterrupt), so the
    `with` blocks and atexit hooks of the main thread remove the clusters."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ------------------------------------------------------------------------- CLI

def _demo(args):
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netprobe.py")
    py = sys.executable
    with EmulatedCluster(hosts=args.hosts, log=print, verbose=args.verbose,
                         log_dir=args.log_dir) as cluster:
        print(f"READY prefix={cluster.prefix} "
              + " ".join(f"{h.name}={h.ip}" for h in cluster.hosts), flush=True)
        if args.hold:
            print(f"holding for {args.hold} s (Ctrl-C or SIGTERM removes it all)",
                  flush=True)
            time.sleep(args.hold)
            return 0
        server = cluster.hosts[0].spawn([py, probe, "tcp-server"], name="server")
        port = server.wait_for_log(r"^LISTENING (\d+)", 10).group(1)

        def probe_from(i, nbytes=4, timeout=1.0):
            out = cluster.hosts[i].run(
                [py, probe, "tcp-client", cluster.hosts[0].ip, port,
                 "--bytes", str(nbytes), "--timeout", str(timeout)], timeout=60)
            print(f"  h{i} -> h0: {out.stdout.strip()}", flush=True)

        for i in range(1, args.hosts):
            probe_from(i)
        if args.hosts > 1:
            cluster.partition([0], [1])
            probe_from(1)
            cluster.heal()
            probe_from(1)
            probe_from(1, nbytes=4 << 20, timeout=10)
            cluster.slow(0, args.rate)
            probe_from(1, nbytes=4 << 20, timeout=30)
            cluster.shape(0)
        print(f"capabilities: {capabilities()['why']}")
        cluster.kill_host(0)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="make a cluster, show the nemeses, remove it")
    demo.add_argument("--hosts", type=int, default=3)
    demo.add_argument("--rate", default="50mbit", help="rate of the slow link")
    demo.add_argument("--hold", type=float, default=0,
                      help="only make the cluster and keep it this many seconds")
    demo.add_argument("--log_dir", default=None)
    demo.add_argument("-v", "--verbose", action="store_true",
                      help="print every ip/tc command")
    clean = sub.add_parser("cleanup", help="remove what a run left behind")
    clean.add_argument("--prefix", required=True, help="e.g. aps12345")
    sub.add_parser("list", help="namespaces and links of emulated clusters")
    sub.add_parser("capabilities", help="which link shaping this kernel offers")
    args = parser.parse_args(argv)
    install_signal_handlers()
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "cleanup":
            left = cleanup_prefix(args.prefix, log=print)
            if left:
                print(f"could not remove: {left}", file=sys.stderr)
                return 1
            print(f"nothing of {args.prefix} remains")
            return 0
        if args.command == "list":
            found = list_resources()
            for kind in ("namespaces", "links"):
                print(f"{kind}: {' '.join(found[kind]) or '-'}")
            return 0
        caps = capabilities()
        print(f"rate={caps['rate']} delay={caps['delay']} loss={caps['loss']}: "
              f"{caps['why']}")
        return 0
    except NotPermitted as e:
        print(f"not permitted: {e} (run as root)", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"bad argument: {e}", file=sys.stderr)
        return 2
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
