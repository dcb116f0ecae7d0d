"""asyncps.torch against real ps_server shards."""

import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn

import asyncps
import asyncps.torch
from conftest import EXAMPLES, addresses, wait_until

torch.set_num_threads(1)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.frozen = nn.Parameter(torch.ones(4), requires_grad=False)

    def forward(self, x):
        return self.fc(x)


def connect(shards, worker_id=0):
    return asyncps.Client(addresses(shards), worker_id, rpc_timeout=30)


def sum_closure(model):
    def closure():
        loss = model(torch.ones(1, 3)).sum()
        loss.backward()
        return loss
    return closure


def test_step_pulls_in_place_pushes_grads_and_advances_the_clock(cluster):
    shards = cluster.start(2, ["--slice_elems=2"])
    model = Tiny()
    weight_storage = model.fc.weight.data_ptr()
    with connect(shards) as client:
        with asyncps.torch.Worker(model, client, optimizer="sgd", lr=0.5,
                                  init="constant", prefix="tiny/") as worker:
            assert set(worker.specs) == {"tiny/fc.weight", "tiny/fc.bias"}
            assert worker.specs["tiny/fc.weight"].shape == (2, 3)
            # init='constant' has init_value 0: the first step sees zeros.
            loss = worker.step(sum_closure(model))
            assert loss.item() == 0.0
            assert client.clock == 1 and worker.stats["steps"] == 1
            assert worker.stats["applied"] == 4  # 6 + 2 elements, slices of 2
            # d(sum(W x + b))/dW = 1 for x = 1, so W = 0 - 0.5 after a step:
            # the push came back with the next step's pull.
            assert torch.equal(model.fc.weight, torch.full((2, 3), -0.5))
            worker.pull()
            assert model.fc.weight.data_ptr() == weight_storage
            assert torch.equal(model.fc.weight, torch.full((2, 3), -0.5))
            assert torch.equal(model.fc.bias, torch.full((2,), -0.5))
            assert torch.equal(model.frozen, torch.ones(4))  # not shared
            loss = worker.step(sum_closure(model))
            assert loss.item() == pytest.approx(2 * (3 * -0.5 - 0.5))
            values = client.pull(["tiny/fc.weight"])["tiny/fc.weight"]
            np.testing.assert_array_equal(values, np.full((2, 3), -1.0, np.float32))
        # Leaving the block said goodbye.
        (me,) = client.status()["workers"]
        assert me["state"] == "left" and me["clock"] == 2


def test_plain_steps_push_with_the_next_pull_and_load_drops_it(cluster):
    shards = cluster.start(2, ["--slice_elems=2"])
    model = Tiny()
    with connect(shards) as client:
        with asyncps.torch.Worker(model, client, optimizer="sgd", lr=0.5,
                                  init="constant") as worker:
            seen = []

            def closure():
                seen.append(model.fc.weight.detach().clone())
                return sum_closure(model)()
            for step in range(3):
                worker.step(closure)
                # The module holds what the shards hold after this push.
                values = client.pull(["fc.weight"])["fc.weight"]
                np.testing.assert_array_equal(
                    model.fc.weight.detach().numpy(), values)
                np.testing.assert_array_equal(
                    values, np.full((2, 3), -0.5 * (step + 1), np.float32))
            assert [w[0, 0].item() for w in seen] == [0.0, -0.5, -1.0]
            # Every push reached both shards with the next pull.
            assert client.status()["summary"]["steps"] == 2 * 3
            # Loaded values replace what the last step pulled.
            saved = {k: torch.full_like(v, 4.0)
                     for k, v in model.state_dict().items()}
            worker.load_state_dict(saved)
            worker.step(closure)
            assert torch.equal(seen[-1], saved["fc.weight"])
            # A clock set by hand is pulled for, not the one pulled for.
            client.clock = 10
            model.fc.weight.data.fill_(99.0)
            worker.step(closure)
            assert torch.equal(seen[-1], torch.full((2, 3), 3.5))


