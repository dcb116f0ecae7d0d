"""Sparse tables through asyncps.Client against real ps_server shards."""

import math

import numpy as np
import pytest

import asyncps
from conftest import addresses


def connect(shards, worker_id=0):
    return asyncps.Client(addresses(shards), worker_id, rpc_timeout=30.0)


def constant_sgd(dim, init_value=1.0):
    """Constant rows, SGD with lr 1: a row is init - the sum of its grads."""
    return asyncps.TableSpec(dim, init="constant", init_value=init_value,
                             optimizer="sgd", lr=1.0)


def table_rows(status, name):
    """Rows of table `name` on each shard, from Client.status()."""
    rows = []
    for shard in status["shards"]:
        tables = shard["status"].get("tables", [])
        rows.append(sum(int(t.get("rows", 0)) for t in tables
                        if t["name"] == name))
    return rows


def test_rows_exact_values_repeated_ids_and_placement(cluster):
    shards = cluster.start(2)
    with connect(shards) as c:
        stored = c.create_tables({"emb": constant_sgd(4)})
        assert stored["emb"].dim == 4 and stored["emb"].lr == 1.0
        assert stored["emb"].name == "emb" and stored["emb"].init == "constant"

        ids = np.array([1, 5, 1, 2**40], dtype=np.uint64)
        rows = c.pull_rows({"emb": ids})["emb"]
        assert rows.dtype == np.float32 and rows.shape == (4, 4)
        assert np.all(rows == 1.0)

        # Repeated ids are summed: row 1 gets g[0] + g[2].
        g = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
        r = c.push_rows({"emb": ([1, 5, 1], g)})
        assert r.refused_stale == 0 and r.duplicates == 0
        c.clock = 1
        after = c.pull_rows({"emb": [1, 5, 2**40, 9]})["emb"]
        np.testing.assert_array_equal(after[0], 1.0 - (g[0] + g[2]))
        np.testing.assert_array_equal(after[1], 1.0 - g[1])
        np.testing.assert_array_equal(after[2], np.ones(4, np.float32))
        np.testing.assert_array_equal(after[3], np.ones(4, np.float32))

        # 256 ids spread over both shards; the shards created each row once.
        many = np.arange(1000, 1256, dtype=np.int64)
        c.pull_rows({"emb": many})
        per_shard = table_rows(c.status(), "emb")
        assert sum(per_shard) == 4 + 256
        assert min(per_shard) > 0


def test_rows_adagrad_step_and_a_second_client(cluster):
    shards = cluster.start(2)
    spec = asyncps.TableSpec(2, init="constant", init_value=0.5,
                             optimizer="adagrad", lr=0.1, epsilon=1e-6,
                             initial_accumulator=0.1)
    with connect(shards, 0) as a, connect(shards, 1) as b:
        a.create_tables([asyncps.TableSpec(2, name="t", init="constant",
                                           init_value=0.5, optimizer="adagrad",
                                           lr=0.1, epsilon=1e-6,
                                           initial_accumulator=0.1)])
        assert b.wait_for(["t"], timeout=10.0)["t"].optimizer == "adagrad"
        b.pull_rows({"t": [7]})
        g = np.array([[0.3, -0.4]], np.float32)
        b.push_rows({"t": ([7], g)})
        a.clock = 1
        row = a.pull_rows({"t": [7]})["t"][0]
        for j in range(2):
            acc = 0.1 + float(g[0, j]) ** 2
            want = 0.5 - 0.1 * float(g[0, j]) / (math.sqrt(acc) + 1e-6)
            assert row[j] == pytest.approx(want, rel=1e-5)
        # The same spec again is a no-op; a different one is refused.
        a.create_tables({"t": spec})
        with pytest.raises(asyncps.RpcError) as e:
            a.create_tables({"t": asyncps.TableSpec(3)})
        assert e.value.grpc_code == 6  # ALREADY_EXISTS


