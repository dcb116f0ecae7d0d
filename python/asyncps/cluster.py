"""Local ps_server shards for experiments, notebooks and tests.

From a shell (prints the addresses, runs until Ctrl-C or SIGTERM, then
stops every shard)::

    python3 -m asyncps.cluster --shards 2 -- --consistency=ssp --slack=2

From Python::

    with asyncps.cluster.LocalCluster(2) as cluster:
        client = asyncps.Client(cluster.addresses, worker_id=0)

Each shard binds a free loopback port (port 0) and reports it through a
port file; its output goes to a log file in the cluster's work directory.
The shards die with the process that started them (PR_SET_PDEATHSIG), so an
interrupted experiment leaves none behind. The ps_server binary is found
through ``ps_server=``, ``$ASYNCPS_PS_SERVER``, the scripts folder of this
Python environment (where ``pip install`` puts it) and then ``$PATH``.
"""

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time

__all__ = ["ClusterError", "LocalCluster", "Shard", "find_ps_server"]

_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A shard could not be started (its log's tail is in the message)."""


def find_ps_server(explicit=None):
    """Path of the ps_server binary; ClusterError naming where it looked."""
    chosen = explicit or os.environ.get("ASYNCPS_PS_SERVER")
    if chosen:
        # A path the caller named is used or refused, never replaced by
        # another binary found elsewhere.
        if os.path.isfile(chosen) and os.access(chosen, os.X_OK):
            return chosen
        raise ClusterError(f"ps_server not found: {chosen} is not an "
                           "executable file")
    candidates = []
    candidates.append(os.path.join(sysconfig.get_path("scripts"), "ps_server"))
    on_path = shutil.which("ps_server")
    if on_path:
        candidates.append(on_path)
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise ClusterError(
        "ps_server not found (looked at " + ", ".join(candidates) +
        "); pass ps_server= or set ASYNCPS_PS_SERVER, or install the "
        "package with pip, which puts ps_server beside this interpreter")


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Shard:
    """One ps_server process: ``proc`` (subprocess.Popen), ``address``
    ("127.0.0.1:port" once started) and ``log_path``."""

    def __init__(self, proc, log_path):
        self.proc = proc
        self.address = None
        self.log_path = log_path

    def log_tail(self, n=4000):
        """The last `n` bytes of the shard's output, as text."""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")

    def stop(self, grace=5.0):
        """SIGTERM, SIGKILL after `grace` seconds; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(grace)


class LocalCluster:
    """`num_shards` ps_server processes on loopback, started at once.

    args      extra ps_server flags, the same for every shard
              (e.g. ["--consistency=bsp"]).
    workdir   where port files and logs go (default: a new temporary
              directory, removed by stop()).
    timeout   seconds each shard has to report its port.
    """

    def __init__(self, num_shards=1, args=(), *, ps_server=None, workdir=None,
                 host="127.0.0.1", timeout=30.0):
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self._binary = find_ps_server(ps_server)
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="asyncps-cluster-")
        self.shards = []
        try:
            self._start(num_shards, list(args), host, timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, num_shards, args, host, timeout):
        port_files = []
        for i in range(num_shards):
            port_file = os.path.join(self.workdir, f"shard{i}.port")
            log_path = os.path.join(self.workdir, f"shard{i}.log")
            if os.path.exists(port_file):
                os.unlink(port_file)
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [self._binary, f"--shard_index={i}",
                     f"--num_shards={num_shards}", f"--host={host}",
                     "--port=0", f"--port_file={port_file}", *args],
                    stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            self.shards.append(Shard(proc, log_path))
            port_files.append(port_file)
        for i, (shard, port_file) in enumerate(zip(self.shards, port_files)):
            deadline = time.monotonic() + timeout
            while True:
                text = ""
                if os.path.exists(port_file):
                    with open(port_file) as f:
                        text = f.read()
                if text.endswith("\n"):
                    shard.address = f"{host}:{int(text)}"
                    break
                if shard.proc.poll() is not None:
                    raise ClusterError(
                        f"shard {i} (ps_server) exited with "
                        f"{shard.proc.returncode}:\n{shard.log_tail()}")
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"shard {i} (ps_server) reported no port within "
                        f"{timeout} s:\n{shard.log_tail()}")
                time.sleep(0.01)

    @property
    def addresses(self):
        """Shard addresses in shard order (what Client() takes)."""
        return [s.address for s in self.shards]

    def stop(self, grace=5.0):
        """Stops every shard (SIGTERM, then SIGKILL after `grace` s) and
        removes the work directory if this cluster made it. Returns the exit
        statuses in shard order."""
        codes = [s.stop(grace) for s in self.shards]
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return codes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m asyncps.cluster",
        description="Starts local ps_server shards and keeps them running "
        "until Ctrl-C or SIGTERM. Flags after -- go to every ps_server.")
    p.add_argument("--shards", type=int, default=2, help="number of shards")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--ps_server", default=None, help="ps_server binary")
    p.add_argument("--workdir", default=None,
                   help="port files and shard logs (default: a temporary "
                   "directory, removed at the end)")
    p.add_argument("--addresses_file", default=None,
                   help="also write the comma-separated addresses here")
    own = list(argv if argv is not None else sys.argv[1:])
    extra = []
    if "--" in own:
        cut = own.index("--")
        own, extra = own[:cut], own[cut + 1:]
    args = p.parse_args(own)
    if args.shards < 1:
        p.error("--shards must be >= 1")

    # SIGINT too: a shell starts background jobs with SIGINT ignored.
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))
    try:
        cluster = LocalCluster(args.shards, extra, ps_server=args.ps_server,
                               workdir=args.workdir, host=args.host)
    except ClusterError as e:
        print(f"asyncps.cluster: {e}", file=sys.stderr)
        return 1
    joined = ",".join(cluster.addresses)
    if args.addresses_file:
        tmp = args.addresses_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(joined + "\n")
        os.replace(tmp, args.addresses_file)
    print(f"asyncps.cluster: {args.shards} shard(s) up, logs in "
          f"{cluster.workdir}\n  servers: {joined}\n"
          f"  python: asyncps.Client({cluster.addresses!r}, worker_id=0)\n"
          f"  psctl:  psctl status --servers={joined}\n"
          "Ctrl-C stops them.", flush=True)
    rc = 0
    while not stopping:
        dead = [i for i, s in enumerate(cluster.shards)
                if s.proc.poll() is not None]
        if dead:
            i = dead[0]
            print(f"asyncps.cluster: shard {i} exited with "
                  f"{cluster.shards[i].proc.returncode}:\n"
                  f"{cluster.shards[i].log_tail()}", file=sys.stderr)
            rc = 1
            break
        time.sleep(0.1)
    codes = cluster.stop()
    print(f"asyncps.cluster: stopped (exit statuses {codes})", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
