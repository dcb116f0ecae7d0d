"""nn.Embedding / nn.EmbeddingBag(sparse=True) routed to sparse tables by
asyncps.torch.Worker, against real shards."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import asyncps
import asyncps.torch
from conftest import addresses

torch.set_num_threads(1)


class Bag(nn.Module):
    """Ids -> embedding (sparse) -> linear."""

    def __init__(self, num=1000, dim=4, padding_idx=None, bag=False):
        super().__init__()
        if bag:
            self.emb = nn.EmbeddingBag(num, dim, mode="sum", sparse=True)
        else:
            self.emb = nn.Embedding(num, dim, sparse=True,
                                    padding_idx=padding_idx)
        self.out = nn.Linear(dim, 1)

    def forward(self, ids):
        e = self.emb(ids)
        if e.dim() == 3:
            e = e.sum(1)
        return self.out(e).sum()


def connect(shards, worker_id=0):
    return asyncps.Client(addresses(shards), worker_id, rpc_timeout=30)


def table_rows(client, table):
    rows = 0
    for shard in client.status()["shards"]:
        for t in shard["status"]["tables"]:
            if t["name"] == table:
                rows += int(t["rows"])
    return rows


def closure_of(model, ids):
    def closure():
        loss = model(ids)
        loss.backward()
        return loss
    return closure


def test_sparse_embedding_trains_rows_exactly(cluster):
    shards = cluster.start(2)
    model = Bag(padding_idx=0)
    ids = torch.tensor([[3, 7, 0], [7, 11, 0]])
    with connect(shards) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # table_init given: no warning
            worker = asyncps.torch.Worker(model, client, optimizer="sgd",
                                          lr=0.5, table_init=("uniform", 0.1))
        with worker:
            assert set(worker.specs) == {"out.weight", "out.bias"}
            assert worker.tables["emb.weight"].dim == 4
            assert table_rows(client, "emb.weight") == 0
            # What the shards will hold after one step, from a plain copy.
            before = client.pull_rows({"emb.weight": [3, 7, 11]},
                                      peek=True)["emb.weight"]
            assert table_rows(client, "emb.weight") == 0  # peek created none
            w = client.pull("out.weight")["out.weight"]  # (1, 4)
            # d loss / d row = out.weight per use: 3 once, 7 twice, 11 once.
            uses = np.array([[1], [2], [1]], np.float32)
            expected = before - 0.5 * uses * w
            worker.step(closure_of(model, ids))
            after = client.pull_rows({"emb.weight": [3, 7, 11]},
                                     peek=True)["emb.weight"]
            np.testing.assert_allclose(after, expected, rtol=1e-6)
            # Only the ids used were created; padding never was.
            assert table_rows(client, "emb.weight") == 3
            assert torch.equal(model.emb.weight[0], torch.zeros(4))
            assert worker.stats["rows_pulled"] == 3
            assert worker.stats["rows_pushed"] == 3
            assert worker.stats["rows_applied"] == 3
            # The dense push went to both shards with the next step's pull,
            # and the module holds what it pulled.
            assert client.status()["summary"]["steps"] == 2
            np.testing.assert_array_equal(
                model.out.weight.detach().numpy(),
                client.pull("out.weight")["out.weight"])
            # The next forward pulls the trained rows into the layer.
            worker.step(closure_of(model, ids))
            assert worker.stats["rows_pulled"] == 6
            assert client.status()["summary"]["steps"] == 4
            # Evaluation (no_grad or eval mode) reads without creating.
            model.eval()
            with torch.no_grad():
                model(torch.tensor([[500, 501, 3]]))
            assert table_rows(client, "emb.weight") == 3
            assert worker.stats["rows_pulled"] == 6
            np.testing.assert_array_equal(
                model.emb.weight[500].detach().numpy(),
                client.pull_rows({"emb.weight": [500]},
                                 peek=True)["emb.weight"][0])
            # state_dict(): the whole table, read without creating rows.
            sd = worker.state_dict()
            assert sd["emb.weight"].shape == (1000, 4)
            np.testing.assert_array_equal(
                sd["emb.weight"][[3, 7, 11, 999]].numpy(),
                client.pull_rows({"emb.weight": [3, 7, 11, 999]},
                                 peek=True)["emb.weight"])
            assert torch.equal(sd["emb.weight"][0], torch.zeros(4))
            assert table_rows(client, "emb.weight") == 3
            assert torch.equal(sd["out.weight"],
                               torch.from_numpy(client.pull("out.weight")[
                                   "out.weight"]))


def test_load_state_dict_assigns_every_row_of_a_sparse_embedding(cluster):
    shards = cluster.start(2)
    saved = Bag(num=70000, padding_idx=0).state_dict()  # > one 65536-row call
    with connect(shards, 0) as c0, connect(shards, 1) as c1:
        w0 = asyncps.torch.Worker(Bag(num=70000, padding_idx=0), c0, lr=0.5,
                                  table_init=("uniform", 0.1))
        w1 = asyncps.torch.Worker(Bag(num=70000, padding_idx=0), c1, lr=0.5,
                                  table_init=("uniform", 0.1), create=False)
        with w0, w1:
            ids = torch.tensor([[3, 7, 0], [69999, 11, 0]])
            w0.step(closure_of(w0.module, ids))
            w0.load_state_dict(saved)
            # Every row but padding is on the shards with the saved values
            # (created where it was not), one version more than before.
            assert table_rows(c0, "emb.weight") == 69999
            probe = [1, 3, 7, 11, 65535, 65536, 69999]
            rows = c1.pull_rows({"emb.weight": probe}, peek=True)["emb.weight"]
            np.testing.assert_array_equal(rows,
                                          saved["emb.weight"][probe].numpy())
            seen = {}

            def closure():
                loss = w1.module(ids)
                seen["rows"] = w1.module.emb.weight[[3, 69999]].detach().clone()
                seen["out"] = w1.module.out.weight.detach().clone()
                loss.backward()
                return loss

            # The step computes on the loaded values (after it, the module
            # holds the values its push left: the next step's).
            w1.step(closure)
            assert torch.equal(seen["rows"], saved["emb.weight"][[3, 69999]])
            assert torch.equal(seen["out"], saved["out.weight"])
            # Client-level: an id twice is refused before anything is sent.
            with pytest.raises(ValueError, match="given twice; nothing"):
                c0.assign_rows({"emb.weight": (
                    np.array([5, 5], np.uint64), np.zeros((2, 4), np.float32))})
            with pytest.raises(ValueError, match="values of table 'emb.weight' "
                               "contain NaN"):
                c0.assign_rows({"emb.weight": (
                    np.array([5], np.uint64),
                    np.full((1, 4), np.nan, np.float32))})
            r = c0.assign_rows({"emb.weight": (
                np.array([5, 6], np.uint64), np.ones((2, 4), np.float32))})
            assert r.applied == 2
            np.testing.assert_array_equal(
                c1.pull_rows({"emb.weight": [5, 6]}, peek=True)["emb.weight"],
                np.ones((2, 4), np.float32))


def test_embedding_bag_and_a_second_worker(cluster):
    shards = cluster.start(2)
    ids = torch.tensor([[1, 2], [2, 3]])
    with connect(shards, 0) as c0, connect(shards, 1) as c1:
        with pytest.warns(UserWarning, match="emb.weight.*N\\(0, 1\\)"):
            w0 = asyncps.torch.Worker(Bag(bag=True), c0, lr=0.1)
        w1 = asyncps.torch.Worker(Bag(bag=True), c1, lr=0.1, create=False,
                                  table_init=("normal", 1.0))
        with w0, w1:
            w0.step(closure_of(w0.module, ids))
            trained = c0.pull_rows({"emb.weight": [1, 2, 3]},
                                   peek=True)["emb.weight"]
            seen = {}

            def closure():
                loss = w1.module(ids)
                seen["rows"] = w1.module.emb.weight[[1, 2, 3]].detach().clone()
                loss.backward()
                return loss

            w1.step(closure)
            # Worker 1's forward read the rows worker 0 trained.
            np.testing.assert_array_equal(seen["rows"].numpy(), trained)
            assert w0.stats["rows_pushed"] == 3 == w1.stats["rows_pushed"]
            # set_lr reaches the table too.
            assert w0.set_lr(0.05, step=1) == pytest.approx(0.05)
            tensors, tables = c0.list_tensors()
            assert tables["emb.weight"].scheduled_lr == pytest.approx(0.05)


def test_max_norm_and_dim_mismatch_are_refused(cluster):
    shards = cluster.start(1)
    model = Bag()
    model.emb.max_norm = 1.0
    with connect(shards) as client:
        with pytest.raises(ValueError, match="max_norm"):
            asyncps.torch.Worker(model, client, table_init=("normal", 1.0))
        asyncps.torch.Worker(Bag(dim=4), client, table_init=("normal", 1.0),
                             prefix="a/").leave()
    with connect(shards, 1) as client:
        with pytest.raises(asyncps.RpcError, match="dim"):
            asyncps.torch.Worker(Bag(dim=5), client,
                                 table_init=("normal", 1.0), prefix="a/")
