"""Trace a model and save it as a .tmod archive.

    python examples/trace_and_save.py --out resnet18.tmod [--size 224]

Traces ResNet-18 (mgtrace.models) on one example image, prints the top graph
and the generated code of the first block, and saves the TracedModule with
the example input (so `mgtrace verify` can re-run it later) and metadata.
"""
import argparse

import numpy as np

import mgtrace as mt
from mgtrace.models import resnet18


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="resnet18.tmod")
    p.add_argument("--size", type=int, default=224, help="image height and width")
    args = p.parse_args()

    net = resnet18().eval()                            # any mgtrace.module.Module works
    x = mt.tensor(np.random.default_rng(0).random((1, 3, args.size, args.size), np.float32))
    tm = mt.trace_module(net, x)                       # real values, in net's mode

    print(tm.graph)                                    # the top graph: one call per block
    print(getattr(tm.layer1, "0").code)                # generated Python of a BasicBlock
    mt.save(tm, args.out, example_inputs=(x,), metadata={"model": "resnet18", "size": args.size})
    print(f"saved {args.out}; max |traced - eager| = {np.abs(tm(x).numpy() - net(x).numpy()).max()}")


if __name__ == "__main__":
    main()
