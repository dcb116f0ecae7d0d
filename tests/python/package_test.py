"""The installable package: the wheel pip builds from python/ (pyproject.toml,
build_backend/), installed into a fresh venv, used from there with nothing
of the build on the path; and asyncps.cluster, which starts local shards.

The wheel is packed from this test's runfiles (ASYNCPS_PREBUILT): Bazel does
not run inside a Bazel test. `pip install ./python` from a clone runs the
same backend after building with Bazel (README, "Python").
"""

import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import zipfile

import pytest

import asyncps
from asyncps.cluster import ClusterError, LocalCluster
from conftest import EXAMPLES, PS_SERVER, wait_until

RUNFILES = os.path.join(os.environ["TEST_SRCDIR"], "asyncps")


def run(cmd, timeout=120, **kwargs):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       **kwargs)
    assert r.returncode == 0, f"{cmd} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def clean_env(**extra):
    """The environment of a user's shell: no PYTHONPATH, no ps_server path
    from the test."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ASYNCPS_PS_SERVER", "ASYNCPS_EXAMPLES")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A venv (--system-site-packages, for numpy and torch) with the wheel
    installed by pip from a copy of python/'s build files."""
    root = tmp_path_factory.mktemp("pkg")
    source = root / "python"
    source.mkdir()
    shutil.copy(os.path.join(RUNFILES, "python/pyproject.toml"), source)
    shutil.copytree(os.path.join(RUNFILES, "python/build_backend"),
                    source / "build_backend")
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
         str(root / "venv")])
    wheels = root / "wheels"
    env = clean_env(ASYNCPS_PREBUILT=RUNFILES, PIP_NO_INDEX="1",
                    PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([str(root / "venv/bin/pip"), "wheel", "--no-deps", "-w", str(wheels),
         str(source)], env=env, cwd=root, timeout=300)
    (wheel,) = list(wheels.iterdir())
    run([str(root / "venv/bin/pip"), "install", str(wheel)], env=env, cwd=root,
        timeout=300)
    return root, wheel


def test_wheel_holds_package_stub_binaries_and_metadata(venv):
    _, wheel = venv
    version = asyncps.__version__
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert wheel.name.startswith(f"asyncps-{version}-{py}-{py}-linux_")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in ("asyncps/__init__.py", "asyncps/_native.so",
                     "asyncps/_native.pyi", "asyncps/py.typed",
                     "asyncps/torch.py", "asyncps/cluster.py",
                     f"asyncps-{version}.data/scripts/ps_server",
                     f"asyncps-{version}.data/scripts/psctl",
                     f"asyncps-{version}.dist-info/RECORD"):
            assert name in names, sorted(names)
        meta = z.read(f"asyncps-{version}.dist-info/METADATA").decode()
        assert f"Version: {version}\n" in meta and "Name: asyncps\n" in meta
        assert "Requires-Dist: numpy\n" in meta
        record = z.read(f"asyncps-{version}.dist-info/RECORD").decode()
        # Every file but RECORD is listed with its hash and size.
        listed = {line.split(",")[0] for line in record.splitlines()}
        assert listed == names
        stub = z.read("asyncps/_native.pyi").decode()
    tree = ast.parse(stub)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    assert set(classes) >= {"Client", "TensorSpec", "TableSpec", "PushResult",
                            "RpcError"}
    methods = {f.name: f for f in classes["Client"].body
               if isinstance(f, ast.FunctionDef)}
    assert [a.arg for a in methods["pull"].args.args] == ["self", "names",
                                                          "clock"]
    assert ast.unparse(methods["push"].returns) == "PushResult"


def test_installed_package_imports_with_signatures_from_the_venv(venv):
    root, _ = venv
    python = str(root / "venv/bin/python")
    out = run([python, "-c", """
import inspect, pydoc, asyncps, asyncps.torch, asyncps.cluster
print(asyncps.__file__)
print(inspect.signature(asyncps.Client.pull_rows))
print(inspect.signature(asyncps.TensorSpec).parameters['lr'].default)
print('asyncps._native' in pydoc.render_doc(asyncps.Client))
print(asyncps.cluster.find_ps_server())
"""], env=clean_env(), cwd=root)
    where, signature, lr, native_named, ps_server = out.splitlines()
    assert where.startswith(str(root / "venv")), where
    assert signature == ("(self, ids: object, clock: Optional[int] = None, "
                         "peek: bool = False) -> dict")
    assert lr == "0.01" and native_named == "False"
    assert ps_server == str(root / "venv/bin/ps_server")
    version = run([ps_server, "--version"]).strip()
    assert asyncps.__version__ in version
    assert os.access(root / "venv/bin/psctl", os.X_OK)
    assert os.access(root / "venv/bin/asyncps-cluster", os.X_OK)


def connectable(address):
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_cluster_module_runs_the_example_from_the_venv(venv, tmp_path):
    root, _ = venv
    python = str(root / "venv/bin/python")
    addresses_file = tmp_path / "addresses"
    log = open(tmp_path / "cluster.log", "wb")
    cluster = subprocess.Popen(
        [python, "-m", "asyncps.cluster", "--shards=2",
         f"--addresses_file={addresses_file}", "--", "--consistency=ssp",
         "--ssp_slack=1"], env=clean_env(), cwd=tmp_path, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        wait_until(addresses_file.exists, 60, "the cluster's addresses")
        servers = addresses_file.read_text().strip()
        assert len(servers.split(",")) == 2
        out = run([python, os.path.join(EXAMPLES, "fashion_mnist_cnn.py"),
                   f"--servers={servers}", "--epochs=1",
                   "--train_examples=2000", "--test_examples=500",
                   "--log_every=0"], env=clean_env(OMP_NUM_THREADS="1"),
                  cwd=tmp_path, timeout=300)
        (line,) = [l for l in out.splitlines()
                   if l.startswith("final test accuracy:")]
        assert float(line.split(":")[1]) > 0.5, out
        status = json.loads(run([str(root / "venv/bin/psctl"), "status",
                                 "--json", f"--servers={servers}"],
                                env=clean_env()))
        policy = status["shards"][1]["status"]["policy"]
        assert policy["consistency"] == "SSP" and policy["ssp_slack"] == 1
        cluster.send_signal(signal.SIGINT)
        assert cluster.wait(30) == 0
    finally:
        if cluster.poll() is None:
            cluster.kill()
            cluster.wait(10)
        log.close()
    text = (tmp_path / "cluster.log").read_text()
    assert "2 shard(s) up" in text and "stopped" in text, text
    for address in servers.split(","):
        assert not connectable(address), f"{address} still listens"


def test_local_cluster_errors_name_the_cause(tmp_path):
    with pytest.raises(ClusterError, match="ps_server not found"):
        LocalCluster(1, ps_server=str(tmp_path / "missing"),
                     workdir=str(tmp_path))
    with pytest.raises(ClusterError, match="no_such_flag"):
        LocalCluster(1, ["--no_such_flag=1"], ps_server=PS_SERVER,
                     workdir=str(tmp_path))
    with pytest.raises(ValueError, match="num_shards"):
        LocalCluster(0, ps_server=PS_SERVER)
    with LocalCluster(2, ps_server=PS_SERVER) as c:
        workdir = c.workdir
        assert os.path.isdir(workdir)
        with asyncps.Client(c.addresses, worker_id=0) as client:
            assert client.status()["summary"]["shards_up"] == 2
        procs = [s.proc for s in c.shards]
    assert all(p.poll() is not None for p in procs)
    assert not os.path.exists(workdir)
