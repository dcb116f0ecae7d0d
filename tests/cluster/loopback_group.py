"""One replicated group on loopback and a client pushing to it, for the
scripts that disturb what such a group relies on (clock_step.py: the
real-time clock; etcd_leader_loss.py: etcd's leader; etcd_data_loss.py:
etcd's data).

    procs = Processes(folder)
    acks = start_group(procs, bin_dir, "127.0.0.1:2379", run_id="x")
    ...                                  # disturb something
    acks.since(t0)                       # when pushes were acknowledged
    procs.stop()                         # kills (and resumes) every process

Python 3 standard library only.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import emulated_cluster as ec


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Processes started with their output in `folder` (NAME.log), which is
    also their TMPDIR, so that a killed replica's snapshot directory goes
    with it. stop() kills every one (SIGCONT first: some were stopped)."""

    def __init__(self, folder):
        self.folder = folder
        self.procs = []

    def log(self, name):
        return os.path.join(self.folder, f"{name}.log")

    def spawn(self, argv, name, stdout=None):
        log = open(self.log(name), "w")
        env = dict(os.environ, TMPDIR=self.folder)
        p = subprocess.Popen(argv, stdout=stdout or log, stderr=log,
                             text=True, env=env)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []


class Acks:
    """Reads push_client's "acked N" lines, stamping each (monotonic)."""

    def __init__(self, proc):
        self.times = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(proc,),
                                       daemon=True)
        self.thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            if line.startswith("acked "):
                with self.lock:
                    self.times.append(time.monotonic())

    def count(self):
        with self.lock:
            return len(self.times)

    def since(self, t):
        with self.lock:
            return [x for x in self.times if x > t]

    def wait_for(self, count, deadline_s):
        give_up = time.monotonic() + deadline_s
        while time.monotonic() < give_up:
            if self.count() >= count:
                return True
            time.sleep(0.05)
        return False


def longest_gap(acks, t0, t1):
    """The longest time in [t0, t1] without an acknowledgement, and when it
    began (seconds after t0)."""
    times = [t0] + [x for x in acks.since(t0) if x <= t1] + [t1]
    return max((b - a, a - t0) for a, b in zip(times, times[1:]))


def lease_lines(log_paths):
    """The replicas' log lines about their leases (and restarts)."""
    lines = []
    for path in log_paths:
        with open(path, errors="replace") as f:
            for line in f:
                if "lease" in line or "starts over" in line:
                    lines.append(f"{os.path.basename(path)}: {line.rstrip()}")
    return lines


def start_etcd(procs, etcd, endpoint, data_dir, name="etcd"):
    """A one-member etcd serving `endpoint` ("127.0.0.1:PORT") from
    `data_dir` (a new cluster when the folder is empty or missing), with the
    election timings every deploy here uses. Returns its Popen."""
    return procs.spawn([etcd, f"--data-dir={data_dir}",
                        f"--listen-client-urls=http://{endpoint}",
                        f"--advertise-client-urls=http://{endpoint}",
                        f"--listen-peer-urls=http://127.0.0.1:{free_port()}",
                        "--heartbeat-interval=50", "--election-timeout=500",
                        "--log-level=warn"], name)


def server_argv(bin_dir, endpoint, run_id, label, lease_ms=1000):
    """A ps_server of shard 0 of 1, R = 2, on a free loopback port, with
    host label `label`, of run `run_id` on the etcd at `endpoint`."""
    return [ec.binary(bin_dir, "server", "ps_server"), "--host=127.0.0.1",
            f"--port={free_port()}", "--shard_index=0", "--num_shards=1",
            "--replicas=2", f"--etcd_endpoints={endpoint}",
            f"--run_id={run_id}", f"--host_label={label}",
            f"--lease_ms={lease_ms}"]


def start_group(procs, bin_dir, endpoint, run_id, lease_ms=1000,
                server_args=lambda i: []):
    """Shard 0 of 1 held by two replicas (servers "server0" and "server1",
    host labels a and b, the first claims the group) on the etcd at
    `endpoint` (comma-separated members), and a push_client ("client")
    pushing to it as fast as it is answered. Returns the client's Acks once
    200 pushes were acknowledged and both replicas had 2 s to settle (the
    backup counted, leases renewed); None if not within 30 s.
    server_args(i) gives server i's further flags."""
    push_client = ec.binary(bin_dir, "tests/integration", "push_client")
    for i, label in enumerate(("a", "b")):
        procs.spawn(server_argv(bin_dir, endpoint, run_id, label, lease_ms)
                    + server_args(i), f"server{i}")
        time.sleep(2)  # the first claims the group, the second follows
    client = procs.spawn([push_client, f"--etcd_endpoints={endpoint}",
                          f"--run_id={run_id}", "--tensors=w",
                          "--worker_id=0", "--pushes=100000000", "--grad=1",
                          "--create_elems=1000", "--log_level=warn"],
                         "client", stdout=subprocess.PIPE)
    acks = Acks(client)
    if not acks.wait_for(200, 30):
        return None
    time.sleep(2)
    return acks


def leave_folder(folder, keep):
    """At a script's end: says where the logs are (--keep), else removes
    the folder."""
    if keep:
        print("logs in " + folder)
    else:
        shutil.rmtree(folder, ignore_errors=True)


def add_round_args(ap, cases, rounds, max_gap_s):
    """The flags every round-based script here takes."""
    ap.add_argument("--bin", required=True,
                    help="bazel-bin of a -c opt build, or a flat folder")
    ap.add_argument("--cases", default=cases)
    ap.add_argument("--rounds", type=int, default=rounds,
                    help="rounds per case, each on a new cluster")
    ap.add_argument("--keep", action="store_true",
                    help="keep the logs' folder")
    ap.add_argument("--max_gap_s", type=float, default=max_gap_s,
                    help="a round fails when no push was acknowledged for "
                         "longer")


def run_rounds(args, run_round, prefix, summarize):
    """Runs run_round(args, case, n, tmp) for every case of args.cases and
    n in 1..args.rounds, in a temporary folder `tmp` (removed afterwards
    unless --keep), with args.etcd set to the etcd binary. run_round
    returns False when it failed before measuring, else a tuple whose first
    item says whether it passed; summarize(case, tuples) prints a case's
    line at the end. Returns the exit status: 0, 1 if a round failed, 2
    when etcd is not installed."""
    args.etcd = shutil.which("etcd")
    if args.etcd is None:
        print("etcd not installed (deploy/install_deps.sh installs it)")
        return 2
    ec.install_signal_handlers()
    tmp = tempfile.mkdtemp(prefix=prefix)
    failed = 0
    results = {}
    try:
        for case in args.cases.split(","):
            for n in range(1, args.rounds + 1):
                result = run_round(args, case, n, tmp)
                if result is False or not result[0]:
                    failed += 1
                if result:
                    results.setdefault(case, []).append(result)
    finally:
        leave_folder(tmp, args.keep)
    for case, rounds in results.items():
        summarize(case, rounds)
    print(f"{failed} round(s) failed")
    return 1 if failed else 0