def test_rows_bad_input_is_refused_and_changes_nothing(cluster):
    shards = cluster.start(1)
    with connect(shards) as c:
        c.create_tables({"emb": constant_sgd(3)})
        c.pull_rows({"emb": [4]})
        good = np.ones((1, 3), np.float32)
        with pytest.raises(ValueError, match="unknown table 'nope'"):
            c.pull_rows({"nope": [1]})
        with pytest.raises(ValueError, match=">= 0"):
            c.pull_rows({"emb": [-1]})
        with pytest.raises(TypeError, match="integers"):
            c.pull_rows({"emb": [1.5]})
        with pytest.raises(ValueError, match="1-D"):
            c.pull_rows({"emb": [[1, 2]]})
        with pytest.raises(ValueError, match=r"shape \(1, 3\)"):
            c.push_rows({"emb": ([4], np.ones((1, 4), np.float32))})
        with pytest.raises(TypeError, match="float32"):
            c.push_rows({"emb": ([4], np.ones((1, 3), np.float64))})
        with pytest.raises(TypeError, match="tuple"):
            c.push_rows({"emb": good})
        nan = good.copy()
        nan[0, 1] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            c.push_rows({"emb": ([4], nan)})
        # Nothing above reached the row.
        np.testing.assert_array_equal(c.pull_rows({"emb": [4]})["emb"][0],
                                      np.ones(3, np.float32))
        # A CPU torch tensor is taken for the gradients.
        import torch
        c.push_rows({"emb": ([4], torch.full((1, 3), 0.5))})
        c.clock = 1
        np.testing.assert_array_equal(c.pull_rows({"emb": [4]})["emb"][0],
                                      np.full(3, 0.5, np.float32))


def test_peek_reads_without_creating_and_list_tensors(cluster):
    shards = cluster.start(2)
    with connect(shards) as c:
        c.create_tables({"emb": constant_sgd(2, init_value=3.0)})
        c.create({"w": asyncps.TensorSpec((5,), init="constant",
                                            init_value=2.0)})
        peeked = c.pull_rows({"emb": [10, 11, 12]}, peek=True)["emb"]
        np.testing.assert_array_equal(peeked, np.full((3, 2), 3.0, np.float32))
        # Peeking created no row.
        assert sum(table_rows(c.status(), "emb")) == 0
        # A trained row is peeked as trained.
        c.pull_rows({"emb": [10]})
        c.push_rows({"emb": ([10], np.ones((1, 2), np.float32))})
        c.clock = 1
        np.testing.assert_array_equal(
            c.pull_rows({"emb": [10, 11]}, peek=True)["emb"],
            np.array([[2.0, 2.0], [3.0, 3.0]], np.float32))
        assert sum(table_rows(c.status(), "emb")) == 1

        tensors, tables = c.list_tensors()
        assert list(tensors) == ["w"] and list(tables) == ["emb"]
        assert tensors["w"].shape == (5,) and tensors["w"].init == "constant"
        assert tables["emb"].dim == 2 and tables["emb"].init_value == 3.0


def test_table_spec_checks():
    with pytest.raises(ValueError, match="dim"):
        asyncps.TableSpec(0)
    with pytest.raises(ValueError, match="dim"):
        asyncps.TableSpec(65537)
    with pytest.raises(ValueError):
        asyncps.TableSpec(4, init="glorot_uniform")
    with pytest.raises(ValueError, match="epsilon"):
        asyncps.TableSpec(4, optimizer="adagrad", epsilon=0.0)
    s = asyncps.TableSpec(8, optimizer="adagrad")
    assert s.dim == 8 and s.optimizer == "adagrad" and "TableSpec(" in repr(s)
    # The optimizer attributes of a TensorSpec, on a TableSpec too.
    t = asyncps.TensorSpec((2,), optimizer="adagrad")
    for field in ("lr", "momentum", "beta1", "beta2", "epsilon",
                  "initial_accumulator"):
        assert getattr(s, field) == getattr(t, field), field
    with pytest.raises(ValueError):
        asyncps.TableSpec(4, init="values")
