"""Buffers of a module averaged through the shards (buffers='average').

Each float32 buffer (BatchNorm's running mean and variance, for instance)
gets a shared copy on the shards, created from the module's values and
updated by plain SGD with learning rate 1: every `every` steps (and when
it leaves) a worker pulls the shared copy s, pushes ``mix * (s - b)`` for its own buffer b
(moving s that far towards b) and takes ``s - mix * (s - b)`` as its
buffer. The shared copies become a running mix of every worker's
statistics, and a process that reads the model from the shards
(Worker.state_dict()) gets them. Integer buffers (BatchNorm's
num_batches_tracked) stay local.

Used by asyncps.torch.Worker; not a public interface.
"""

import numpy as np
import torch

import asyncps


class SharedBuffers:
    """The float32 buffers of `module`, each a tensor named prefix + its
    name on the shards."""

    def __init__(self, module, prefix, every, mix):
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(
                f"Worker: buffer_every must be an integer >= 1, got {every!r}")
        if not 0 < mix <= 1:
            raise ValueError(f"Worker: buffer_mix must be in (0, 1], got {mix}")
        self.every = every
        self.mix = float(mix)
        # (name on the shards, buffer, state-dict key), float32 ones only.
        self.buffers = []
        for name, b in module.named_buffers():
            if b.dtype != torch.float32:
                continue
            if b.device.type != "cpu" or not b.is_contiguous():
                raise ValueError(f"Worker: buffer '{name}' must be a "
                                 "contiguous CPU tensor")
            self.buffers.append((prefix + name, b, name))

    def specs(self):
        """({name: TensorSpec}, {name: initial values}) to create."""
        specs, values = {}, {}
        for name, b, _ in self.buffers:
            shape = tuple(b.shape) if b.dim() > 0 else (1,)
            specs[name] = asyncps.TensorSpec(shape, init="values",
                                             optimizer="sgd", lr=1.0)
            values[name] = b.detach().reshape(shape).numpy()
        return specs, values

    def names(self):
        return [name for name, _, _ in self.buffers]

    def due(self, clock):
        """True when the step that completes clock `clock` syncs."""
        return bool(self.buffers) and (clock + 1) % self.every == 0

    def sync(self, client):
        """Mixes this worker's buffers into the shared copies and takes the
        result."""
        shared = client.pull(self.names())
        grads = {}
        for name, b, _ in self.buffers:
            local = b.detach().reshape(shared[name].shape).numpy()
            grads[name] = (self.mix * (shared[name] - local)).astype(
                np.float32)
        client.push(grads)
        with torch.no_grad():
            for name, b, _ in self.buffers:
                b.copy_(torch.from_numpy(shared[name] - grads[name]).reshape(
                    b.shape))
