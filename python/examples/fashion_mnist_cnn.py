#!/usr/bin/python3
"""Asynchronous PyTorch training of a small CNN on Fashion-MNIST via asyncps.

Each worker process trains the same CNN (two conv layers, two linear
layers) on its own share of the 60k training images; the parameters and
the optimizer (Adam by default) live on the ps_server shards.
Worker 0 waits for the others to finish, evaluates the final parameters on
the 10k test images and prints ``final test accuracy: 0.XXXX``.

    ps_server --shard_index=0 --num_shards=2 --port=7000 &
    ps_server --shard_index=1 --num_shards=2 --port=7001 &
    for w in 0 1; do
      python3 fashion_mnist_cnn.py --servers=127.0.0.1:7000,127.0.0.1:7001 \\
          --worker_id=$w --num_workers=2 &
    done

``--local`` trains the same model in this process with torch.optim and no
asyncps (the single-process baseline). deploy/local_pytorch.sh runs a whole
cluster. Reads Debian's dataset-fashion-mnist; downloads nothing.
"""

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import asyncps
import asyncps.idx
import asyncps.torch


class Cnn(nn.Module):
    """conv 3x3 (16) - pool - conv 3x3 (32) - pool - linear 128 - linear 10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Mlp(nn.Module):
    """linear 784-128 - relu - linear 128-10 (about 100k parameters: a model
    whose step is dominated by the pull and the push)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODELS = {"cnn": Cnn, "mlp": Mlp}


