"""Run an archive and export its outputs and chosen intermediate values to NumPy.

    python examples/export_numpy.py resnet18.tmod --out outputs.npz

Watch points record the values of graph nodes while the module runs
(here: the output of every top-level block); everything is written to one
.npz file that NumPy reads without mgtrace.
"""
import argparse

import numpy as np

import mgtrace as mt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archive", nargs="?", default="resnet18.tmod")
    p.add_argument("--out", default="outputs.npz")
    args = p.parse_args()
    arc = mt.serialization.load_archive(args.archive)
    tm, (x,) = arc.obj, arc.example_inputs

    blocks = tm.graph.get_node_by_name("*layer?.[out]", recursive=False).as_list()
    tm.set_watch_points(blocks)
    y = tm(x)
    arrays = {"input": x.numpy(), "output": y.numpy()}
    for node, values in tm.watch_node_value.items():
        arrays[node.qualname] = values[-1].numpy()     # np.asarray(t) or t.numpy(): zero-copy
    np.savez(args.out, **arrays)
    for k, v in arrays.items():
        print(f"{k:28} {v.dtype} {v.shape}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
