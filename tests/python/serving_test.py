"""asyncps.serving.ServingClient against a real ps_serve in front of real
ps_server shards: readiness, metadata, answers equal to the MLP computed
here with numpy on the pulled parameters, and refused requests."""

import os
import subprocess

import numpy as np
import pytest

import asyncps
from asyncps.serving import ServingClient, ServingError
from conftest import addresses, wait_until

PS_SERVE = os.environ.get("ASYNCPS_PS_SERVE", "")
LAYERS = [6, 5, 3]


def forward(params, x):
    h = x
    for i in range(len(LAYERS) - 1):
        h = h @ params[f"fc{i}/w"] + params[f"fc{i}/b"]
        if i + 2 < len(LAYERS):
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def served(cluster, tmp_path):
    shards = cluster.start(2)
    with asyncps.Client(addresses(shards), 0) as c:
        specs = {}
        for i in range(len(LAYERS) - 1):
            specs[f"fc{i}/w"] = asyncps.TensorSpec(
                (LAYERS[i], LAYERS[i + 1]), init="uniform", init_value=0.8, seed=i + 1)
            specs[f"fc{i}/b"] = asyncps.TensorSpec(
                (LAYERS[i + 1],), init="uniform", init_value=0.3, seed=i + 11)
        c.create(specs)
        params = c.pull(list(specs))
    assert PS_SERVE, "ASYNCPS_PS_SERVE is not set (run through Bazel)"
    port_file = tmp_path / "http.port"
    proc = subprocess.Popen(
        [PS_SERVE, "--servers=" + ",".join(addresses(shards)), "--host=127.0.0.1",
         "--port=0", "--http_port=0", f"--http_port_file={port_file}",
         "--max_batch_size=16", "--batch_timeout_us=500"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "serve.log", "w"))
    try:
        wait_until(lambda: port_file.exists() and port_file.read_text().strip(),
                   30, "ps_serve's HTTP port")
        yield ServingClient(f"http://127.0.0.1:{port_file.read_text().strip()}"), params
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


def test_answers_equal_the_model_computed_here(served):
    client, params = served
    client.wait_ready(timeout=30)
    assert client.live() and client.ready()
    meta = client.metadata()
    assert meta["name"] == "mlp"
    assert meta["inputs"][0]["shape"] == [-1, LAYERS[0]]
    assert meta["outputs"][0]["shape"] == [-1, LAYERS[-1]]
    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, LAYERS[0])).astype(np.float32)
    r = client.infer(x, request_id="q1")
    assert r.id == "q1"
    assert r.outputs.shape == (7, LAYERS[-1])
    np.testing.assert_allclose(r.outputs, forward(params, x), rtol=1e-5, atol=1e-6)
    assert r.snapshot_version == 0 and r.snapshot_id >= 1
    assert 1 <= r.batch_rows <= 16
    one = client.infer(x[2], timeout_ms=5000)
    np.testing.assert_allclose(one.outputs[0], r.outputs[2], rtol=1e-6)
    assert client.status().startswith("ready model mlp")


def test_binary_and_json_forms_answer_alike(served):
    client, params = served
    client.wait_ready(timeout=30)
    assert client.binary  # the default
    x = np.random.default_rng(5).normal(size=(4, LAYERS[0])).astype(np.float32)
    binary = client.infer(x, request_id="b")
    as_json = client.infer(x, request_id="j", binary=False)
    assert binary.id == "b" and as_json.id == "j"
    assert binary.outputs.dtype == np.float32
    np.testing.assert_array_equal(binary.outputs, as_json.outputs)
    json_client = ServingClient(client.url, binary=False)
    np.testing.assert_array_equal(json_client.infer(x).outputs, binary.outputs)
    np.testing.assert_allclose(binary.outputs, forward(params, x), rtol=1e-5, atol=1e-6)
    for c in (client, json_client):
        with pytest.raises(ServingError) as e:
            c.infer(np.zeros((2, LAYERS[0] + 1), np.float32))
        assert e.value.status == 400 and "shape" in e.value.message


def test_refused_requests_raise_with_the_reason(served):
    client, _ = served
    client.wait_ready(timeout=30)
    with pytest.raises(ServingError) as e:
        client.infer(np.zeros((2, LAYERS[0] + 1), np.float32))
    assert e.value.status == 400 and "shape" in e.value.message
    with pytest.raises(ServingError) as e:
        client.infer(np.zeros((17, LAYERS[0]), np.float32))
    assert e.value.status == 400 and "17 rows" in e.value.message
    with pytest.raises(ServingError) as e:
        ServingClient(client.url, model="resnet").infer(np.zeros((1, LAYERS[0])))
    assert e.value.status == 404
    with pytest.raises(ValueError):
        client.infer(np.full((1, LAYERS[0]), np.nan))
    with pytest.raises(ValueError):
        ServingClient("127.0.0.1:80")
    # Still serving after all of that.
    assert client.infer(np.ones((1, LAYERS[0]))).outputs.shape == (1, LAYERS[-1])
