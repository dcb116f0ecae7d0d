"""Sparse embedding layers of a module routed to asyncps sparse tables.

An ``nn.Embedding`` or ``nn.EmbeddingBag`` created with ``sparse=True``
becomes a sparse table on the shards (named like its weight parameter)
instead of a dense tensor: a forward pre-hook pulls the rows of the ids the
batch uses into the layer's own weight (in place), and after the backward
pass the rows of its sparse gradient are pushed as row gradients. The
layer's weight is then a local buffer of the rows this step read; rows no
batch uses are never sent.

Used by asyncps.torch.Worker; not a public interface.
"""

import numpy as np
import torch
import torch.nn as nn

import asyncps


class _Layer:
    """One sparse embedding layer and the ids it read this step."""

    def __init__(self, table, module):
        self.table = table
        self.module = module
        self.step_ids = None  # LongTensor of the ids pulled this step
        self.hook = None


class SparseEmbeddings:
    """The sparse embedding layers of `module`, each a table named
    prefix + its weight's parameter name."""

    def __init__(self, module, prefix):
        self.layers = []
        for name, m in module.named_modules():
            if not isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
                continue
            if not m.sparse or not m.weight.requires_grad:
                continue
            table = prefix + (f"{name}.weight" if name else "weight")
            if m.max_norm is not None:
                raise ValueError(
                    f"Worker: sparse embedding '{table}' has max_norm, which "
                    "renormalizes rows in place during forward; asyncps "
                    "cannot route that to the shards")
            self.layers.append(_Layer(table, m))
        self.client = None
        self.stats = None

    def __bool__(self):
        return bool(self.layers)

    def weights(self):
        """The ids of the layers' weight parameters (not dense tensors)."""
        return {id(layer.module.weight) for layer in self.layers}

    def specs(self, table_init, **optimizer):
        """{table: TableSpec} with the optimizer arguments of the Worker."""
        kind, value = table_init
        return {layer.table: asyncps.TableSpec(
                    layer.module.embedding_dim, init=kind, init_value=value,
                    seed=index, **optimizer)
                for index, layer in enumerate(self.layers)}

    def attach(self, client, stats):
        """Starts routing: the layers' forward passes pull their rows
        through `client`; row counts go to `stats`."""
        self.client = client
        self.stats = stats
        for layer in self.layers:
            layer.hook = layer.module.register_forward_pre_hook(
                lambda module, inputs, layer=layer: self._pull(layer, inputs))

    def detach(self):
        for layer in self.layers:
            if layer.hook is not None:
                layer.hook.remove()
                layer.hook = None

    def begin_step(self):
        """Forgets the ids of the last step and its gradients."""
        for layer in self.layers:
            layer.step_ids = None
            layer.module.weight.grad = None

    def _pull(self, layer, inputs):
        ids = inputs[0].detach().reshape(-1)
        if ids.numel() == 0:
            return
        ids = torch.unique(ids)
        padding = getattr(layer.module, "padding_idx", None)
        if padding is not None:
            ids = ids[ids != padding]
        training = layer.module.training and torch.is_grad_enabled()
        if training:
            # The last pull of a table is what its push is computed from,
            # so a layer called again in a step pulls every id it read.
            if layer.step_ids is not None:
                ids = torch.unique(torch.cat([layer.step_ids, ids]))
            layer.step_ids = ids
        if ids.numel() == 0:
            return
        rows = self.client.pull_rows({layer.table: ids.numpy()},
                                     peek=not training)[layer.table]
        weight = layer.module.weight
        with torch.no_grad():
            weight.index_copy_(0, ids, torch.from_numpy(rows))
            if padding is not None:
                weight[padding].zero_()
        if training:
            self.stats["rows_pulled"] += int(ids.numel())

    def push(self):
        """Pushes the rows of every layer's sparse gradient; the
        PushResult, or None when no layer has one."""
        grads = {}
        for layer in self.layers:
            g = layer.module.weight.grad
            if g is None or layer.step_ids is None:
                continue
            if not g.is_sparse:
                raise ValueError(
                    f"Worker: the gradient of sparse embedding "
                    f"'{layer.table}' is dense (was it used through "
                    "F.embedding without sparse=True?)")
            g = g.coalesce()
            ids, values = g.indices()[0], g.values()
            padding = getattr(layer.module, "padding_idx", None)
            if padding is not None:
                keep = ids != padding
                ids, values = ids[keep], values[keep]
            if ids.numel() == 0:
                continue
            grads[layer.table] = (ids.numpy().astype(np.uint64),
                                  values.contiguous().numpy())
        if not grads:
            return None
        result = self.client.push_rows(grads)
        self.stats["rows_pushed"] += sum(len(i) for i, _ in grads.values())
        self.stats["rows_applied"] += result.applied
        self.stats["rows_refused_stale"] += result.refused_stale
        return result
