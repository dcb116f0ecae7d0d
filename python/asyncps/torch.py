"""Asynchronous data-parallel PyTorch training through asyncps.

A :class:`Worker` ties a ``torch.nn.Module`` to an :class:`asyncps.Client`.
Every parameter becomes a tensor on the shards, named as in
``module.named_parameters()`` (plus an optional prefix); the optimizer runs
on the shards, so the training loop has none::

    import asyncps, asyncps.torch, torch.nn.functional as F

    with asyncps.Client(servers, worker_id=rank) as client:
        with asyncps.torch.Worker(model, client, optimizer="momentum",
                                  lr=0.05, momentum=0.9) as worker:
            for x, y in batches:
                def closure():
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    return loss
                worker.step(closure)

Each ``step`` pulls the current parameters into the module (in place, no
extra copy), zeroes the gradients, runs the closure (forward and backward),
pushes ``p.grad`` of every parameter that has one, and advances the
worker's clock (``client.clock``). The shards' flags choose the staleness
policy: under SSP/BSP the pull waits for slower workers; with
``--max_staleness`` gradients computed from too old parameters are refused
(counted in :attr:`Worker.stats`). Leaving the ``with`` block says goodbye
to the shards (also on an exception), so nobody waits for this worker.

Parameters must be float32 CPU tensors; buffers (e.g. BatchNorm running
statistics) stay local to each worker; parameters with
``requires_grad=False`` are not shared.
"""

import concurrent.futures
import contextlib
import math
import threading

import numpy as np
import torch

import asyncps

__all__ = ["Worker", "torch_default_init"]


def torch_default_init(name, param, params):
    """(init, init_value) matching PyTorch's default for Linear/Conv layers.

    Weights with 2+ dimensions, and the bias next to such a weight, are
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = elements per output
    unit, as ``nn.Linear`` and ``nn.ConvNd`` initialize them. Other 1-D
    weights (normalization layers) are 1, everything else 0.
    `params` maps every parameter name to its tensor.
    """
    if param.dim() >= 2:
        return "uniform", 1.0 / math.sqrt(param[0].numel())
    if name.endswith("bias"):
        weight = params.get(name[: -len("bias")] + "weight")
        if weight is not None and weight.dim() >= 2:
            return "uniform", 1.0 / math.sqrt(weight[0].numel())
        return "zeros", 0.0
    if name.endswith("weight"):
        return "constant", 1.0
    return "zeros", 0.0


def _trainable_parameters(module):
    """{name: parameter} of the parameters with requires_grad, checked to
    be float32 contiguous CPU tensors (ValueError naming one that is not)."""
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("Worker: the module has no trainable parameters")
    for name, p in params.items():
        if p.dtype != torch.float32:
            raise ValueError(f"Worker: parameter '{name}' is {p.dtype}; "
                             "asyncps holds float32")
        if p.device.type != "cpu":
            raise ValueError(f"Worker: parameter '{name}' is on {p.device}; "
                             "only CPU parameters are supported")
        if not p.is_contiguous():
            raise ValueError(f"Worker: parameter '{name}' is not contiguous")
    return params


def _plain_asp(policy):
    """True for a shard policy (Status JSON) of ASP without a staleness
    bound or learning-rate scaling."""
    return (policy.get("consistency", "ASP") == "ASP"
            and int(policy.get("max_staleness", -1)) < 0
            and policy.get("staleness_lr", "none") in ("", "none"))


