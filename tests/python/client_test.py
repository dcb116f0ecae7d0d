"""asyncps.Client against real ps_server shards (separate processes)."""

import math
import socket
import subprocess
import threading

import numpy as np
import pytest

import asyncps
from conftest import addresses, wait_until


def constant_sgd(shape, init_value=1.0, slice_elems=4):
    """Constant init, SGD with lr 1: after pushes g the value is init - sum(g)."""
    return asyncps.TensorSpec(shape, init="constant", init_value=init_value,
                              optimizer="sgd", lr=1.0, slice_elems=slice_elems)


def connect(shards, worker_id=0, **kwargs):
    kwargs.setdefault("rpc_timeout", 30.0)
    return asyncps.Client(addresses(shards), worker_id, **kwargs)


def test_create_pull_push_exact_values_on_two_shards(cluster):
    shards = cluster.start(2)
    with connect(shards) as c:
        # 30 elements in 8 slices and 7 in 2: both tensors span both shards.
        stored = c.create({"w": constant_sgd((5, 6)), "b": constant_sgd((7,))})
        assert set(stored) == {"w", "b"}
        assert stored["w"].shape == (5, 6) and stored["w"].slice_elems == 4
        assert c.spec("w") == stored["w"] and c.spec("nope") is None

        got = c.pull(["w", "b"])
        assert got["w"].dtype == np.float32 and got["w"].shape == (5, 6)
        assert np.all(got["w"] == 1.0) and np.all(got["b"] == 1.0)
        assert c.versions("w") == [0] * 8

        gw = np.arange(30, dtype=np.float32).reshape(5, 6) / 4
        gb = np.full(7, 0.5, np.float32)
        gb.flags.writeable = False  # pushes only read
        for step in range(3):
            r = c.push({"w": gw, "b": gb}, clock=step)
            assert (r.applied, r.refused_stale, r.duplicates) == (10, 0, 0)
            assert r.tensors["w"]["applied"] == 8
            assert r.tensors["b"]["applied"] == 2
            c.pull_into(got, clock=step + 1)
        # Pulled in place into the arrays returned by the first pull.
        np.testing.assert_array_equal(got["w"], 1.0 - 3 * gw)
        np.testing.assert_array_equal(got["b"], np.full(7, -0.5, np.float32))
        assert c.versions("w") == [3] * 8 and c.versions("b") == [3] * 2

        # Pushes of one tensor only; the default clock is client.clock.
        c.clock = 7
        c.push({"b": gb})
        out = {"b": np.zeros(7, np.float32)}
        c.pull_into(out)
        np.testing.assert_array_equal(out["b"], np.full(7, -1.0, np.float32))

        status = c.status()
        assert [s["index"] for s in status["shards"]] == [0, 1]
        assert all(s["up"] for s in status["shards"])
        assert [s["address"] for s in status["shards"]] == addresses(shards)
        summary = status["summary"]
        assert summary["tensors"] == 2 and summary["slices"] == 10
        assert summary["pushes"] == 2 * 4  # every push reaches both shards
        assert summary["updates_applied"] == 3 * 10 + 2
        assert summary["duplicate_pushes"] == 0
        (me,) = status["workers"]
        assert me["worker_id"] == 0 and me["state"] == "live"
        assert int(me["incarnation"]) == c.incarnation
        assert me["clock"] == 8  # a push at clock c completes step c
    # Leaving the with block said goodbye.
    with connect(shards, worker_id=1) as other:
        (me,) = [w for w in other.status()["workers"] if w["worker_id"] == 0]
        assert me["state"] == "left"


def test_push_pull_into_is_a_push_then_a_pull_in_one_message(cluster):
    shards = cluster.start(2)
    with connect(shards) as c:
        c.create({"w": constant_sgd((5, 6)), "b": constant_sgd((7,))})
        got = c.pull(["w", "b"])
        gw = np.arange(30, dtype=np.float32).reshape(5, 6) / 4
        gb = np.full(7, 0.5, np.float32)
        for step in range(3):
            r = c.push_pull_into({"w": gw, "b": gb}, got, clock=step)
            assert (r.applied, r.refused_stale, r.duplicates) == (10, 0, 0)
            # The pull came after the push on every shard.
            np.testing.assert_array_equal(got["w"], 1.0 - (step + 1) * gw)
            np.testing.assert_array_equal(got["b"],
                                          np.full(7, 1.0 - 0.5 * (step + 1)))
            assert c.versions("w") == [step + 1] * 8
        summary = c.status()["summary"]
        assert summary["steps"] == 3 * 2 and summary["pushes"] == 3 * 2
        assert summary["pulls"] == 2 + 3 * 2

        # Checked before anything is sent: a NaN, a read-only output.
        bad = gb.copy()
        bad[3] = np.nan
        with pytest.raises(ValueError, match="NaN or Inf; nothing was sent"):
            c.push_pull_into({"b": bad}, got, clock=3)
        frozen = {"b": np.zeros(7, np.float32)}
        frozen["b"].flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            c.push_pull_into({"b": gb}, frozen, clock=3)
        with pytest.raises(ValueError, match="unknown tensor"):
            c.push_pull_into({"b": gb}, {"nope": got["b"]}, clock=3)
        summary = c.status()["summary"]
        assert summary["pushes"] == 3 * 2 and summary["steps"] == 3 * 2