def test_lr_schedule_sets_the_rate_when_it_changes(cluster):
    shards = cluster.start(2, ["--slice_elems=2"])
    model = Tiny()
    calls = []

    def schedule(clock):
        calls.append(clock)
        return 0.5 if clock < 2 else 0.25  # halved from the third step

    with connect(shards) as client:
        with asyncps.torch.Worker(model, client, optimizer="sgd", lr=0.5,
                                  init="constant",
                                  lr_schedule=schedule) as worker:
            for _ in range(3):
                worker.step(sum_closure(model))
            assert calls == [0, 1, 2]
            # Two steps at 0.5, one at 0.25: W = -(0.5 + 0.5 + 0.25).
            values = client.pull(["fc.weight"])["fc.weight"]
            np.testing.assert_array_equal(values,
                                          np.full((2, 3), -1.25, np.float32))
            tensors, _ = client.list_tensors()
            assert tensors["fc.bias"].scheduled_lr == 0.25
            assert tensors["fc.bias"].schedule_step == 3  # clock 2 + 1
            # A worker that lags behind (clock 1 here) changes nothing.
            other = Tiny()
            with connect(shards, worker_id=1) as c1:
                c1.clock = 1
                w1 = asyncps.torch.Worker(other, c1, optimizer="sgd", lr=0.5,
                                          init="constant")
                assert w1.set_lr(0.125, step=2) == 0.25
                w1.leave()
            # set_lr by hand, e.g. at an epoch boundary.
            assert worker.set_lr(0.125, step=10) == 0.125
    with pytest.raises(TypeError, match="lr_schedule"):
        asyncps.torch.Worker(Tiny(), connect(shards), lr_schedule=0.1)


def test_torch_default_init_matches_pytorch_bounds(cluster):
    shards = cluster.start(1)
    model = nn.Sequential(nn.Conv2d(2, 8, 3), nn.Flatten(), nn.Linear(8, 400))
    with connect(shards) as client:
        worker = asyncps.torch.Worker(model, client, init="torch", seed=5)
        worker.pull()
        for name, bound in [("0.weight", 1 / 18 ** 0.5), ("0.bias", 1 / 18 ** 0.5),
                            ("2.weight", 1 / 8 ** 0.5), ("2.bias", 1 / 8 ** 0.5)]:
            p = dict(model.named_parameters())[name]
            assert worker.specs[name].init == "uniform"
            assert worker.specs[name].init_value == pytest.approx(bound)
            assert p.abs().max().item() <= bound
            assert p.abs().max().item() > bound / 2  # really drawn
        worker.leave()


class Scaled(nn.Module):
    """A linear layer with custom initial values and a 0-d parameter."""

    def __init__(self, pattern):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.arange(6.0).reshape(2, 3) * pattern)
            self.fc.bias.fill_(-pattern)
        self.temperature = nn.Parameter(torch.tensor(0.07))

    def forward(self, x):
        return self.fc(x) / self.temperature


def test_the_module_own_values_are_kept_scalars_included(cluster):
    shards = cluster.start(2, ["--slice_elems=2"])
    first, second = Scaled(0.25), Scaled(-3.0)
    expected = {n: p.detach().clone() for n, p in first.named_parameters()}
    with connect(shards, 0) as c0, connect(shards, 1) as c1:
        w0 = asyncps.torch.Worker(first, c0, optimizer="sgd", lr=0.01)
        # The second worker's module differs; the first creation's values
        # win, and its first pull brings them.
        w1 = asyncps.torch.Worker(second, c1, optimizer="sgd", lr=0.01)
        assert w0.specs["temperature"].shape == (1,)
        assert w0.specs["fc.weight"].init == "values"
        w1.pull()
        for name, p in second.named_parameters():
            assert torch.equal(p, expected[name]), name  # bit for bit
        assert second.temperature.shape == ()
        assert second.temperature.item() == pytest.approx(0.07)
        # Steps train the scalar like any parameter: its gradient pushed.
        w0.step(sum_closure(first))
        assert first.temperature.grad is not None
        assert w0.stats["applied"] > 0
        t = c0.pull(["temperature"])["temperature"]
        assert t.shape == (1,)
        assert t[0] != pytest.approx(0.07, abs=1e-9)
        w0.leave()
        w1.leave()


