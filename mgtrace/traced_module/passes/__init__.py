"""Graph passes: optimize a TracedModule for inference, and rewrite patterns.

- :func:`optimize` runs named passes on a copy of a TracedModule
  (``megengine.traced_module.optimize``'s names and meanings, plus
  mgtrace's own) and reports what each did; :func:`register_pass` adds
  yours by name, with what it requires and runs after (``manager.py``: the
  registry, the declarations of mgtrace's own passes, the topological
  order they run in, :class:`PassResult` and :class:`OptimizeReport`).
- :func:`replace_pattern` replaces every match of a small pattern function
  by a replacement function, across the graph hierarchy (``pattern.py``).

The passes themselves: ``fold.py`` (FoldConstant, EliminateIdentity,
FuseAddMul, EliminateDeadCode), ``fuse.py`` (FuseConvBn,
BackwardFoldScale, FuseConvAct, FuseLinearAct, FuseLinearAddNorm, FuseAttention),
``sibling.py`` (FuseSiblingLinear), ``layout.py`` (NCHWc,
FusePointwiseDepthwise), ``int8.py`` (FuseQuantStub,
on quantized graphs); ``match.py`` the matchers
they share (a module or function call, an activation, a conv or linear
layer, a residual add); ``util.py`` the rest of what they share (walking a
module's graphs, constants, :class:`~.util.StateUses`).
"""
from mgtrace.traced_module.passes.manager import (DEFAULT_PASSES, OptimizeReport, PassInfo,
                                                  PassRecord, PassResult, get_pass, optimize,
                                                  register_pass, registered_passes)
from mgtrace.traced_module.passes.pattern import Match, replace_pattern

__all__ = ["optimize", "register_pass", "get_pass", "registered_passes", "DEFAULT_PASSES",
           "PassInfo", "PassResult", "PassRecord", "OptimizeReport", "replace_pattern", "Match"]
