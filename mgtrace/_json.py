"""JSON that strict parsers accept, for every ``--json`` output and report.

Python's ``json`` writes ``Infinity`` and ``NaN`` for non-finite floats,
which RFC 8259 JSON does not have (``JSON.parse``, ``jq``, Go and Rust
reject them). Here they are written as the strings ``"inf"``, ``"-inf"``
and ``"nan"`` instead (``float(s)`` reads them back), and anything else
that is not JSON is refused by ``allow_nan=False`` rather than written.
"""
import json
import math

__all__ = ["NONFINITE_NOTE", "plain", "dump", "dumps"]

NONFINITE_NOTE = 'inf and nan are written as the strings "inf", "-inf", "nan"'


def _float(v):
    if math.isfinite(v):
        return v
    return "nan" if v != v else ("inf" if v > 0 else "-inf")


def plain(v):
    """``v`` with every non-finite float (also inside dicts, lists and
    tuples, and as dict keys) replaced by its string."""
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, dict):
        return {(_float(k) if isinstance(k, float) else k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def dump(obj, f, **kw):
    """``json.dump`` of :func:`plain` ``(obj)`` with ``allow_nan=False``."""
    json.dump(plain(obj), f, allow_nan=False, **kw)


def dumps(obj, **kw):
    """``json.dumps`` of :func:`plain` ``(obj)`` with ``allow_nan=False``."""
    return json.dumps(plain(obj), allow_nan=False, **kw)