def test_load_state_dict_assigns_the_live_shards_for_every_worker(cluster):
    shards = cluster.start(2, ["--slice_elems=2"])
    saved = Scaled(5.0).state_dict()
    saved["temperature"] = torch.tensor(0.5)
    with connect(shards, 0) as c0, connect(shards, 1) as c1:
        w0 = asyncps.torch.Worker(Scaled(0.25), c0, optimizer="momentum",
                                  lr=0.01, overlap_pull=True)
        w1 = asyncps.torch.Worker(Scaled(-3.0), c1, optimizer="momentum",
                                  lr=0.01)
        with w0, w1:
            for _ in range(3):
                w0.step(sum_closure(w0.module))
            names = list(w0.specs)
            before = {n: v.copy() for n, v in c1.pull(names).items()}
            versions = {n: list(c1.versions(n)) for n in names}

            # Refused whole, before anything is sent: the shards and the
            # module keep their values.
            module_before = {k: v.clone()
                             for k, v in w0.module.state_dict().items()}
            bad = [
                ({k: v for k, v in saved.items() if k != "fc.bias"},
                 RuntimeError, "missing keys ['fc.bias']"),
                (dict(saved, extra=torch.zeros(1)), RuntimeError,
                 "unexpected keys ['extra']"),
                (dict(saved, **{"fc.weight": torch.zeros(3, 2)}), ValueError,
                 "'fc.weight' has shape (3, 2)"),
                (dict(saved, temperature=torch.tensor(float("nan"))),
                 ValueError, "'temperature' contains NaN"),
                ([1, 2], TypeError, "mapping"),
            ]
            for state, error, words in bad:
                with pytest.raises(error, match=re.escape(words)):
                    w0.load_state_dict(state)
            for n, v in c1.pull(names).items():
                np.testing.assert_array_equal(v, before[n])
                assert list(c1.versions(n)) == versions[n], n
            for k, v in w0.module.state_dict().items():
                assert torch.equal(v, module_before[k]), k

            result = w0.load_state_dict(saved)
            assert result.missing_keys == [] and result.unexpected_keys == []
            # The module holds them, and every worker's next pull brings
            # them bit for bit, with one more version per slice.
            for k, v in w0.module.state_dict().items():
                assert torch.equal(v, saved[k]), k
            w1.pull()
            for k, v in w1.module.state_dict().items():
                assert torch.equal(v, saved[k]), k
            for n in names:
                assert list(c1.versions(n)) == [v + 1 for v in versions[n]], n
            # The overlapped pull started before the load was dropped: the
            # next step computes on the loaded values.
            seen = {}

            def closure():
                seen["weight"] = w0.module.fc.weight.detach().clone()
                return sum_closure(w0.module)()
            w0.step(closure)
            assert torch.equal(seen["weight"], saved["fc.weight"])
            assert w0.stats["applied"] > 0
            # strict=False loads what is given and reports the rest.
            partial = {"fc.bias": torch.tensor([7.0, 8.0])}
            result = w1.load_state_dict(partial, strict=False)
            assert "fc.weight" in result.missing_keys
            np.testing.assert_array_equal(c0.pull("fc.bias")["fc.bias"],
                                          np.array([7.0, 8.0], np.float32))


def test_buffers_stay_local_with_a_warning_unless_said(cluster):
    shards = cluster.start(1)
    with connect(shards) as client:
        with pytest.warns(UserWarning, match="buffer"):
            asyncps.torch.Worker(nn.BatchNorm1d(3), client, prefix="a/")
        import warnings as w
        with w.catch_warnings():
            w.simplefilter("error")
            asyncps.torch.Worker(nn.BatchNorm1d(3), client, prefix="b/",
                                 buffers="local")
        with pytest.raises(ValueError, match="buffers"):
            asyncps.torch.Worker(nn.BatchNorm1d(3), client, prefix="c/",
                                 buffers="global")
        with pytest.raises(ValueError, match="buffer_every"):
            asyncps.torch.Worker(nn.BatchNorm1d(3), client, prefix="c/",
                                 buffers="average", buffer_every=0)


