"""Every bad argument raises TypeError or ValueError before anything is sent.

The shard's counters prove that nothing reached it: after all the bad calls
it has seen exactly the good calls of the test and no rejected request.
"""

import math

import numpy as np
import pytest

import asyncps
from conftest import addresses


def spec(shape=(2, 3), **kwargs):
    return asyncps.TensorSpec(shape, init="constant", init_value=1.0, **kwargs)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(shape=()), ValueError, "shape"),
    (dict(shape=(3, 0)), ValueError, "non-positive"),
    (dict(shape=(-1,)), ValueError, "non-positive"),
    (dict(shape=(3,), init="gaussian"), ValueError, "init must be one of"),
    (dict(shape=(3,), optimizer="rmsprop"), ValueError, "optimizer must be one of"),
    (dict(shape=(3,), lr=0.0), ValueError, "learning_rate"),
    (dict(shape=(3,), lr=math.nan), ValueError, "learning_rate"),
    (dict(shape=(3,), optimizer="momentum", momentum=1.0), ValueError, "momentum"),
    (dict(shape=(3,), optimizer="adam", beta1=-0.1), ValueError, "beta1"),
    (dict(shape=(3,), optimizer="adam", beta2=1.5), ValueError, "beta2"),
    (dict(shape=(3,), optimizer="adam", epsilon=0.0), ValueError, "epsilon"),
    (dict(shape=(3,), slice_elems=-1), ValueError, "slice_elems"),
    (dict(shape=(3,), init="uniform", init_value=-1.0), ValueError, "init_value"),
    (dict(shape=(3,), init="constant", init_value=math.inf), ValueError, "init_value"),
    (dict(shape=(3,), lr="fast"), TypeError, ""),
])
def test_bad_tensor_specs(kwargs, error, words):
    shape = kwargs.pop("shape")
    with pytest.raises(error) as e:
        asyncps.TensorSpec(shape, **kwargs)
    assert words in str(e.value)


@pytest.mark.parametrize("args, kwargs, error, words", [
    (([],), {}, ValueError, "servers"),
    (("",), {}, ValueError, "servers"),
    (("nohost",), {}, ValueError, "nohost"),
    ((["127.0.0.1:0"],), {}, ValueError, "port"),
    ((["127.0.0.1:70000"],), {}, ValueError, "port"),
    (([7000],), {}, TypeError, "servers"),
    ((42,), {}, TypeError, "servers"),
    ((["127.0.0.1:7"], -1), {}, ValueError, "worker_id"),
    ((["127.0.0.1:7"],), dict(rpc_timeout=0), ValueError, "rpc_timeout"),
    ((["127.0.0.1:7"],), dict(max_attempts=-1), ValueError, "max_attempts"),
    ((["127.0.0.1:7"],), dict(call_deadline=0), ValueError, "call_deadline"),
    ((["127.0.0.1:7"],), dict(wire_dtype="fp16"), ValueError, "wire_dtype"),
    ((["127.0.0.1:7"],), dict(connections_per_shard=0), ValueError,
     "connections_per_shard"),
    ((["127.0.0.1:7"],), dict(initial_backoff=-1), ValueError, "initial_backoff"),
    ((["127.0.0.1:7"],), dict(token_file="/nonexistent/token"), ValueError,
     "/nonexistent/token"),
    ((["127.0.0.1:7"],), dict(tls_ca="/nonexistent/ca.pem"), ValueError,
     "/nonexistent/ca.pem"),
    ((["127.0.0.1:7"],), dict(tls_cert="/nonexistent/c.pem"), ValueError,
     "tls_key"),
])
def test_bad_client_options(args, kwargs, error, words):
    with pytest.raises(error) as e:
        asyncps.Client(*args, **kwargs)
    assert words in str(e.value)


def bad_arrays():
    """(array, error, words) that push and pull_into must refuse for a
    (2, 3) float32 tensor."""
    good = np.zeros((2, 3), np.float32)
    return [
        (good.tolist(), TypeError, "numpy.ndarray"),
        (good.astype(np.float64), TypeError, "float32"),
        (good.astype(np.int32), TypeError, "float32"),
        (good.astype(">f4"), TypeError, "float32"),
        (good.reshape(6), ValueError, "shape (6)"),
        (np.zeros((3, 2), np.float32), ValueError, "shape (3, 2)"),
        (np.zeros((2, 4), np.float32), ValueError, "shape (2, 4)"),
        (np.zeros((3, 2), np.float32).T, ValueError, "C-contiguous"),
        (np.zeros((2, 6), np.float32)[:, ::2], ValueError, "C-contiguous"),
        (np.asfortranarray(np.zeros((2, 3), np.float32)), ValueError,
         "C-contiguous"),
    ]


