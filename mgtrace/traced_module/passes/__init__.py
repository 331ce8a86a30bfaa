"""Graph passes: optimize a TracedModule for inference, and rewrite patterns.

- :func:`optimize` runs named passes on a copy of a TracedModule
  (``megengine.traced_module.optimize``'s names and meanings, plus
  mgtrace's own); :func:`register_pass` adds yours by name
  (``manager.py`` has the list and the order they run in).
- :func:`replace_pattern` replaces every match of a small pattern function
  by a replacement function, across the graph hierarchy (``pattern.py``).

The passes themselves: ``fuse.py`` (FuseConvBn, BackwardFoldScale,
FuseConvAct, FuseLinearAct), ``fold.py`` (FuseAddMul, FoldConstant,
EliminateIdentity, EliminateDeadCode); ``util.py`` what they share.
"""
from mgtrace.traced_module.passes.manager import (DEFAULT_PASSES, PassInfo, get_pass, optimize,
                                                  register_pass, registered_passes)
from mgtrace.traced_module.passes.pattern import Match, replace_pattern

__all__ = ["optimize", "register_pass", "get_pass", "registered_passes", "DEFAULT_PASSES",
           "PassInfo", "replace_pattern", "Match"]
