"""asyncps: asynchronous and bounded-staleness SGD on a parameter server.

The client talks to the ``ps_server`` shards of a cluster::

    import numpy as np
    import asyncps

    with asyncps.Client(["127.0.0.1:7000", "127.0.0.1:7001"], worker_id=0) as c:
        c.create({"w": asyncps.TensorSpec((784, 10), init="uniform",
                                          init_value=0.05, lr=0.1)})
        w = c.pull(["w"])["w"]                  # numpy float32 (784, 10)
        r = c.push({"w": np.ones_like(w)})      # PushResult
        c.clock += 1
        # Sparse tables: rows created on first touch, sharded by id.
        c.create_tables({"emb": asyncps.TableSpec(16, optimizer="adagrad")})
        rows = c.pull_rows({"emb": [3, 70001, 3]})["emb"]   # (3, 16)
        c.push_rows({"emb": ([3, 70001, 3], np.ones_like(rows))})

``asyncps.torch`` trains a ``torch.nn.Module`` asynchronously against the
shards; ``asyncps.idx`` reads IDX files (MNIST / Fashion-MNIST);
``asyncps.cluster`` starts local shards (``python3 -m asyncps.cluster``);
``asyncps.serving`` is a client of ``ps_serve`` (inference, KServe v2 REST).
"""

from asyncps import _native, _signatures

# inspect.signature()/help() see real signatures; classes are asyncps.X.
_signatures.expose(_native, __name__)

from asyncps._native import (  # noqa: E402 (after expose)
    Client,
    PushResult,
    RpcError,
    TableSpec,
    TensorSpec,
    __version__,
    tune_malloc_for_large_messages,
)

__all__ = [
    "Client",
    "PushResult",
    "RpcError",
    "TableSpec",
    "TensorSpec",
    "__version__",
    "tune_malloc_for_large_messages",
]