def test_create_is_idempotent_and_conflicts_raise_already_exists(cluster):
    shards = cluster.start(1)
    with connect(shards) as c:
        c.create({"t": constant_sgd((4,))})
        c.create([asyncps.TensorSpec((4,), name="t", init="constant",
                                     init_value=1.0, lr=1.0, slice_elems=4)])
        with pytest.raises(asyncps.RpcError) as e:
            c.create({"t": constant_sgd((5,))})
        assert e.value.code == "ALREADY_EXISTS"
        assert e.value.grpc_code == 6
        assert "'t'" in e.value.message and "shard 0" in e.value.message
        assert str(e.value).startswith("ALREADY_EXISTS: ")
        assert isinstance(e.value, RuntimeError)


def test_wait_for_sees_tensors_created_by_another_worker(cluster):
    shards = cluster.start(2)
    with connect(shards, worker_id=0) as creator, \
            connect(shards, worker_id=1) as other:
        with pytest.raises(asyncps.RpcError) as e:
            other.wait_for(["later"], timeout=0.2)
        assert e.value.code == "DEADLINE_EXCEEDED"
        assert "'later'" in e.value.message
        creator.create({"later": constant_sgd((9,), init_value=2.0)})
        specs = other.wait_for(["later"], timeout=10)
        assert specs["later"].shape == (9,)
        np.testing.assert_array_equal(other.pull(["later"])["later"],
                                      np.full(9, 2.0, np.float32))


def test_refusals_surface_with_their_code_and_torch_tensors_work(cluster):
    import torch
    shards = cluster.start(1)
    with connect(shards) as c:
        c.create({"t": constant_sgd((4,))})
        # Checked here, nothing sent: a ValueError naming the tensor.
        bad = np.array([0, math.nan, 0, 0], np.float32)
        with pytest.raises(ValueError, match="tensor 't'.*NaN"):
            c.push({"t": bad})
        with pytest.raises(ValueError, match="tensor 't'.*NaN"):
            c.push({"t": torch.tensor([0.0, math.inf, 0.0, 0.0])})
        # Refused by the shards: RpcError with the gRPC code.
        with pytest.raises(asyncps.RpcError) as e:
            c.create({"t": constant_sgd((4,), init_value=2.0)})
        assert e.value.code == "ALREADY_EXISTS"
        assert "'t'" in e.value.message
        np.testing.assert_array_equal(c.pull(["t"])["t"], np.ones(4, np.float32))
        # CPU torch tensors wherever arrays go: pulled into in place, pushed.
        w = torch.zeros(4)
        c.pull_into({"t": w})
        assert torch.equal(w, torch.ones(4))
        c.push({"t": torch.full((4,), 0.5)})
        c.pull_into({"t": w})
        assert torch.equal(w, torch.full((4,), 0.5))
        # A single name is taken for a list of one.
        np.testing.assert_array_equal(c.pull("t")["t"], w.numpy())


def test_calls_of_two_threads_on_one_client_run_together(cluster):
    shards = cluster.start(1, ["--consistency=bsp",
                               "--pull_wait_timeout_ms=60000"])
    with connect(shards, 0) as c, connect(shards, 1) as other:
        c.create({"t": constant_sgd((4,))})
        other.heartbeat(clock=0)  # live at 0: c's pull for clock 1 waits
        c.heartbeat(clock=0)
        held = {}
        thread = threading.Thread(
            target=lambda: held.update(c.pull(["t"], clock=1)))
        thread.start()
        wait_until(lambda: any(
            w.get("waiting_pulls", 0) > 0
            for shard in other.status()["shards"]
            for w in shard["status"].get("workers", [])), 30, "the held pull")
        # The same client answers other calls meanwhile.
        c.heartbeat(clock=0)
        np.testing.assert_array_equal(c.spec("t").shape, (4,))
        assert thread.is_alive()
        other.heartbeat(clock=1)  # releases the pull
        thread.join(30)
        assert not thread.is_alive()
        np.testing.assert_array_equal(held["t"], np.ones(4, np.float32))


