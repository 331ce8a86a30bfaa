"""Stored values (metadata, example inputs and outputs) as JSON, read from
an archive's header alone.

JSON objects have string keys only, so writing ``str(key)`` would merge
``{1: "a", "1": "b"}`` into one entry. The encoding here keeps every entry
and every key's type, and stays plain JSON where the value already is:

- None, bool, int, float and str are themselves (non-finite floats are the
  strings "nan", "inf", "-inf" as in every ``--json`` output);
- lists, tuples and namedtuples are arrays;
- a dict whose keys are all strings is an object, unless its only key is a
  tag of this encoding (``dict``, ``tensor``, ``module``);
- any other dict is ``{"dict": [[KEY, VALUE], ...]}`` in its own order, each
  KEY tagged with its type: ``{"str": "1"}``, ``{"int": 1}``,
  ``{"float": 1.5}``, ``{"bool": true}``, ``{"none": null}``,
  ``{"tuple": [KEY, ...]}``, else ``{"repr": "..."}``;
- a tensor is ``{"tensor": {"dtype": "float32", "shape": [2, 3]}}`` (the
  header has no values), a module ``{"module": "Name"}``;
- anything else (dtypes, devices, NumPy scalars, slices, bytes) is its
  Python ``repr`` as a string.

>>> to_json({1: "a", "1": "b"})
{'dict': [[{'int': 1}, 'a'], [{'str': '1'}, 'b']]}
>>> to_json({"epoch": 3, "sizes": (1, 2)})
{'epoch': 3, 'sizes': [1, 2]}
"""
from mgtrace.errors import ArchiveError

__all__ = ["ENCODING_NOTE", "TAGS", "decode_header_value", "differences", "to_json", "typed"]

TAGS = ("dict", "tensor", "module")     # single-key objects that mean this encoding, not a dict
ENCODING_NOTE = ('a dict with a key that is not a string is written as {"dict": [[KEY, VALUE], '
                 '...]} with each key tagged by type ({"int": 1}, {"str": "1"}, {"tuple": [...]}); '
                 'a tensor as {"tensor": {"dtype": ..., "shape": ...}}')


class Ref:
    """A tensor or module named by a header value (its data is not read)."""
    __slots__ = ("kind", "what")

    def __init__(self, kind, what):
        self.kind, self.what = kind, what

    def __eq__(self, other):
        return isinstance(other, Ref) and (self.kind, repr(self.what)) == (other.kind, repr(other.what))

    def __hash__(self):
        return hash((self.kind, repr(self.what)))

    def __repr__(self):
        return f"<{self.kind} {self.what}>"


class _HeaderRefs:
    """The decode context of values.decode: tensors and modules become Refs."""

    def __init__(self, header):
        self.header = header

    def tensor(self, i):
        t = self._entry("tensors", i)
        return Ref("tensor", {"dtype": t.get("dtype"), "shape": t.get("shape")})

    def module(self, i):
        m = self._entry("modules", i)
        return Ref("module", m.get("name") or m.get("type"))

    def _entry(self, table, i):
        rows = self.header.get(table) or []
        if not 0 <= i < len(rows):
            raise ArchiveError(f"header.{table}[{i}] does not exist ({len(rows)} entries)")
        return rows[i]


def decode_header_value(v, header):
    """Python value of tagged header value ``v``, tensors and modules as :class:`Ref`.

    Raises:
        ArchiveError: ``v`` is malformed or refers past the header's tables.
    """
    from mgtrace.serialization import values
    return values.decode(v, _HeaderRefs(header))


def to_json(v):
    """``v`` (a decoded value) in the encoding of this module's docstring."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Ref):
        return {v.kind: v.what}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if isinstance(v, dict):
        if all(type(k) is str for k in v) and not (len(v) == 1 and next(iter(v)) in TAGS):
            return {k: to_json(x) for k, x in v.items()}
        return {"dict": [[_key(k), to_json(x)] for k, x in v.items()]}
    return repr(v)


def _key(k):
    for t, tag in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if type(k) is t:
            return {tag: k}
    if k is None:
        return {"none": None}
    if type(k) is tuple:
        return {"tuple": [_key(x) for x in k]}
    return {"repr": repr(k)}


def typed(v):
    """``v`` (a decoded value) with every leaf tagged by its type, so that
    values that load as different Python values differ here: ``"nan"`` and
    ``float("nan")``, ``1`` and ``1.0``, ``True`` and ``1``, ``(1,)`` and
    ``[1]``. Leaves are tagged as dict keys are (``{"int": 1}``), a list is
    ``{"list": [...]}``, a tuple ``{"tuple": [...]}``; non-finite floats are
    the strings "nan", "inf", "-inf", so NaN equals NaN of the same type.

    >>> typed({"k": "nan", "n": (1, 1.0)})
    {'k': {'str': 'nan'}, 'n': {'tuple': [{'int': 1}, {'float': 1.0}]}}
    """
    from mgtrace import _json
    if v is None or isinstance(v, (bool, int, float, str)) and type(v) in (bool, int, float, str):
        return _json.plain(_key(v))
    if isinstance(v, Ref):
        return {v.kind: v.what}
    if type(v) in (list, tuple):
        return {type(v).__name__: [typed(x) for x in v]}
    if type(v) is dict:
        if all(type(k) is str for k in v) and not (len(v) == 1 and next(iter(v)) in TAGS):
            return {k: typed(x) for k, x in v.items()}
        return {"dict": [[_json.plain(_key(k)), typed(x)] for k, x in v.items()]}
    return {"repr": repr(v)}


def differences(a, b, path=""):
    """Where decoded values ``a`` and ``b`` differ by :func:`typed`: a list of
    ``(path, typed a there, typed b there)``, empty when they are the same.
    The path names string keys and indices (``"hist[1]"``); "" is the root."""
    ta, tb = typed(a), typed(b)
    if ta == tb:
        return []
    if type(a) is type(b) is dict and all(type(k) is str for k in a) and a.keys() == b.keys():
        parts = ((f"{path}.{k}" if path else k, a[k], b[k]) for k in a)
    elif type(a) is type(b) and type(a) in (list, tuple) and len(a) == len(b):
        parts = ((f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b)))
    else:
        return [(path, ta, tb)]
    return [d for p, x, y in parts for d in differences(x, y, p)]
