"""Upgraders: rewrite what an older version of a function or module type stored.

Each stable name (registry.py) has a version. When a function's signature or
a builtin module's constructor changes, its version goes up by one and an
upgrader is registered for the old version: a function from what version
``v`` stored to what version ``v + 1`` expects. Loading runs the chain
``v -> v + 1 -> ... -> current``.

* Function calls are stored with their arguments **by parameter name**
  (DESIGN.md), so an upgrader receives and returns ``{name: value}``: a
  renamed parameter is a key rename, a parameter inserted mid-signature needs
  nothing (or a default) because nothing is positional, a removed one is
  dropped.
* Module types store their constructor config, ``{name: value}`` too.

Upgraders get a fresh dict (they may change it in place) and must return a
dict. mgtrace's own upgraders are declared in the two tables below; users pass
theirs to ``register_function`` / ``register_module``.
"""
from mgtrace.errors import ArchiveError, VersionError

__all__ = ["FUNCTION_UPGRADERS", "MODULE_UPGRADERS", "run_chain", "check_chain"]

# mgtrace's own, "mgtrace.functional.<name>" / "mgtrace.module.<Name>" ->
# {old version: upgrader}. None yet: every function and builtin is at version 1.
FUNCTION_UPGRADERS = {}
MODULE_UPGRADERS = {}


def check_chain(what, name, stored, current, chain, how):
    """Raise unless ``chain`` leads from version ``stored`` to ``current``.

    Args:
        what: ``"function"`` or ``"module type"`` (for messages).
        how: the registration call to suggest, e.g. ``"register_function"``.

    Raises:
        VersionError: ``stored`` is newer than ``current``, or a step has no
            upgrader; both versions are named.
    """
    if stored > current:
        raise VersionError(f"{what} {name!r} is version {stored} in this archive, but this "
                           f"program has version {current}: the archive was written by a newer "
                           f"release; upgrade mgtrace (or the package that defines {name!r})")
    for v in range(stored, current):
        if v not in chain:
            raise VersionError(f"{what} {name!r} is version {stored} in this archive and "
                               f"version {current} here, but there is no upgrader from version "
                               f"{v}; register one: mgtrace.serialization.{how}(..., "
                               f"version={current}, upgraders={{{v}: upgrade_{v}_to_{v + 1}}})")


def run_chain(what, name, stored, current, chain, payload):
    """``payload`` (a dict by name) rewritten from version ``stored`` to ``current``.

    Raises:
        ArchiveError: an upgrader raised or returned something not a dict.
    """
    for v in range(stored, current):
        try:
            payload = chain[v](dict(payload))
        except Exception as e:   # an upgrader is user code: report, do not crash the load
            raise ArchiveError(f"upgrading {what} {name!r} from version {v} to {v + 1} "
                               f"failed: {type(e).__name__}: {e}") from e
        if type(payload) is not dict:
            raise ArchiveError(f"the upgrader of {what} {name!r} from version {v} returned a "
                               f"{type(payload).__name__}, not a dict")
    return payload