def test_worker_id_from_torchrun_rank(cluster, monkeypatch):
    shards = cluster.start(1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert asyncps.Client(addresses(shards)).worker_id == 3
    assert asyncps.Client(addresses(shards), 1).worker_id == 1  # explicit
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="WORLD_SIZE=4 but no RANK"):
        asyncps.Client(addresses(shards))
    # torchrun's per-node variables without RANK.
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert asyncps.Client(addresses(shards)).worker_id == 3
    monkeypatch.delenv("GROUP_RANK")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match="LOCAL_RANK=1 with WORLD_SIZE=4"):
        asyncps.Client(addresses(shards))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # one node
    assert asyncps.Client(addresses(shards)).worker_id == 1
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x'"):
        asyncps.Client(addresses(shards))
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    assert asyncps.Client(addresses(shards)).worker_id == 0


def test_set_lr_changes_the_rate_on_every_shard(cluster, tmp_path):
    ckpt = tmp_path / "ckpt"
    shards = cluster.start(2, args=[f"--checkpoint_dir={ckpt}"])
    spec = asyncps.TensorSpec((8,), init="constant", init_value=1.0,
                              optimizer="sgd", lr=0.5, slice_elems=4)
    with connect(shards, worker_id=0) as a, connect(shards,
                                                    worker_id=1) as b:
        a.create({"w": spec})
        b.create({"w": spec})
        a.push({"w": np.ones(8, np.float32)})
        np.testing.assert_array_equal(a.pull("w")["w"], np.full(8, 0.5))
        # Both workers reach the epoch boundary; whoever asks first wins,
        # the other's identical request changes nothing.
        assert a.set_lr({"w": 0.125}, step=1) == {"w": (0.125, 1)}
        assert b.set_lr({"w": 0.125}, step=1) == {"w": (0.125, 1)}
        a.push({"w": np.ones(8, np.float32)})
        np.testing.assert_array_equal(a.pull("w")["w"], np.full(8, 0.375))
        # Disagreeing on the same step is an error; an older step is not.
        with pytest.raises(asyncps.RpcError) as e:
            b.set_lr({"w": 0.25}, step=1)
        assert e.value.code == "ALREADY_EXISTS"
        assert "0.125 on the shard, 0.25 asked" in e.value.message
        assert a.set_lr({"w": 0.0625}, step=2) == {"w": (0.0625, 2)}
        assert b.set_lr({"w": 0.9}, step=1) == {"w": (0.0625, 2)}
        # Bad input raises before anything is sent.
        with pytest.raises(ValueError, match="step must be >= 1"):
            a.set_lr({"w": 0.1}, step=0)
        with pytest.raises(ValueError, match="must be > 0"):
            a.set_lr({"w": float("nan")}, step=3)
        with pytest.raises(TypeError, match="must be a number"):
            a.set_lr({"w": "fast"}, step=3)
        with pytest.raises(asyncps.RpcError) as e:
            a.set_lr({"nope": 0.1}, step=3)
        assert e.value.code == "NOT_FOUND"
        # Listed with the created rate and the one in effect.
        tensors, _ = a.list_tensors()
        assert tensors["w"].lr == 0.5
        assert (tensors["w"].scheduled_lr, tensors["w"].schedule_step) == (
            0.0625, 2)
        status = a.status()
        assert status["summary"]["learning_rates"]["w"]["step"] == 2
        # A worker re-creating with the created spec still matches it.
        a.create({"w": spec})
    # A restarted cluster keeps the schedule (spec file and checkpoint).
    for s in shards:
        s.stop()
    shards = cluster.start(2, args=[f"--checkpoint_dir={ckpt}"])
    with connect(shards, worker_id=0) as c:
        tensors, _ = c.list_tensors()
        assert tensors["w"].scheduled_lr == 0.0625
        assert tensors["w"].schedule_step == 2


