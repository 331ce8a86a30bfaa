"""Every bound the archive reader enforces, in one place.

Each keeps a corrupted or hostile file from costing more than its own size
or from exhausting the interpreter's stack; crossing one raises
:class:`mgtrace.ArchiveError` naming the bound. The writer refuses values
that would cross them, so whatever ``save`` writes, ``load`` reads.
"""

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
