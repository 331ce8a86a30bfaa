"""Load an archive and run it, in a process that has no model source code.

    python examples/load_and_run.py resnet18.tmod

Only mgtrace is imported: the archive holds the graphs, the builtin modules'
configs and the weights; loading runs no code the file names. The stored
example input is re-run and compared with the stored output.
"""
import sys

import numpy as np

import mgtrace as mt


def main(path):
    arc = mt.serialization.load_archive(path)          # or mt.load(path) for the module alone
    tm = arc.obj
    print(f"{path}: {type(tm).__name__} '{tm._get_name()}', format {arc.format_version}, "
          f"metadata {arc.metadata}")
    (x,) = arc.example_inputs
    y = tm(x)
    err = np.abs(y.numpy() - arc.example_outputs.numpy()).max()
    print(f"output {y.shape} {y.dtype}; max |run - stored| = {err}")
    top5 = np.argsort(-y.numpy()[0])[:5]
    print("top-5 classes:", top5.tolist())
    x2 = mt.tensor(np.concatenate([x.numpy()] * 2))    # shapes stay symbolic: batch 2 works
    print("batch of 2 ->", tm(x2).shape)
    return 0 if err == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "resnet18.tmod"))