def test_buffers_averaged_through_the_shards_and_state_dict(cluster):
    shards = cluster.start(2)

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))

    def run_step(worker, x):
        seen = {}

        def closure():
            loss = worker.module(x).sum()
            # The worker's own running mean after this batch, before sync.
            seen["mean"] = worker.module[1].running_mean.clone()
            loss.backward()
            return loss
        worker.step(closure)
        return seen["mean"]

    with connect(shards, 0) as c0, connect(shards, 1) as c1:
        w0 = asyncps.torch.Worker(model(), c0, lr=0.1, buffers="average",
                                  buffer_every=1, buffer_mix=0.5)
        w1 = asyncps.torch.Worker(model(), c1, lr=0.1, buffers="average",
                                  buffer_every=1, buffer_mix=0.5)
        with w0, w1:
            assert "1.running_mean" in w0.specs
            assert "1.num_batches_tracked" not in w0.specs  # int: local
            shared = c0.pull("1.running_mean")["1.running_mean"].copy()
            assert np.all(shared == 0)  # the module's own initial values
            own = run_step(w0, torch.randn(8, 3) + 5)
            expected = (shared + own.numpy()) / 2  # moved halfway, taken
            np.testing.assert_allclose(
                c0.pull("1.running_mean")["1.running_mean"], expected,
                rtol=1e-6)
            np.testing.assert_allclose(w0.module[1].running_mean.numpy(),
                                       expected, rtol=1e-6)
            own = run_step(w1, torch.randn(8, 3) - 5)
            expected = (expected + own.numpy()) / 2
            np.testing.assert_allclose(
                c1.pull("1.running_mean")["1.running_mean"], expected,
                rtol=1e-6)
            # state_dict(): the shards' parameters and shared buffers, the
            # same from either worker; the module is not touched.
            sd0, sd1 = w0.state_dict(), w1.state_dict()
            assert set(sd0) == set(w0.module.state_dict())
            for key in ("0.weight", "0.bias", "1.weight", "1.running_mean",
                        "1.running_var"):
                assert torch.equal(sd0[key], sd1[key]), key
            np.testing.assert_allclose(sd0["1.running_mean"].numpy(),
                                       expected, rtol=1e-6)
            np.testing.assert_array_equal(
                sd0["0.weight"].numpy(), c0.pull("0.weight")["0.weight"])
            assert not torch.equal(w0.module[1].running_mean,
                                   sd0["1.running_mean"])
            # Loading it into a fresh module gives the shards' model.
            fresh = model()
            fresh.load_state_dict(sd0)
            assert torch.equal(fresh[0].weight, sd0["0.weight"])


def test_load_state_dict_assigns_shared_buffers_and_keeps_local_ones(cluster):
    shards = cluster.start(2)

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))

    saved = model().state_dict()
    saved["1.running_mean"] = torch.tensor([1.0, -2.0, 3.0])
    saved["1.num_batches_tracked"] = torch.tensor(7)
    # A local buffer of another shape is refused before the shards change.
    with connect(shards, 2) as c2:
        w2 = asyncps.torch.Worker(model(), c2, lr=0.1, buffers="average")
        with w2, pytest.raises(ValueError, match="'1.num_batches_tracked'"):
            w2.load_state_dict(dict(saved, **{
                "1.num_batches_tracked": torch.tensor([7, 7])}))
        np.testing.assert_array_equal(
            c2.pull("1.running_mean")["1.running_mean"], np.zeros(3))
    with connect(shards, 0) as c0, connect(shards, 1) as c1:
        w0 = asyncps.torch.Worker(model(), c0, lr=0.1, buffers="average")
        w1 = asyncps.torch.Worker(model(), c1, lr=0.1, buffers="average")
        with w0, w1:
            w0.load_state_dict(saved)
            # The float buffers' shared copies are assigned; the integer
            # one is this worker's own, loaded into its module only.
            np.testing.assert_array_equal(
                c1.pull("1.running_mean")["1.running_mean"],
                np.array([1.0, -2.0, 3.0], np.float32))
            assert w0.module[1].num_batches_tracked.item() == 7
            assert w1.module[1].num_batches_tracked.item() == 0
            sd = w1.state_dict()
            assert torch.equal(sd["1.running_mean"], saved["1.running_mean"])
            assert torch.equal(sd["0.weight"], saved["0.weight"])


