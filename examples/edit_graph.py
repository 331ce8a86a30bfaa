"""Edit a traced graph: fuse conv+bn, swap an activation, cut at a node; save.

    python examples/edit_graph.py resnet18.tmod --out edited.tmod

Works on the archive written by trace_and_save.py. Every edit is checked
against the unedited module's numbers and followed by graph.lint().
"""
import argparse

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import CallMethod


def module_calls(graph, cls):
    """Calls of modules of type ``cls``, in this graph and every nested one."""
    return [e for e in graph.get_method_by_type("__call__") if isinstance(e.args[0].owner, cls)]


def fuse_conv_bn(tm):
    """Replace each conv -> batchnorm pair by one conv with folded weights."""
    count = 0
    for bn_call in module_calls(tm.graph, M.BatchNorm2d):
        conv_out = bn_call.args[1]
        conv_call = conv_out.expr
        if not (isinstance(conv_call, CallMethod) and isinstance(conv_call.args[0].owner, M.Conv2d)
                and conv_out.users == [bn_call]):
            continue
        conv, bn, g = conv_call.args[0].owner, bn_call.args[0].owner, bn_call.top_graph
        k = bn.weight.numpy() / np.sqrt(bn.running_var.numpy() + bn.eps)
        fused = M.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                         conv.padding, conv.dilation, conv.groups, bias=True)
        fused.weight = M.Parameter(conv.weight.numpy() * k[:, None, None, None])
        bias = 0 if conv.bias is None else conv.bias.numpy()
        fused.bias = M.Parameter((bias - bn.running_mean.numpy()) * k + bn.bias.numpy())
        name = conv_call.args[0].expr.name.replace(".", "_") + "_fused"
        setattr(g.owner, name, fused)                  # a new submodule of the block
        with g.insert_exprs(bn_call):
            y = getattr(g.owner, name)(conv_call.args[1])
        g.replace_node({bn_call.outputs[0]: y})
        g.compile()                                    # drops the old conv and bn calls
        g.lint()
        count += 1
    return count


def swap_relu(tm):
    """Every ReLU module call becomes F.relu6."""
    count = 0
    for call in module_calls(tm.graph, M.ReLU):
        g = call.top_graph
        with g.insert_exprs(call):
            y = F.relu6(call.args[1])
        g.replace_node({call.outputs[0]: y})
        g.compile()
        g.lint()
        count += 1
    return count


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archive", nargs="?", default="resnet18.tmod")
    p.add_argument("--out", default="edited.tmod")
    args = p.parse_args()
    arc = mt.serialization.load_archive(args.archive)
    (x,) = arc.example_inputs
    tm = arc.obj
    want = tm(x).numpy()

    n = fuse_conv_bn(tm)
    dropped = tm.delete_unused_submodules()            # the old convs and batchnorms
    print(f"fused {n} conv+bn pairs (dropped {len(dropped)} modules); "
          f"max |change| = {np.abs(tm(x).numpy() - want).max():.2e}")
    mt.save(tm, args.out, example_inputs=(x,))

    relu6 = mt.load(args.out)
    print(f"swapped {swap_relu(relu6)} ReLU calls for F.relu6; "
          f"max |change| = {np.abs(relu6(x).numpy() - want).max():.2e}")
    relu6.delete_unused_submodules()
    mt.save(relu6, args.out.replace(".tmod", "_relu6.tmod"), example_inputs=(x,))

    cut = mt.load(args.out)
    node = cut.graph.get_node_by_name("*layer2.[out]", recursive=False).as_unique()
    cut.graph.reset_outputs(node)                      # the model now ends after layer2
    cut.graph.compile()
    cut.graph.lint()
    cut.delete_unused_submodules()                     # layer3, layer4, fc: their weights go too
    print(f"cut after {node.qualname}: output {cut(x).shape}")
    mt.save(cut, args.out.replace(".tmod", "_cut.tmod"), example_inputs=(x,))
    print(f"saved {args.out} and its _relu6 and _cut variants")


if __name__ == "__main__":
    main()
