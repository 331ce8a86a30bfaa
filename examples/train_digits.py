"""Train a small CNN on scikit-learn's 8x8 digits, as a traced module.

    python examples/train_digits.py train --out digits.tmod [--epochs 12]
    python examples/train_digits.py eval digits.tmod
    python examples/train_digits.py resume digits.tmod --out digits2.tmod [--epochs 2]

The data is real and ships with scikit-learn (``load_digits``: 1,797
handwritten digits, no download); a seeded fifth is held out. The network
(two convolutions, max pooling, a linear classifier, seeded random
weights) is traced first, and the TracedModule is what trains: a
GradManager records its forward, SGD with momentum and a cosine schedule updates its parameters.
``train`` saves the trained TracedModule; ``eval`` loads it in a fresh
process and measures the held-out accuracy again; ``resume`` loads it and
trains on, printing the training loss it starts from and each epoch's.
"""
import argparse
import time

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.autodiff import GradManager
from mgtrace.optimizer import SGD, CosineAnnealingLR


class DigitsNet(M.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = M.Conv2d(1, 16, 3, padding=1)
        self.conv2 = M.Conv2d(16, 32, 3, padding=1)
        self.pool = M.MaxPool2d(2)
        self.fc = M.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))          # [N, 16, 4, 4]
        x = self.pool(F.relu(self.conv2(x)))          # [N, 32, 2, 2]
        return self.fc(F.flatten(x, 1))


def data():
    """(train_x, train_y, test_x, test_y): images [N, 1, 8, 8] float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(y))
    test = order[:len(y) // 5]
    train = order[len(y) // 5:]
    return x[train], y[train], x[test], y[test]


def accuracy(model, x, y):
    logits = model(mt.tensor(x)).numpy()
    return float((logits.argmax(1) == y).mean())


def mean_loss(model, x, y):
    return F.cross_entropy(model(mt.tensor(x)), mt.tensor(y)).item()


def train(model, x, y, epochs, lr, seed):
    params = list(model.parameters())
    gm = GradManager().attach(params)
    opt = SGD(params, lr=lr, momentum=0.9)
    schedule = CosineAnnealingLR(opt, T_max=epochs)
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        order = rng.permutation(len(y))
        total = 0.0
        for i in range(0, len(y), 32):
            b = order[i:i + 32]
            with gm:
                loss = F.cross_entropy(model(mt.tensor(x[b])), mt.tensor(y[b]))
                gm.backward(loss)
            opt.step().clear_grad()
            total += loss.item() * len(b)
        schedule.step()
        print(f"epoch {epoch + 1}: train loss {total / len(y):.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["train", "eval", "resume"])
    p.add_argument("archive", nargs="?", help="the .tmod to eval or resume from")
    p.add_argument("--out", default="digits.tmod")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    xtr, ytr, xte, yte = data()
    t0 = time.perf_counter()
    if args.command == "train":
        mt.random.seed(0)
        net = DigitsNet()
        model = mt.trace_module(net, mt.tensor(xtr[:4]))
        train(model, xtr, ytr, args.epochs, args.lr, seed=1)
        mt.save(model, args.out, metadata={"example": "train_digits"})
        print(f"saved {args.out}")
    else:
        model = mt.load(args.archive)
        print(f"loaded {args.archive}: held-out accuracy {accuracy(model, xte, yte):.4f}")
        if args.command == "eval":
            return
        print(f"train loss before resuming {mean_loss(model, xtr, ytr):.4f}")
        train(model, xtr, ytr, args.epochs, args.lr * 0.2, seed=2)
        print(f"train loss after resuming {mean_loss(model, xtr, ytr):.4f}")
        mt.save(model, args.out)
        print(f"saved {args.out}")
    print(f"held-out accuracy {accuracy(model, xte, yte):.4f} "
          f"({len(yte)} digits; {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