def as_input(images):
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28) in [0, 1]."""
    return torch.from_numpy(images).unsqueeze(1).float().div_(255.0)


def evaluate(model, images, labels, batch=1000):
    """(accuracy, mean loss) on the given examples."""
    correct, loss = 0, 0.0
    model.eval()
    with torch.no_grad():
        for at in range(0, len(images), batch):
            out = model(as_input(images[at:at + batch]))
            y = torch.from_numpy(labels[at:at + batch])
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    model.train()
    return correct / len(images), loss / len(images)


def share(n, num_workers, worker_id, seed):
    """This worker's examples: a fixed shuffle cut into equal parts."""
    order = np.random.default_rng(seed).permutation(n)
    begin = n * worker_id // num_workers
    end = n * (worker_id + 1) // num_workers
    return order[begin:end]


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--servers", default="",
                   help="shard addresses h:p,h:p in shard order")
    p.add_argument("--local", action="store_true",
                   help="train in this process with torch.optim (baseline)")
    p.add_argument("--worker_id", type=int, default=0)
    p.add_argument("--num_workers", type=int, default=1)
    p.add_argument("--model", choices=sorted(MODELS), default="cnn",
                   help="cnn: two conv + two linear layers; mlp: 784-128-10")
    p.add_argument("--epochs", type=int, default=10,
                   help="passes of each worker over its share")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--optimizer", default="adam",
                   choices=["sgd", "momentum", "adam"])
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train_examples", type=int, default=0,
                   help="use the first N training images (0 = all 60000)")
    p.add_argument("--test_examples", type=int, default=0,
                   help="evaluate on the first N test images (0 = all 10000)")
    p.add_argument("--data_dir", default=asyncps.idx.DEFAULT_FASHION_MNIST_DIR)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads of this process")
    p.add_argument("--overlap_pull", action="store_true",
                   help="pull the next parameters during the current step "
                        "(ASP shards only)")
    p.add_argument("--wire_dtype", choices=("fp32", "bf16"), default="fp32",
                   help="what pulls and pushes carry on the wire (bf16: half "
                        "the bytes, values rounded)")
    p.add_argument("--overlap_push", action="store_true",
                   help="push a step's gradients during the next step "
                        "(ASP shards only)")
    p.add_argument("--log_every", type=int, default=200,
                   help="steps between progress lines (0 = none)")
    p.add_argument("--wait_timeout", type=float, default=900.0,
                   help="seconds worker 0 waits for the others to finish")
    p.add_argument("--tls_ca", default="")
    p.add_argument("--tls_cert", default="")
    p.add_argument("--tls_key", default="")
    p.add_argument("--token_file", default="")
    args = p.parse_args(argv)
    if not args.local and not args.servers:
        p.error("--servers is required (or --local)")
    if args.num_workers < 1 or not 0 <= args.worker_id < args.num_workers:
        p.error(f"--worker_id must be in [0, --num_workers), got "
                f"{args.worker_id} of {args.num_workers}")
    for name in ("epochs", "batch_size", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.lr <= 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    return args


def load(args):
    (train_x, train_y), (test_x, test_y) = asyncps.idx.load_fashion_mnist(
        args.data_dir)
    if args.train_examples:
        train_x, train_y = train_x[:args.train_examples], train_y[:args.train_examples]
    if args.test_examples:
        test_x, test_y = test_x[:args.test_examples], test_y[:args.test_examples]
    return train_x, train_y, test_x, test_y


def batches(indices, batch_size, rng):
    order = rng.permutation(indices)
    for at in range(0, len(order), batch_size):
        yield order[at:at + batch_size]


def train_local(args, out=sys.stdout):
    """Single-process baseline: same model, data and batches, torch.optim."""
    train_x, train_y, test_x, test_y = load(args)
    torch.manual_seed(args.seed)
    model = MODELS[args.model]()
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(
            model.parameters(), lr=args.lr,
            momentum=args.momentum if args.optimizer == "momentum" else 0.0)
    rng = np.random.default_rng(args.seed)
    mine = np.arange(len(train_x))
    train_s, examples = 0.0, 0
    for epoch in range(args.epochs):
        start = time.time()
        for idx in batches(mine, args.batch_size, rng):
            opt.zero_grad()
            F.cross_entropy(model(as_input(train_x[idx])),
                            torch.from_numpy(train_y[idx])).backward()
            opt.step()
            examples += len(idx)
        train_s += time.time() - start
        acc, loss = evaluate(model, test_x, test_y)
        print(f"local epoch {epoch + 1} test accuracy {acc:.4f} loss {loss:.4f}",
              file=out, flush=True)
    # Training time only (the workers' figure has no evaluation either).
    print(f"local done: {examples} examples in {train_s:.1f} s "
          f"({examples / train_s:.0f} examples/s)", file=out, flush=True)
    print(f"final test accuracy: {acc:.4f}", file=out, flush=True)
    return acc


def wait_for_others(client, args):
    """Until every other worker has said goodbye (or the timeout)."""
    deadline = time.time() + args.wait_timeout
    others = set(range(args.num_workers)) - {args.worker_id}
    while True:
        left = {w["worker_id"] for w in client.status()["workers"]
                if w["state"] == "left"}
        if others <= left:
            return
        if time.time() > deadline:
            raise TimeoutError(
                f"workers {sorted(others - left)} did not finish within "
                f"{args.wait_timeout} s")
        time.sleep(0.2)


def train_worker(args, out=sys.stdout):
    """One asynchronous worker; worker 0 returns the final test accuracy."""
    train_x, train_y, test_x, test_y = load(args)
    torch.manual_seed(args.seed)
    model = MODELS[args.model]()
    mine = share(len(train_x), args.num_workers, args.worker_id, args.seed)
    rng = np.random.default_rng(args.seed * 1000 + args.worker_id)
    with asyncps.Client(args.servers.split(","), worker_id=args.worker_id,
                        tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                        tls_key=args.tls_key,
                        token_file=args.token_file,
                        wire_dtype=args.wire_dtype) as client:
        worker = asyncps.torch.Worker(
            model, client, optimizer=args.optimizer, lr=args.lr,
            momentum=args.momentum, seed=args.seed,
            overlap_pull=args.overlap_pull, overlap_push=args.overlap_push)
        w = args.worker_id
        start, examples, window_loss, window = time.time(), 0, 0.0, 0
        with worker:
            for epoch in range(args.epochs):
                for idx in batches(mine, args.batch_size, rng):
                    x = as_input(train_x[idx])
                    y = torch.from_numpy(train_y[idx])

                    def closure():
                        loss = F.cross_entropy(model(x), y)
                        loss.backward()
                        return loss

                    window_loss += worker.step(closure).item()
                    window += 1
                    examples += len(idx)
                    steps = worker.stats["steps"]
                    if args.log_every and steps % args.log_every == 0:
                        print(f"worker {w} epoch {epoch + 1} step {steps} loss "
                              f"{window_loss / window:.4f} examples/s "
                              f"{examples / (time.time() - start):.0f} "
                              f"staleness mean "
                              f"{worker.stats['mean_staleness']:.2f}",
                              file=out, flush=True)
                        window_loss, window = 0.0, 0
            wall = time.time() - start
        s = worker.stats
        print(f"worker {w} done: {s['steps']} steps, {examples} examples in "
              f"{wall:.1f} s ({examples / wall:.0f} examples/s), refused "
              f"slices {s['refused_stale']}, staleness mean "
              f"{s['mean_staleness']:.2f} max {s['max_staleness']}",
              file=out, flush=True)
        if w != 0:
            return None
        wait_for_others(client, args)
        worker.pull()  # the final parameters
        acc, loss = evaluate(model, test_x, test_y)
        print(f"final test loss: {loss:.4f}", file=out, flush=True)
        print(f"final test accuracy: {acc:.4f}", file=out, flush=True)
        return acc


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    if args.local:
        train_local(args)
    else:
        asyncps.tune_malloc_for_large_messages()
        train_worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