def test_shapes_are_checked_against_the_shards(cluster):
    shards = cluster.start(1)
    with connect(shards) as client:
        client.create({"fc.weight": asyncps.TensorSpec((3, 2), lr=0.01),
                       "fc.bias": asyncps.TensorSpec((2,), lr=0.01)})
        with pytest.raises(ValueError, match=r"'fc.weight' has shape \(2, 3\)"):
            asyncps.torch.Worker(Tiny(), client, create=False, init="zeros")
        # Created here too: the same shape error, not the shards' refusal.
        with pytest.raises(ValueError, match=r"'fc.weight' has shape \(2, 3\)"):
            asyncps.torch.Worker(Tiny(), client, init="zeros")
        # Same shapes, another optimizer: the shards' ALREADY_EXISTS, in words.
        client.create({"o/fc.weight": asyncps.TensorSpec((2, 3), lr=0.5),
                       "o/fc.bias": asyncps.TensorSpec((2,), lr=0.5)})
        with pytest.raises(asyncps.RpcError) as e:
            asyncps.torch.Worker(Tiny(), client, init="zeros", lr=0.01,
                                 prefix="o/")
        assert e.value.code == "ALREADY_EXISTS"
        assert "learning_rate is 0.5 on the shard, 0.01 asked" in e.value.message
        with pytest.raises(ValueError, match="float32"):
            asyncps.torch.Worker(Tiny().double(), client, prefix="d/")
        with pytest.raises(TypeError, match="asyncps.Client"):
            asyncps.torch.Worker(Tiny(), "127.0.0.1:1")


def test_worker_leaves_when_the_loop_raises(cluster):
    shards = cluster.start(1)
    model = Tiny()
    with connect(shards, worker_id=4) as client:
        with pytest.raises(RuntimeError, match="boom"):
            with asyncps.torch.Worker(model, client) as worker:
                worker.step(sum_closure(model))
                raise RuntimeError("boom")
        (me,) = client.status()["workers"]
        assert me["worker_id"] == 4 and me["state"] == "left"
        with pytest.raises(ValueError, match="left"):
            worker.step(sum_closure(model))


def test_ssp_fast_worker_waits_for_slow_one(cluster):
    slack = 1
    shards = cluster.start(2, ["--consistency=ssp", f"--ssp_slack={slack}",
                               "--slice_elems=2",
                               "--pull_wait_timeout_ms=60000",
                               "--worker_lease_ms=60000"])
    slow_model, fast_model = Tiny(), Tiny()
    with connect(shards, 0) as slow_client, connect(shards, 1) as fast_client:
        slow = asyncps.torch.Worker(slow_model, slow_client, lr=0.01)
        fast = asyncps.torch.Worker(fast_model, fast_client, lr=0.01)
        for _ in range(2):
            slow.step(sum_closure(slow_model))
        # The slow worker completed 2 steps (clock 2). A pull at clock c is
        # answered once every live worker has clock >= c - slack, so the
        # fast worker completes steps 0..2+slack and then waits.
        steps = 10
        done = []
        errors = []

        def run_fast():
            try:
                for _ in range(steps):
                    fast.step(sum_closure(fast_model))
                    done.append(fast_client.clock)
            except Exception as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=run_fast)
        t.start()

        def waits():
            return int(slow_client.status()["summary"]["pull_waits"])

        # Every shard holding a slice gets the pull and counts its wait.
        holders = sum(1 for s in slow_client.status()["shards"]
                      if s["status"]["slices"] > 0)
        wait_until(lambda: waits() == holders, 30, "the fast worker to wait")
        assert len(done) == 2 + slack + 1 and not errors
        slow.step(sum_closure(slow_model))  # clock 3: one more step allowed
        wait_until(lambda: waits() == 2 * holders, 30,
                   "the fast worker to wait again")
        assert len(done) == 3 + slack + 1 and not errors
        status = slow_client.status()
        clocks = {w["worker_id"]: w["clock"] for w in status["workers"]}
        assert clocks == {0: 3, 1: 3 + slack + 1}
        slow.leave()  # nobody to wait for any more
        t.join(60)
        assert not t.is_alive() and not errors
        assert len(done) == steps
        fast.leave()


def regression_data():
    """256 inputs of 3 features and their targets under a fixed linear map
    (seeded): what the overlap tests train Tiny on."""
    torch.manual_seed(0)
    x = torch.randn(256, 3)
    return x, x @ torch.tensor([[1.0, -2.0], [0.5, 0.0], [-1.0, 3.0]]) + 0.25