class Worker:
    """Trains `module` asynchronously through `client` (an asyncps.Client).

    Worker(module, client, *, optimizer='sgd', lr=0.01, momentum=0.9,
           beta1=0.9, beta2=0.999, epsilon=1e-8, init='torch', seed=0,
           prefix='', create=True, wait_timeout=120.0, overlap_pull=False,
           slice_elems=0)

    optimizer, lr, momentum, beta1, beta2, epsilon
        the optimizer the shards run for every parameter (see TensorSpec).
    init  'torch' (torch_default_init: PyTorch's Linear/Conv defaults), one
          of TensorSpec's init names (with init_value 0.05 for the random
          ones), or a function (name, param, params) -> (init, init_value).
          The shards draw the values (seeded by `seed` + parameter index),
          so every worker starts from the same parameters.
    prefix  prepended to every parameter name on the shards.
    create  True: create the tensors (idempotent, so every worker may; a
          worker configured differently gets RpcError ALREADY_EXISTS).
          False: wait up to `wait_timeout` seconds for another worker to.
    overlap_pull
          pull the next step's parameters in a background thread while
          the current step computes. The next step then starts from values
          that miss this step's own gradient, and its push is tagged with
          the versions of that overlapped pull, so the shards' staleness
          accounting does not hold; therefore only allowed when every shard
          runs ASP without --max_staleness and --staleness_lr.

    Shapes are checked against the shards' specs (ValueError naming the
    parameter). A step must take less than the shards' --worker_lease_ms;
    wrap longer pauses (evaluation) in ``with worker.paused():``.
    """

    def __init__(self, module, client, *, optimizer="sgd", lr=0.01,
                 momentum=0.9, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 init="torch", seed=0, prefix="", create=True,
                 wait_timeout=120.0, overlap_pull=False, slice_elems=0):
        if not isinstance(module, torch.nn.Module):
            raise TypeError("Worker: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if not isinstance(client, asyncps.Client):
            raise TypeError("Worker: client must be an asyncps.Client, got "
                            f"{type(client).__name__}")
        self.module = module
        self.client = client
        params = _trainable_parameters(module)
        # (tensor name on the shards, parameter), in named_parameters() order.
        self._params = [(prefix + n, p) for n, p in params.items()]

        specs = {}
        for index, (name, p) in enumerate(params.items()):
            if callable(init):
                kind, value = init(name, p, params)
            elif init == "torch":
                kind, value = torch_default_init(name, p, params)
            else:
                kind = init
                value = 0.05 if init in ("uniform", "normal") else 0.0
            specs[prefix + name] = asyncps.TensorSpec(
                tuple(p.shape), init=kind, init_value=value, seed=seed + index,
                optimizer=optimizer, lr=lr, momentum=momentum, beta1=beta1,
                beta2=beta2, epsilon=epsilon, slice_elems=slice_elems)
        if create:
            stored = client.create(specs)
        else:
            stored = client.wait_for(list(specs), timeout=wait_timeout)
        for name, p in self._params:
            if tuple(stored[name].shape) != tuple(p.shape):
                raise ValueError(
                    f"Worker: parameter '{name}' has shape {tuple(p.shape)} "
                    f"but the shards hold {tuple(stored[name].shape)}")
        self.specs = stored

        status = client.status()
        policies = [s["status"]["policy"] for s in status["shards"]]
        lease_ms = min(int(p.get("worker_lease_ms", 10000)) for p in policies)
        self._lease_s = max(lease_ms / 1000.0, 0.01)
        self.overlap_pull = bool(overlap_pull)
        self._executor = None
        self._pending = None  # Future of the overlapped pull, if any
        self._buffers = None  # what the overlapped pull writes into
        if self.overlap_pull:
            if not all(_plain_asp(p) for p in policies):
                raise ValueError(
                    "Worker: overlap_pull needs every shard to run ASP "
                    "without --max_staleness and --staleness_lr (the "
                    f"shards run {status['summary']['policy']})")
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="asyncps-pull")
            self._buffers = {n: np.empty(tuple(p.shape), np.float32)
                             for n, p in self._params}

        self.stats = {"steps": 0, "applied": 0, "refused_stale": 0,
                      "duplicates": 0, "max_staleness": 0,
                      "mean_staleness": 0.0}
        self._staleness_sum = 0.0
        self._closed = False

    # ------------------------------------------------------------ steps

    def pull(self):
        """Pulls every parameter into the module, in place, at client.clock."""
        self.client.pull_into({n: p.detach().numpy() for n, p in self._params})

    def push(self):
        """Pushes p.grad of every parameter that has one; a PushResult."""
        grads = {}
        for name, p in self._params:
            g = p.grad
            if g is None:
                continue
            g = g.detach()
            if not g.is_contiguous():
                g = g.contiguous()
            grads[name] = g.numpy()
        result = self.client.push(grads)
        self._account(result)
        return result

    def step(self, closure):
        """One training step; returns what `closure` returns.

        Pulls the parameters into the module, zeroes the gradients, calls
        `closure()` (which runs forward and backward), pushes the
        gradients and advances client.clock.
        """
        self._check_open()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
            with torch.no_grad():
                for name, p in self._params:
                    p.copy_(torch.from_numpy(self._buffers[name]))
        else:
            self.pull()
        for _, p in self._params:
            if p.grad is not None:
                p.grad.zero_()
        if self.overlap_pull:
            self._pending = self._executor.submit(
                self.client.pull_into, self._buffers, self.client.clock)
        loss = closure()
        self.push()
        self.client.clock += 1
        self.stats["steps"] += 1
        return loss

    def _account(self, r):
        s = self.stats
        s["applied"] += r.applied
        s["refused_stale"] += r.refused_stale
        s["duplicates"] += r.duplicates
        s["max_staleness"] = max(s["max_staleness"], r.max_staleness)
        self._staleness_sum += r.mean_staleness * (r.applied + r.refused_stale)
        n = s["applied"] + s["refused_stale"]
        s["mean_staleness"] = self._staleness_sum / n if n else 0.0

    # ------------------------------------------------------------ liveness

    @contextlib.contextmanager
    def paused(self, interval=None):
        """Keeps this worker's lease alive while the block runs (e.g. an
        evaluation longer than --worker_lease_ms): a background thread
        heartbeats every `interval` seconds (default: a third of the
        lease). A failed heartbeat is raised when the block ends."""
        interval = self._lease_s / 3 if interval is None else float(interval)
        if not interval > 0:
            raise ValueError(f"paused: interval must be > 0, got {interval}")
        stop = threading.Event()
        errors = []

        def beat():
            while not stop.wait(interval):
                try:
                    self.client.heartbeat()
                except Exception as e:  # raised in the caller's thread
                    errors.append(e)
                    return

        thread = threading.Thread(target=beat, name="asyncps-heartbeat",
                                  daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
        if errors:
            raise errors[0]

    def leave(self):
        """Finishes: waits for an overlapped pull and says goodbye to the
        shards (SSP/BSP stop waiting for this worker)."""
        if self._closed:
            return
        self._closed = True
        if self._pending is not None:
            pending, self._pending = self._pending, None
            with contextlib.suppress(Exception):
                pending.result()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if not self.client.closed:
            self.client.leave()

    def _check_open(self):
        if self._closed:
            raise ValueError("Worker has left")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.leave()
        else:
            with contextlib.suppress(Exception):
                self.leave()
        return False
