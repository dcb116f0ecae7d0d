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

Parameters must be float32 CPU tensors (0-d ones too: a scalar is a
1-element tensor on the shards); they start from the module's own values
(``init='module'``: the values of the worker that creates the tensors
first, e.g. a pretrained model's) unless another ``init`` is chosen.
Buffers (e.g. BatchNorm running statistics) stay local to each worker
(``buffers='local'``; a module with buffers and no ``buffers=`` argument
gets a warning saying so); parameters with ``requires_grad=False`` are not
shared.
"""

import collections.abc
import concurrent.futures
import contextlib
import math
import threading
import warnings

import numpy as np
import torch

import asyncps
from asyncps._torch_buffers import SharedBuffers
from asyncps._torch_tables import SparseEmbeddings

# Rows per pull_rows / assign_rows call when a whole table is read or
# written (state_dict, load_state_dict).
_ROWS_PER_CALL = 65536

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


def _trainable_parameters(module, exclude=()):
    """{name: parameter} of the parameters with requires_grad (but those
    whose id() is in `exclude`), checked to be float32 contiguous CPU
    tensors (ValueError naming one that is not)."""
    params = {n: p for n, p in module.named_parameters()
              if p.requires_grad and id(p) not in exclude}
    if not params and not exclude:
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


def _shard_shape(p):
    """The shape a parameter has on the shards: its own, (1,) for a 0-d
    one (a tensor needs a dimension)."""
    return tuple(p.shape) if p.dim() > 0 else (1,)


def _shard_view(t, shape):
    """`t` (a parameter or gradient) as a float32 numpy array of its shard
    shape, sharing its memory."""
    return t.detach().reshape(shape).numpy()


class _Views:
    """The {name: numpy view} a step hands to the client, made once and
    reused while the tensors stay the same objects at the same memory
    (parameters always; gradients that backward accumulates in place), so
    that a step does no per-tensor conversion. A new dict when anything
    changed, never an old one edited (a push in flight may hold it)."""

    def __init__(self):
        self._named = ()
        self._ptrs = ()
        self._views = None

    def get(self, named):
        """{name: _shard_view(t, shape)} for `named`, a list of (name,
        tensor, shard shape)."""
        ptrs = [t.data_ptr() for _, t, _ in named]
        old = self._named
        if (self._views is None or ptrs != self._ptrs
                or len(named) != len(old)
                or any(a[0] != b[0] or a[1] is not b[1]
                       for a, b in zip(named, old))):
            self._views = {n: _shard_view(t, shape) for n, t, shape in named}
            self._named, self._ptrs = list(named), ptrs
        return self._views


class Worker:
    """Trains `module` asynchronously through `client` (an asyncps.Client).

    Worker(module, client, *, optimizer='sgd', lr=0.01, momentum=0.9,
           beta1=0.9, beta2=0.999, epsilon=1e-8, init='module', seed=0,
           prefix='', create=True, wait_timeout=120.0, overlap_pull=False,
           overlap_push=False, slice_elems=0, buffers=None, buffer_every=10,
           buffer_mix=0.5, lr_schedule=None, table_init=None)

    optimizer, lr, momentum, beta1, beta2, epsilon
        the optimizer the shards run for every parameter (see TensorSpec).
    lr_schedule  a function clock -> learning rate, called before every
          step with client.clock (the steps this worker completed); when
          its value changes, the new rate is set on the shards for every
          parameter from schedule step clock + 1 (Client.set_lr: workers
          running the same schedule agree; a worker behind changes
          nothing). Each change costs one call to every shard, so a
          schedule that changes at epoch boundaries costs nothing per
          step. Or call set_lr() yourself.
    init  'module' (the default): the tensors start from the module's
          current values, sent with the creation; the first worker to
          create a tensor sets them, every other worker then pulls those
          (so all start alike, from a pretrained or custom-initialized
          module as it is). Or 'torch' (torch_default_init: PyTorch's
          Linear/Conv defaults drawn on the shards), one of TensorSpec's
          init names (with init_value 0.05 for the random ones), or a
          function (name, param, params) -> (init, init_value); those are
          drawn on the shards (seeded by `seed` + parameter index).
    table_init  (init, init_value) of the sparse tables that layers built
          with ``sparse=True`` (nn.Embedding, nn.EmbeddingBag) become:
          their rows are created on the shards on first use, so the
          module's own values are not uploaded; None (default) is
          ('normal', 1.0), PyTorch's N(0, 1), with a warning under
          init='module' saying so. Each forward pass of such a layer pulls
          the rows of its ids into the layer's weight (peek, creating
          nothing, in eval mode or under no_grad); step() pushes the rows
          of its sparse gradient (counted in stats: rows_pulled,
          rows_pushed, rows_applied, rows_refused_stale). padding_idx
          stays zero and is never sent; max_norm is refused.
    buffers  'local': buffers (BatchNorm running statistics and the like)
          stay each worker's own; 'average': every float32 buffer has a
          shared copy on the shards (created from the module's values),
          and every `buffer_every` steps a worker moves it `buffer_mix`
          of the way towards its own buffer and takes the result, so the
          copies become a running mix of all workers' statistics (what
          state_dict() returns); integer buffers stay local. None
          (default) keeps them local with a warning when the module has
          any.
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
    overlap_push
          send each step's gradients in a background thread while the
          next step runs (at most one push in flight: a step waits for the
          previous push before it starts its own). The push keeps the
          gradient tensors it sends (p.grad becomes None; backward
          allocates the next). stats count a push once it is answered; a
          failed push raises in the next step() (after its closure, before
          its own push: its gradients stay in p.grad, the clock does not
          advance) or in leave(), which waits for the last one: no
          gradient is dropped unseen. Allowed as overlap_pull (plain ASP).

    Shapes are checked against the shards' specs (ValueError naming the
    parameter). A step must take less than the shards' --worker_lease_ms;
    wrap longer pauses (evaluation) in ``with worker.paused():``.
    """

    def __init__(self, module, client, *, optimizer="sgd", lr=0.01,
                 momentum=0.9, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 init="module", seed=0, prefix="", create=True,
                 wait_timeout=120.0, overlap_pull=False, overlap_push=False,
                 slice_elems=0, buffers=None, buffer_every=10, buffer_mix=0.5,
                 lr_schedule=None, table_init=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError("Worker: module must be a torch.nn.Module, got "
                            f"{type(module).__name__}")
        if not isinstance(client, asyncps.Client):
            raise TypeError("Worker: client must be an asyncps.Client, got "
                            f"{type(client).__name__}")
        if lr_schedule is not None and not callable(lr_schedule):
            raise TypeError("Worker: lr_schedule must be a function clock "
                            f"-> rate, got {type(lr_schedule).__name__}")
        if buffers not in (None, "local", "average"):
            raise ValueError("Worker: buffers must be 'local' or 'average' "
                             f"(or None), got {buffers!r}")
        held = [n for n, _ in module.named_buffers()]
        if held and buffers is None:
            warnings.warn(
                f"Worker: the module's {len(held)} buffer(s) ({held[0]}, ...) "
                "stay local to each worker (e.g. BatchNorm running "
                "statistics): a model pulled from the shards has none of "
                "them; pass buffers='local' to say that this is intended, "
                "or buffers='average' to share them through the shards",
                stacklevel=2)
        self.module = module
        self.client = client
        self._prefix = prefix
        self._tables = SparseEmbeddings(module, prefix)
        self._shared = (SharedBuffers(module, prefix, buffer_every,
                                      buffer_mix)
                        if buffers == "average" else None)
        sparse = self._tables.weights()
        params = _trainable_parameters(module, exclude=sparse)
        # (tensor name on the shards, parameter, its shard shape), in
        # named_parameters() order.
        self._params = [(prefix + n, p, _shard_shape(p))
                        for n, p in params.items()]

        optimizer_args = dict(optimizer=optimizer, lr=lr, momentum=momentum,
                              beta1=beta1, beta2=beta2, epsilon=epsilon)
        specs = {}
        values = {}
        for index, (name, p) in enumerate(params.items()):
            if init == "module":
                kind, value = "values", 0.0
                values[prefix + name] = _shard_view(p, _shard_shape(p))
            elif callable(init):
                kind, value = init(name, p, params)
            elif init == "torch":
                kind, value = torch_default_init(name, p, params)
            else:
                kind = init
                value = 0.05 if init in ("uniform", "normal") else 0.0
            specs[prefix + name] = asyncps.TensorSpec(
                _shard_shape(p), init=kind, init_value=value,
                seed=seed + index, slice_elems=slice_elems, **optimizer_args)
        if self._tables and table_init is None and init == "module":
            names = [layer.table for layer in self._tables.layers]
            warnings.warn(
                f"Worker: sparse embedding(s) {', '.join(names)} become "
                "sparse tables whose rows the shards create on first use "
                "from N(0, 1) (PyTorch's default), not from the module's "
                "values; pass table_init=('normal', 1.0) (or another "
                "(init, init_value)) to say that this is intended",
                stacklevel=2)
        table_specs = self._tables.specs(table_init or ("normal", 1.0),
                                         **optimizer_args)
        if create and table_specs:
            client.create_tables(table_specs)
        if self._shared is not None:
            buffer_specs, buffer_values = self._shared.specs()
            specs.update(buffer_specs)
            values.update(buffer_values)
        if not specs:
            stored = {}
        elif create:
            try:
                stored = client.create(specs, values=values or None)
            except asyncps.RpcError as e:
                if e.code != "ALREADY_EXISTS":
                    raise
                # Another spec is held: a parameter of another shape is
                # this module's mistake, named as such; other differences
                # (optimizer, init) stay the shards' ALREADY_EXISTS.
                held = client.wait_for(list(specs), timeout=0)
                self._check_shapes(held)
                raise
        else:
            stored = client.wait_for(list(specs), timeout=wait_timeout)
        self._check_shapes(stored)
        self.specs = stored
        if table_specs:
            self.tables = client.wait_for(list(table_specs),
                                          timeout=0 if create else wait_timeout)
            for name, spec in self.tables.items():
                if spec.dim != table_specs[name].dim:
                    raise ValueError(
                        f"Worker: sparse embedding '{name}' has dim "
                        f"{table_specs[name].dim} but the shards' table has "
                        f"{spec.dim}")
        else:
            self.tables = {}

        status = client.status()
        policies = [s["status"]["policy"] for s in status["shards"]]
        lease_ms = min(int(p.get("worker_lease_ms", 10000)) for p in policies)
        self._lease_s = max(lease_ms / 1000.0, 0.01)
        self.overlap_pull = bool(overlap_pull)
        self.overlap_push = bool(overlap_push)
        self._executor = None
        self._pending = None  # Future of the overlapped pull, if any
        self._overlap = None  # what the overlapped pull writes into
        self._pushing = None  # Future of the overlapped push, if any
        self._param_views = _Views()  # what pulls write into
        # Plain steps under ASP send each dense push with the next step's
        # pull, one message per shard (Client.push_pull_into); sparse rows
        # are still pulled by the forward pass that needs them. Not under
        # SSP/BSP, where the next step's pull may wait for slower workers:
        # step() returns after its own push, as it always did.
        self._fuse = (not self.overlap_pull and not self.overlap_push
                      and bool(self._params)
                      and all(p.get("consistency", "ASP") == "ASP"
                              for p in policies))
        self._pulled_for = None  # the clock the module's values are for
        self._grad_views = _Views()  # what pushes send
        for flag in ("overlap_pull", "overlap_push"):
            if getattr(self, flag) and not all(_plain_asp(p)
                                               for p in policies):
                raise ValueError(
                    f"Worker: {flag} needs every shard to run ASP "
                    "without --max_staleness and --staleness_lr (the "
                    f"shards run {status['summary']['policy']})")
        if self.overlap_pull or self.overlap_push:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="asyncps-overlap")
        if self.overlap_pull:
            self._overlap = {n: np.empty(shape, np.float32)
                             for n, _, shape in self._params}

        self.stats = {"steps": 0, "applied": 0, "refused_stale": 0,
                      "duplicates": 0, "max_staleness": 0,
                      "mean_staleness": 0.0}
        if self._tables:
            self.stats.update(rows_pulled=0, rows_pushed=0, rows_applied=0,
                              rows_refused_stale=0)
            self._tables.attach(client, self.stats)
        self._staleness_sum = 0.0
        self._closed = False
        self._lr_schedule = lr_schedule
        self._lr = float(lr)  # the rate last set (or created)

    def _check_shapes(self, held):
        """ValueError naming a parameter whose shape the shards' spec (in
        `held`, {name: TensorSpec}) does not have."""
        for name, p, shape in self._params:
            spec = held.get(name)
            if spec is not None and tuple(spec.shape) != shape:
                raise ValueError(
                    f"Worker: parameter '{name}' has shape {tuple(p.shape)} "
                    f"but the shards hold {tuple(spec.shape)}")

    # ------------------------------------------------------------ rates

    def set_lr(self, lr, *, step):
        """Sets the learning rate of every parameter and sparse table on
        the shards from schedule step `step` (>= 1, e.g. the epoch number);
        see Client.set_lr. Returns the rate in effect (a later step another
        worker set wins)."""
        self._check_open()
        names = [n for n, _, _ in self._params] + list(self.tables)
        now = self.client.set_lr({n: lr for n in names}, step=step)
        self._lr = float(lr)
        return max(now.values(), key=lambda rate_step: rate_step[1])[0]

    def _follow_schedule(self):
        lr = float(self._lr_schedule(self.client.clock))
        if lr != self._lr:
            self.set_lr(lr, step=self.client.clock + 1)

    # ------------------------------------------------------------ steps

    def pull(self):
        """Pulls every parameter into the module, in place, at client.clock
        (sparse embeddings pull their rows in their forward pass)."""
        if not self._params:
            return
        self.client.pull_into(self._param_views.get(self._params))

    def push(self):
        """Pushes p.grad of every parameter that has one; a PushResult."""
        result = self.client.push(self._gradients())
        self._account(result)
        return result

    def _gradients(self):
        """{name: p.grad as a contiguous float32 array of its shard shape}
        for every parameter that has a gradient."""
        grads = []
        for name, p, shape in self._params:
            g = p.grad
            if g is None:
                continue
            if not g.is_contiguous():
                g = g.contiguous()
            grads.append((name, g, shape))
        return self._grad_views.get(grads)

    def _start_push(self):
        """overlap_push: hands this step's gradients to a background push
        (as of client.clock) and lets backward allocate the next ones."""
        grads = self._gradients()
        for _, p, _ in self._params:
            p.grad = None
        self._pushing = self._executor.submit(self.client.push, grads,
                                              self.client.clock)

    def _finish_push(self):
        """Waits for the overlapped push in flight, if any, and counts it;
        its error is raised here. Interrupted (Ctrl-C), the push stays in
        flight, for leave() to wait for."""
        if self._pushing is None:
            return
        pushing = self._pushing
        try:
            result = pushing.result()
        finally:
            if pushing.done():
                self._pushing = None
        self._account(result)

    def step(self, closure):
        """One training step; returns what `closure` returns.

        Pulls the parameters into the module, zeroes the gradients, calls
        `closure()` (which runs forward and backward), pushes the
        gradients and advances client.clock.

        Under ASP without overlap, the push of the dense parameters goes
        with the next step's pull, one message per shard
        (Client.push_pull_into; the rows of sparse embeddings are pushed
        first, on their own, and pulled by the next forward pass): each
        shard answers the pull once it has applied the push, so the next
        step starts from the values it would have pulled itself, and the
        module holds them when step() returns. A step whose clock is not
        the one pulled for (client.clock was set), or after
        load_state_dict(), pulls first.
        """
        self._check_open()
        if self._lr_schedule is not None:
            self._follow_schedule()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
            with torch.no_grad():
                for name, p, _ in self._params:
                    p.copy_(torch.from_numpy(self._overlap[name]).reshape(
                        p.shape))
        elif self._pulled_for != self.client.clock:
            self.pull()
        self._pulled_for = None
        for _, p, _ in self._params:
            if p.grad is not None:
                p.grad.zero_()
        self._tables.begin_step()
        if self.overlap_pull:
            self._pending = self._executor.submit(
                self.client.pull_into, self._overlap, self.client.clock)
        loss = closure()
        if self._fuse:
            # This step's rows first: every push of the step at its clock
            # before the pull that reports the next one.
            self._tables.push()
            result = self.client.push_pull_into(
                self._gradients(), self._param_views.get(self._params))
            self._account(result)
            self._pulled_for = self.client.clock + 1
        else:
            if self.overlap_push:
                self._finish_push()
                self._start_push()
            else:
                self.push()
            self._tables.push()
        if self._shared is not None and self._shared.due(self.client.clock):
            self._shared.sync(self.client)
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

    # ------------------------------------------------------------ the model

    def state_dict(self):
        """The module's state dict with the shards' values, as copies (the
        module is not changed): parameters pulled; sparse embedding
        weights read whole (peek: rows never trained have their initial
        values, nothing is created); with buffers='average' the shared
        buffers, other buffers this worker's own. What a process that
        saves or evaluates the trained model wants:
        ``torch.save(worker.state_dict(), path)``; to start a new run from
        it, load it into the module before creating the Worker (init
        'module' uploads it)."""
        self._check_open()
        self._finish_push()  # the values include this worker's last step
        out = {k: v.detach().clone()
               for k, v in self.module.state_dict().items()}
        cut = len(self._prefix)
        names = [n for n, _, _ in self._params]
        if self._shared is not None:
            names += self._shared.names()
        if names:
            pulled = self.client.pull(names)
            for name in names:
                key = name[cut:]
                out[key] = torch.from_numpy(pulled[name]).reshape(
                    out[key].shape)
        for layer in self._tables.layers:
            m = layer.module
            rows = np.empty((m.num_embeddings, m.embedding_dim), np.float32)
            for start in range(0, m.num_embeddings, _ROWS_PER_CALL):
                ids = np.arange(start,
                                min(m.num_embeddings, start + _ROWS_PER_CALL))
                rows[start:start + len(ids)] = self.client.pull_rows(
                    {layer.table: ids}, peek=True)[layer.table]
            padding = getattr(m, "padding_idx", None)
            if padding is not None:
                rows[padding] = 0
            out[layer.table[cut:]] = torch.from_numpy(rows)
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Loads `state_dict` into the module and into the live shards, as
        ``module.load_state_dict`` would into a module: every parameter
        (and with buffers='average' every shared buffer) is assigned on the
        shards (Client.assign: exactly once, versions advance by one, the
        shards' optimizer state is kept as a PyTorch optimizer's is), so
        every worker's next pull gets these values; other buffers are this
        worker's own and loaded into the module only. A sparse embedding's
        weight is assigned row by row (Client.assign_rows, every row but
        padding_idx, 65536 rows per call; rows are created on the shards
        where they did not exist).

        Checked whole before anything changes: with `strict`, missing and
        unexpected keys raise RuntimeError listing them (as PyTorch does);
        a value of another shape, or holding NaN or Inf, raises ValueError
        naming its key.
        Returns PyTorch's (missing_keys, unexpected_keys)."""
        self._check_open()
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError("load_state_dict: expected a mapping (a state "
                            f"dict), got {type(state_dict).__name__}")
        own = self.module.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(
                "load_state_dict: error(s) loading the state dict into "
                f"{type(self.module).__name__}: missing keys {missing}, "
                f"unexpected keys {unexpected}; nothing was loaded")
        # Every key the module holds has its shape, so that loading the
        # module below cannot fail after the shards were assigned.
        for key, value in state_dict.items():
            if key in own and tuple(torch.as_tensor(value).shape) != tuple(
                    own[key].shape):
                raise ValueError(
                    f"load_state_dict: '{key}' has shape "
                    f"{tuple(torch.as_tensor(value).shape)} but the "
                    f"module's is {tuple(own[key].shape)}; nothing was "
                    "loaded")
        cut = len(self._prefix)
        shapes = {name: shape for name, _, shape in self._params}
        if self._shared is not None:
            shapes.update((name, tuple(b.shape) if b.dim() > 0 else (1,))
                          for name, b, _ in self._shared.buffers)
        shapes.update((layer.table, tuple(layer.module.weight.shape))
                      for layer in self._tables.layers)
        values = {}
        for name, shape in shapes.items():
            key = name[cut:]
            if key not in state_dict:
                continue
            value = torch.as_tensor(state_dict[key]).detach()
            value = value.to(device="cpu", dtype=torch.float32)
            if not bool(torch.isfinite(value).all()):
                raise ValueError(
                    f"load_state_dict: '{key}' contains NaN or Inf; nothing "
                    "was loaded")
            values[name] = np.ascontiguousarray(
                value.numpy().reshape(shape))
        # The shards' values before anything local: an overlapped push in
        # flight lands first, an overlapped pull (of the values before the
        # load) is dropped so that the next step pulls the loaded ones.
        self._finish_push()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
        self._pulled_for = None  # the next step pulls the loaded values
        rows = {layer.table: layer.module for layer in self._tables.layers
                if layer.table in values}
        for table, m in rows.items():
            weight = values.pop(table)
            ids = np.arange(m.num_embeddings, dtype=np.uint64)
            padding = getattr(m, "padding_idx", None)
            if padding is not None:  # stays zero, never sent
                ids = np.delete(ids, padding)
            for start in range(0, len(ids), _ROWS_PER_CALL):
                chunk = ids[start:start + _ROWS_PER_CALL]
                self.client.assign_rows(
                    {table: (chunk, np.ascontiguousarray(weight[chunk]))})
        if values:
            self.client.assign(values)
        return self.module.load_state_dict(state_dict, strict=strict)

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
        """Finishes: waits for an overlapped pull and the overlapped push
        (whose error it raises, after leaving) and says goodbye to the
        shards (SSP/BSP stop waiting for this worker)."""
        if self._closed:
            return
        self._closed = True
        self._tables.detach()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            with contextlib.suppress(Exception):
                pending.result()
        push_error = None
        try:
            self._finish_push()
        except Exception as e:  # raised once the worker has left
            push_error = e
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if not self.client.closed:
            if self._shared is not None and self.stats["steps"] > 0:
                # The shared buffers get this worker's latest statistics.
                self._shared.sync(self.client)
            self.client.leave()
        if push_error is not None:
            raise push_error

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