def test_an_answered_assign_survives_sigkill_of_every_shard(cluster, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [f"--checkpoint_dir={ckpt}"]  # no periodic checkpoints
    shards = cluster.start(2, args=args)
    spec = asyncps.TensorSpec((10,), init="constant", init_value=1.0,
                              optimizer="momentum", lr=0.5, slice_elems=3)
    table = asyncps.TableSpec(dim=2, init="constant", init_value=0.0)
    given = np.linspace(-2.0, 2.0, 10).astype(np.float32)
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    with connect(shards) as c:
        c.create({"w": spec})
        c.create_tables({"emb": table})
        r = c.assign({"w": given})
        assert r.applied == 4  # slices of 3, 3, 3, 1
        assert c.assign_rows({"emb": ([1, 20, 300, 4000], rows)}).applied == 4
        versions = c.pull("w") and list(c.versions("w"))
        assert versions == [1, 1, 1, 1]
    # Answered, so a checkpoint of every shard holds them: killed with
    # SIGKILL (no final checkpoint) and restarted, the shards keep them.
    for s in shards:
        s.proc.kill()
        s.proc.wait(timeout=10)
    shards = cluster.start(2, args=args)
    with connect(shards, worker_id=1) as c:
        c.wait_for(["w", "emb"], timeout=30)
        np.testing.assert_array_equal(c.pull("w")["w"], given)
        assert list(c.versions("w")) == [1, 1, 1, 1]
        np.testing.assert_array_equal(
            c.pull_rows({"emb": [1, 20, 300, 4000]}, peek=True)["emb"], rows)


def test_run_id_must_match_the_shards(cluster):
    shards = cluster.start(1, args=["--run_id=run-a"])
    with connect(shards, run_id="run-a") as c:
        c.heartbeat()
    other = connect(shards, worker_id=1, run_id="run-b")
    with pytest.raises(asyncps.RpcError) as e:
        other.heartbeat()
    assert e.value.code == "FAILED_PRECONDITION"
    assert "run 'run-a'" in e.value.message
    with pytest.raises(ValueError, match="run_id"):
        connect(shards, run_id="has space")


def unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_shard_raises_unavailable_after_retries(capfd):
    c = asyncps.Client([f"127.0.0.1:{unused_port()}"], max_attempts=2,
                       initial_backoff=0.01, rpc_timeout=5)
    with pytest.raises(asyncps.RpcError) as e:
        c.heartbeat()
    assert e.value.code == "UNAVAILABLE"
    assert "after 2 attempts" in e.value.message
    # The first failure was said on stderr while the retries went on.
    err = capfd.readouterr().err
    assert "Heartbeat on shard 0" in err and "retrying for up to" in err
    c.close()
    assert c.closed


class LossyProxy:
    """Forwards TCP connections to a shard. When armed, it swallows the next
    response the shard starts (an HTTP/2 HEADERS frame on a stream) and
    closes that connection, as when a connection dies after the shard has
    applied a push: the client sees UNAVAILABLE and retries."""

    def __init__(self, backend):
        host, port = backend.rsplit(":", 1)
        self._backend = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.armed = threading.Event()
        self.connections = 0
        self.dropped = 0
        self._sockets = []
        self._threads = []
        self._start(self._accept)

    def _start(self, target, *args):
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self):
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return  # closed
            up = socket.create_connection(self._backend, timeout=10)
            up.settimeout(None)
            self.connections += 1
            self._sockets += [down, up]
            self._start(self._pipe, down, up)
            self._start(self._responses, up, down)

    @staticmethod
    def _pipe(src, dst):
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with_suppressed(s.shutdown, socket.SHUT_RDWR)

    def _responses(self, up, down):
        buf = b""
        try:
            while data := up.recv(1 << 16):
                buf += data
                out = b""
                while len(buf) >= 9:  # HTTP/2 frame header
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    frame_type = buf[3]
                    stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    if self.armed.is_set() and frame_type == 1 and stream:
                        self.armed.clear()
                        self.dropped += 1
                        down.sendall(out)
                        raise OSError("dropping the connection")
                    out += buf[:9 + length]
                    buf = buf[9 + length:]
                down.sendall(out)
        except OSError:
            pass
        for s in (up, down):
            with_suppressed(s.shutdown, socket.SHUT_RDWR)

    def close(self):
        # shutdown() wakes the thread blocked in accept(); close() alone
        # would not.
        with_suppressed(self._listener.shutdown, socket.SHUT_RDWR)
        self._listener.close()
        for s in self._sockets:
            with_suppressed(s.shutdown, socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(10)


def with_suppressed(f, *args):
    try:
        f(*args)
    except OSError:
        pass


def test_push_retried_after_lost_response_is_applied_once(cluster):
    (shard,) = cluster.start(1)
    proxy = LossyProxy(shard.address)
    try:
        with asyncps.Client([proxy.address], initial_backoff=0.01,
                            rpc_timeout=30) as c:
            c.create({"r": constant_sgd((6,), init_value=0.0)})
            values = c.pull(["r"])
            grad = np.full(6, 3.0, np.float32)
            proxy.armed.set()
            # The proxy threads forward while the push waits: the GIL is
            # released during the RPC.
            r = c.push({"r": grad})
            assert proxy.dropped == 1 and proxy.connections >= 2
            assert r.duplicates == 1  # the retry found it already applied
            c.pull_into(values, clock=1)
            np.testing.assert_array_equal(values["r"], np.full(6, -3.0, np.float32))
            assert c.versions("r") == [1, 1]

            r = c.push({"r": grad}, clock=1)  # a fresh push is applied
            assert (r.applied, r.duplicates) == (2, 0)
            c.pull_into(values, clock=2)
            np.testing.assert_array_equal(values["r"], np.full(6, -6.0, np.float32))
            assert c.status()["summary"]["duplicate_pushes"] == 1
    finally:
        proxy.close()


def test_gil_is_released_while_an_ssp_pull_waits(cluster):
    shards = cluster.start(1, ["--consistency=ssp", "--ssp_slack=0",
                               "--pull_wait_timeout_ms=30000",
                               "--worker_lease_ms=30000"])
    with connect(shards, worker_id=0) as fast, \
            connect(shards, worker_id=1) as slow:
        fast.create({"t": constant_sgd((4,))})
        slow.wait_for(["t"])
        slow.heartbeat(clock=0)
        fast.pull(["t"], clock=0)
        result = {}

        def ahead():
            try:
                result["t"] = fast.pull(["t"], clock=1)["t"]
            except Exception as e:  # reported below
                result["error"] = e

        t = threading.Thread(target=ahead)
        t.start()
        # The pull at clock 1 waits for worker 1; meanwhile this thread runs
        # Python and calls the shard (it would hang if the GIL were held).
        wait_until(lambda: slow.status()["summary"]["pull_waits"] == 1, 10,
                   "the pull to wait")
        assert t.is_alive() and not result
        # Argument checks on the waiting client do not wait for its RPC.
        assert fast.spec("t").shape == (4,)
        with pytest.raises(ValueError, match="shape"):
            fast.push({"t": np.zeros(3, np.float32)})
        slow.push({"t": np.ones(4, np.float32)}, clock=0)
        slow.heartbeat(clock=1)
        t.join(30)
        assert not t.is_alive() and "error" not in result
        # Released after worker 1 reached clock 1: its push is visible.
        np.testing.assert_array_equal(result["t"], np.zeros(4, np.float32))


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA, a server certificate for 127.0.0.1 and a token."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-out", "ca.pem", "-days", "2", "-subj", "/CN=asyncps-test-ca", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n"
                                  "extendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2",
            "-extfile", "server.ext", cwd=d)
    (d / "token").write_text("s3cret-token\n")
    (d / "wrong_token").write_text("not-the-token\n")
    return d


def test_tls_and_token(cluster, pki):
    shards = cluster.start(2, [f"--tls_cert={pki / 'server.pem'}",
                               f"--tls_key={pki / 'server.key'}",
                               f"--cluster_token_file={pki / 'token'}"])
    with connect(shards, tls_ca=str(pki / "ca.pem"),
                 token_file=str(pki / "token")) as c:
        c.create({"t": constant_sgd((6,))})
        c.push({"t": np.ones(6, np.float32)})
        np.testing.assert_array_equal(c.pull(["t"])["t"], np.zeros(6, np.float32))

    with connect(shards, tls_ca=str(pki / "ca.pem"),
                 token_file=str(pki / "wrong_token"), max_attempts=1) as c:
        with pytest.raises(asyncps.RpcError) as e:
            c.status()
        assert e.value.code == "UNAUTHENTICATED"
        c.close()  # nothing to say goodbye to

    # Plain TCP to a TLS shard: no handshake, no answer.
    plain = connect(shards, token_file=str(pki / "token"), max_attempts=1,
                    rpc_timeout=5)
    with pytest.raises(asyncps.RpcError) as e:
        plain.status()
    assert e.value.code == "UNAVAILABLE"
    plain.close()
