"""Every bound the archive reader enforces, in one place.

Each keeps a corrupted or hostile file from costing more than its own size
or from exhausting the interpreter's stack; crossing one raises
:class:`mgtrace.ArchiveError` naming the bound. The writer refuses values
that would cross them with ValueError and the same message, through the
same function (below), before it writes anything: whatever ``save``
writes, ``load`` reads.
"""
from mgtrace.traced_module.node import python_name

MAX_VALUE_DEPTH = 100        # tagged values inside tagged values (tuples in dicts in lists ...)
MAX_MODULE_DEPTH = 64        # modules inside modules (ResNets nest 3 deep, transformers 5)
MAX_NDIM = 16                # the core's limit on tensor dimensions (MT_MAX_NDIM)
MAX_DEVICE_STR = 64          # characters of a {"device": ...} string
MAX_INT_DIGITS = 4300        # digits of a big {"int": ...}: Python's own str->int limit
MAX_SAME_HASH = 16           # keys of one stored dict that share a hash (colliding keys make
                             # building the dict quadratic; honest dicts have one or two)
MAX_NAME_CHARS = 1024        # characters of a name: node, graph, module, child, member, keyword
MAX_TABLE_ENTRIES = 1 << 20  # entries of the op, module and tensor tables
MAX_CALL_ARGS = 1024         # positional or keyword arguments of one stored call (Python's
                             # check for repeated keywords is quadratic in their number)
MAX_NAMEDTUPLE_TYPES = 256   # distinct namedtuple classes one archive makes (each is an exec)
MAX_NAMEDTUPLE_FIELDS = 1024 # fields of one namedtuple
MAX_GRAPH_EXPRS = 1 << 16    # exprs (and nodes) of one graph; a flattened ResNet-50 has ~500
BUILD_SLACK_ELEMENTS = 1 << 22   # tensor elements builtin constructors may allocate beyond
                                 # twice the elements the archive stores (see builtin_modules)


# ---------------------------------------------------------------- the rules
# One function per rule, called by the reader (error=ArchiveError, ``where``
# a header path) and by the writer before it writes anything (error=ValueError,
# ``where`` what is being saved), so that what save writes, load reads, and
# both say the same thing. Each reads its bound from this module when called.

def _short(v):
    s = repr(v) if not isinstance(v, str) or len(v) < 200 else repr(v[:60])
    return s if len(s) <= 60 else s[:57] + "..."


def check_value_depth(depth, where, error):
    """Tagged values nest at most MAX_VALUE_DEPTH deep."""
    if depth > MAX_VALUE_DEPTH:
        raise error(f"{where}: values nest deeper than {MAX_VALUE_DEPTH} levels")


def check_module_depth(depth, where, error):
    """Modules nest at most MAX_MODULE_DEPTH deep (``depth``: modules above)."""
    if depth >= MAX_MODULE_DEPTH:
        raise error(f"{where}: modules nest deeper than {MAX_MODULE_DEPTH} levels")


def count_hash(hashes, key, where, error):
    """Count ``key`` (hashable) in ``hashes`` (a Counter) for one stored dict:
    at most MAX_SAME_HASH keys may share a hash (more make building the dict
    quadratic: a hostile archive)."""
    h = hash(key)
    hashes[h] += 1
    if hashes[h] > MAX_SAME_HASH:
        raise error(f"{where}: more than {MAX_SAME_HASH} keys share one hash (building such a "
                    "dict takes quadratic time; an honest dict has one or two)")


def check_int_digits(digits, where, error):
    """A big int has at most MAX_INT_DIGITS decimal digits."""
    if digits > MAX_INT_DIGITS:
        raise error(f"{where}: an int of {digits} digits, more than {MAX_INT_DIGITS}")


def check_name(name, where, error):
    """A name (node, graph, module, member, keyword...) has at most
    MAX_NAME_CHARS characters."""
    if isinstance(name, str) and len(name) > MAX_NAME_CHARS:
        raise error(f"{where}: a name of {len(name)} characters {_short(name)}, more than "
                    f"{MAX_NAME_CHARS}")


def check_namedtuple(module, qualname, fields, where, error):
    """A namedtuple's module, qualname and fields are names, and it has at
    most MAX_NAMEDTUPLE_FIELDS fields."""
    for name in (module, qualname, *fields):
        check_name(name, where, error)
    if len(fields) > MAX_NAMEDTUPLE_FIELDS:
        raise error(f"{where}: a namedtuple of {len(fields)} fields, more than "
                    f"{MAX_NAMEDTUPLE_FIELDS}")


def check_namedtuple_types(n, where, error):
    """One archive makes at most MAX_NAMEDTUPLE_TYPES namedtuple classes."""
    if n > MAX_NAMEDTUPLE_TYPES:
        raise error(f"{where}: more than {MAX_NAMEDTUPLE_TYPES} distinct namedtuple types")


def check_table(n, table, error):
    """The op, module and tensor tables have at most MAX_TABLE_ENTRIES entries."""
    if n > MAX_TABLE_ENTRIES:
        raise error(f"header.{table}: {n} entries, more than {MAX_TABLE_ENTRIES}")


def check_graph_size(n, where, error):
    """A graph has at most MAX_GRAPH_EXPRS exprs, and as many nodes."""
    if n > MAX_GRAPH_EXPRS:
        raise error(f"{where}: {n} entries, more than a graph may have ({MAX_GRAPH_EXPRS})")


def check_call_args(n, where, error):
    """A stored call has at most MAX_CALL_ARGS positional or keyword arguments."""
    if n > MAX_CALL_ARGS:
        raise error(f"{where}: {n} arguments, more than {MAX_CALL_ARGS}")


def node_name(name, taken, where, error):
    """The name a graph node gets, NFKC-normalised (generated code names
    locals after nodes, and Python reads identifiers in NFKC form: "ﬁ" is
    "fi"), refused when empty or when ``taken`` (the graph's names so far)
    has it already."""
    if not isinstance(name, str) or not name:
        raise error(f"{where}: a node has a non-empty name")
    check_name(name, where, error)
    normal = python_name(name)
    if normal in taken:
        raise error(f"{where}: two nodes are named {_short(normal)} (in NFKC form, as Python "
                    "reads it)")
    return normal


def member_names(names, where, error):
    """A module's members (children, parameters, buffers, attributes:
    ``names``, in table order) are distinct in NFKC form: generated code
    reads them as attributes, and Python reads ``self.\ufb01`` as
    ``self.fi``, so two such members would be one name."""
    seen = {}
    for name in names:
        if not isinstance(name, str):
            continue            # (the member tables' own checks name what is wrong)
        other = seen.setdefault(python_name(name), name)
        if other != name:
            raise error(f"{where}: members {_short(other)} and {_short(name)} are one name to "
                        f"Python (NFKC form {_short(python_name(name))}); rename one of them")


def build_budget(stored_elements):
    """Tensor elements a load may allocate building modules: twice the
    elements the archive stores plus BUILD_SLACK_ELEMENTS."""
    return 2 * stored_elements + BUILD_SLACK_ELEMENTS


def check_build(n, left, where, error):
    """A constructor may allocate ``n`` elements when ``left`` remain of the
    build budget (a config asking for more is a corrupted one; an honest
    archive needs more only when many modules share one tensor)."""
    if n > left:
        raise error(f"{where} would allocate {n} tensor elements, more than the {left} a load "
                    f"of this archive may still allocate (twice its stored elements plus "
                    f"{BUILD_SLACK_ELEMENTS})")