def test_overlapped_pull_trains_under_asp_only(cluster):
    shards = cluster.start(2)
    x, target = regression_data()
    model = Tiny()
    with connect(shards) as client:
        with asyncps.torch.Worker(model, client, optimizer="momentum", lr=0.05,
                                  overlap_pull=True) as worker:
            losses = []
            for _ in range(150):
                def closure():
                    loss = ((model(x) - target) ** 2).mean()
                    loss.backward()
                    return loss
                losses.append(worker.step(closure).item())
            # Seen: 9.1 at first, 1e-4 .. 6e-3 after 150 steps (the
            # overlapped pulls make the staleness vary from run to run).
            assert losses[-1] < losses[0] / 100
            assert worker.stats["steps"] == 150 == client.clock

    ssp = cluster.start(1, ["--consistency=ssp"])
    with connect(ssp) as client:
        with pytest.raises(ValueError, match="overlap_pull needs"):
            asyncps.torch.Worker(Tiny(), client, overlap_pull=True)


def test_overlapped_push_applies_every_step_and_raises_its_failure(cluster):
    shards = cluster.start(2)
    x, target = regression_data()
    model = Tiny()

    def closure():
        loss = ((model(x) - target) ** 2).mean()
        loss.backward()
        return loss

    with connect(shards) as client:
        worker = asyncps.torch.Worker(model, client, optimizer="momentum",
                                      lr=0.05, overlap_pull=True,
                                      overlap_push=True)
        losses = [worker.step(closure).item() for _ in range(150)]
        # The last push is in flight until leave() (or state_dict()).
        assert worker.stats["applied"] + worker.stats["refused_stale"] < (
            150 * len(worker.specs))
        trained = worker.state_dict()
        worker.leave()
        # Every step's push was answered and applied: each slice's version
        # counts 150 updates.
        assert worker.stats["steps"] == 150 == client.clock
        assert worker.stats["applied"] == 150 * sum(
            len(client.versions(n)) for n in worker.specs)
        for name in worker.specs:
            assert all(v == 150 for v in client.versions(name))
        assert losses[-1] < losses[0] / 100
        for key, value in model.state_dict().items():
            assert trained[key].shape == value.shape

    # A push that fails in the background (a NaN gradient, refused before
    # anything is sent) is raised by the next step, or by leave().
    def nan_closure():
        loss = ((model(x) - target) ** 2).mean() * float("nan")
        loss.backward()
        return loss

    shards = cluster.start(1)
    model = Tiny()
    with connect(shards, worker_id=1) as client:
        worker = asyncps.torch.Worker(model, client, overlap_push=True)
        worker.step(closure)
        assert model.fc.weight.grad is None  # handed to the push
        assert model.fc.bias.grad is None
        worker.step(nan_closure)  # its push fails in the background
        # The next step raises it before sending its own gradients (which
        # stay in p.grad) or advancing the clock.
        with pytest.raises(ValueError, match="NaN or Inf; nothing was sent"):
            worker.step(closure)
        assert client.clock == 2
        assert model.fc.weight.grad is not None
        assert model.fc.bias.grad is not None
        # Only the first step's push reached the shard.
        client.pull(list(worker.specs))
        for name in worker.specs:
            assert all(v == 1 for v in client.versions(name))
        worker.step(nan_closure)
        with pytest.raises(ValueError, match="NaN or Inf; nothing was sent"):
            worker.leave()
        with pytest.raises(ValueError, match="Worker has left"):
            worker.step(closure)


def test_short_fashion_mnist_run_reaches_accuracy_floor(cluster, tmp_path):
    """The example itself: 2 shards, 2 worker processes, 1 epoch over the
    first 12000 training images, evaluated on the first 2000 test images."""
    shards = cluster.start(2)
    servers = ",".join(addresses(shards))
    script = os.path.join(EXAMPLES, "fashion_mnist_cnn.py")
    procs = []
    for w in range(2):
        log = open(tmp_path / f"worker{w}.log", "wb")
        procs.append((subprocess.Popen(
            [sys.executable, script, f"--servers={servers}", f"--worker_id={w}",
             "--num_workers=2", "--epochs=1", "--train_examples=12000",
             "--test_examples=2000", "--log_every=0", "--wait_timeout=300"],
            stdout=log, stderr=subprocess.STDOUT), log))
    try:
        for proc, log in procs:
            proc.wait(timeout=400)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            log.close()
    out = [(tmp_path / f"worker{w}.log").read_text() for w in range(2)]
    for w, (proc, _) in enumerate(procs):
        assert proc.returncode == 0, out[w]
    (line,) = [l for l in out[0].splitlines() if l.startswith("final test accuracy:")]
    accuracy = float(line.split(":")[1])
    print(out[0] + out[1])
    assert accuracy >= 0.70, out[0]