@pytest.fixture
def client(cluster):
    shards = cluster.start(2)
    c = asyncps.Client(addresses(shards), worker_id=3)
    c.create({"t": spec(slice_elems=2)})
    yield c
    # Nothing bad reached the shards: only the create, plus what the test
    # itself sent on purpose.
    summary = c.status()["summary"]
    assert summary["rejected_bad_input"] == 0
    assert summary["pushes"] == 0 and summary["pulls"] == 0
    c.close()


def test_bad_arrays_raise_before_sending(client):
    for array, error, words in bad_arrays():
        with pytest.raises(error) as e:
            client.push({"t": array})
        assert words in str(e.value) and "'t'" in str(e.value), repr(array)
        with pytest.raises(error) as e:
            client.pull_into({"t": array})
        assert words in str(e.value), repr(array)
        with pytest.raises(error) as e:
            client.assign({"t": array})
        assert words in str(e.value) and "'t'" in str(e.value), repr(array)


def test_bad_calls_raise_before_sending(client):
    good = np.zeros((2, 3), np.float32)
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    cases = [
        (lambda: client.pull_into({"t": read_only}), ValueError, "read-only"),
        (lambda: client.push({"u": good}), ValueError, "unknown tensor 'u'"),
        (lambda: client.assign({"u": good}), ValueError, "unknown tensor 'u'"),
        (lambda: client.assign({"t": np.full((2, 3), np.nan, np.float32)}),
         ValueError, "values of tensor 't' contain NaN or Inf; nothing was"),
        (lambda: client.assign([good]), TypeError, "dict"),
        (lambda: client.pull_into({"u": good}), ValueError, "unknown tensor"),
        (lambda: client.pull(["u"]), ValueError, "unknown tensor 'u'"),
        (lambda: client.pull(["t", "t"]), ValueError, "twice"),
        (lambda: client.pull(7), TypeError, "names must be a str"),
        (lambda: client.pull([7]), TypeError, "names must be str"),
        (lambda: client.push([good]), TypeError, "dict"),
        (lambda: client.push({1: good}), TypeError, "str"),
        (lambda: client.pull_into([("t", good)]), TypeError, "dict"),
        (lambda: client.push({"t": good}, clock="now"), TypeError, ""),
        (lambda: client.versions("u"), ValueError, "unknown tensor"),
        (lambda: client.wait_for(["t"], timeout=-1), ValueError, "timeout"),
        (lambda: client.wait_for([""]), ValueError, "empty"),
        (lambda: client.create({"v": "not a spec"}), TypeError, "TensorSpec"),
        (lambda: client.create({"v": spec(name="w")}), ValueError, "named 'w'"),
        (lambda: client.create([spec()]), ValueError, "no name"),
        (lambda: client.create([spec(name="v"), spec(name="v")]), ValueError,
         "twice"),
        (lambda: client.create("v"), TypeError, ""),
        (lambda: setattr(client, "clock", -1), ValueError, "clock"),
    ]
    for call, error, words in cases:
        with pytest.raises(error) as e:
            call()
        assert words in str(e.value)
    assert client.spec("v") is None


def test_torch_tensors_are_checked_as_arrays(client):
    import torch

    with pytest.raises(TypeError, match="float32"):
        client.push({"t": torch.zeros(2, 3, dtype=torch.float64)})
    with pytest.raises(ValueError, match="C-contiguous"):
        client.push({"t": torch.zeros(3, 2).t()})
    with pytest.raises(ValueError, match="shape"):
        client.pull_into({"t": torch.zeros(6)})


def test_closed_client_raises(cluster):
    shards = cluster.start(1)
    c = asyncps.Client(addresses(shards))
    c.close()
    for call in (lambda: c.pull(["t"]), lambda: c.heartbeat(),
                 lambda: c.status(), lambda: c.create({"t": spec()})):
        with pytest.raises(ValueError, match="closed"):
            call()
