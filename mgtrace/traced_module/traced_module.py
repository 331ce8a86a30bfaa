"""TracedModule and trace_module.

``trace_module(net, x)`` runs ``net(x)`` with the tracer on (in the mode
``net`` is in), checks the result against the eager run, and returns a :class:`TracedModule` with the same module tree and
state_dict: builtin modules are shared with ``net`` as leaves, every other
module becomes a TracedModule with one graph per call signature
(``argdef_graph_map``). Calling it runs the generated code of the graph that
matches the arguments.
"""
import copy
import inspect
import operator
import threading
import warnings
import weakref

import numpy as np

from mgtrace import random as _random
from mgtrace._core import Tensor, tensor as _tensor
from mgtrace._core import trace_hooks as _hooks
from mgtrace.module import module as _module_state
from mgtrace.module.builtin import is_builtin
from mgtrace.module.container import ModuleDict, ModuleList, Sequential
from mgtrace.module.module import _HOOKS as _module_hooks
from mgtrace.module.module import Module, _structure_leaves
from mgtrace.traced_module import checker as _checker
from mgtrace.traced_module import codegen
from mgtrace.traced_module.codegen import member
from mgtrace.traced_module.errors import GraphError, InferenceOnlyError, TraceWarning
from mgtrace.traced_module.expr import (Apply, CallFunction, CallMethod, Constant, GetAttr, Input,
                                        called_graph, is_node)
from mgtrace.traced_module.graph import InternalGraph, reset_ids
from mgtrace.traced_module.node import (ModuleNode, Node, TensorNode, ValueNode, python_name,
                                        unlink_users)
from mgtrace.traced_module.pytree import LeafDef, TreeMismatch, tree_flatten, tree_map
from mgtrace.traced_module.signature import bind_arguments, signature_of, type_name
from mgtrace.traced_module.tracer import Tracer

__all__ = ["TracedModule", "TracedSequence", "TracedDict", "trace_module"]

# the __dict__ entry of a TracedModule whose graphs are not read yet (a lazy archive load:
# serialization.traced_codec.LazyGraphs, which reads the graphs of the whole load at once and
# then removes the entries): the function that reads them. Such a module has no "_graphs" in
# its __dict__: its first ``_graphs`` lookup (a call, .graph, .code, an edit, a save, a
# deepcopy) or a change of any attribute but ``training`` reads them; nothing else pays for
# the lookup. (An entry of the module's own, not a table beside it: the reader holds the
# load's modules, so a module that is dropped unread is freed with it.)
PENDING_GRAPHS = "_graphs_pending"


def read_pending_graphs(tm):
    """Read the graphs of a lazily loaded ``tm`` (and its load's other
    modules) if they are not read yet; raises what the read raises
    (ArchiveError), every time it is tried."""
    load = tm.__dict__.get(PENDING_GRAPHS)
    if load is not None:
        load()


def _input_leaf(v):
    # a slot holds a tensor, or a number where a traced caller passed a value
    # computed from shapes (SymInt/SymFloat while tracing, plain when it runs)
    return isinstance(v, (Tensor, int, float)) and not isinstance(v, bool)


def _check_member_form(tm, name):
    """Refuse a member ``name`` that another member of ``tm`` has in NFKC form
    (generated code reads ``self.\ufb01`` as ``self.fi``; two such members
    would be one name to it, and save refuses them too)."""
    if not isinstance(name, str):
        return
    d = tm.__dict__
    form = None
    for table in (d.get("_modules", ()), d.get("_parameters", ()), d.get("_buffers", ()), d):
        for k in table:
            if k == name or not isinstance(k, str) or (k.isascii() and name.isascii()):
                continue                    # (ASCII names are their own NFKC form)
            form = python_name(name) if form is None else form
            if python_name(k) == form:
                where = d.get("_qualname", type(tm).__name__)
                raise ValueError(f"{where}: member {name!r} is member {k!r} as Python "
                                 f"reads identifiers (NFKC form {form!r}), so generated code "
                                 f"would read one for the other; choose another name")


# Module's own attributes (training, the tables) and flags its methods set
# (disable_quantize): not the user's
_MODULE_OWN = frozenset(vars(Module())) | {"quantize_disabled"}


def _warn_if_traced_constant(tm, name, value):
    """TraceWarning when ``tm.name = value`` rebinds a plain attribute (an
    int, a list...) of the traced module: the trace made what forward read
    of it a constant of the graph, so the new value changes nothing."""
    d = tm.__dict__
    if not isinstance(name, str) or name.startswith("_") or name not in d \
            or name in _MODULE_OWN or name in tm._NOT_STATE or not d.get("_graphs"):
        return
    old = d[name]
    if old is value or isinstance(old, (Tensor, Module)) or isinstance(value, (Tensor, Module)):
        return
    if any(isinstance(e, GetAttr) and e.name.split(".")[0] == name
           for g in d["_graphs"] for e in g._exprs):
        return              # a graph reads it at run time
    where = d.get("_qualname") or type(tm).__name__
    warnings.warn(TraceWarning(
        f"{where}.{name} = {_short(value)}: the traced graphs never read this attribute; what "
        f"forward read of it while tracing ({_short(old)}) is a constant of the graph, so the "
        "new value changes nothing. Trace the module again with the new value, or keep the "
        "value in a tensor attribute (a buffer), which the graph reads at every call"),
        stacklevel=3)


def _short(v):
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


class TracedModule(Module):
    """A module whose forward is one or more traced graphs.

    Made by :func:`trace_module` (not constructed directly). Submodules,
    parameters, buffers and plain attributes keep the traced module's
    names, so ``state_dict()`` has the same keys. Calling it binds the
    arguments as the traced forward did, picks the graph traced for that
    structure and runs its generated code (:attr:`code`).

    Attributes:
        graph: the InternalGraph (when there is exactly one).
        argdef_graph_map: ``{TreeDef of forward's bound arguments: graph}``.
        watch_node_value: ``{node: [values]}`` filled by runs after
            :meth:`set_watch_points`.

    The TracedModule of a Sequential or ModuleList is a
    :class:`TracedSequence` (``tm.layer1[0]`` works), of a ModuleDict a
    :class:`TracedDict`.
    """

    # bookkeeping attributes, not state (Module._structure_members skips them)
    _NOT_STATE = frozenset({"watch_points", "end_points", "watch_node_value"})

    def __setattr__(self, name, value):
        if name != "training":      # the graphs of a lazy load are read against the tree as loaded
            read_pending_graphs(self)
        _check_member_form(self, name)
        _warn_if_traced_constant(self, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        read_pending_graphs(self)
        super().__delattr__(name)

    def __getattr__(self, name):
        # only reached when normal lookup fails: "_graphs" of a lazy load not read yet
        if name == "_graphs" and PENDING_GRAPHS in self.__dict__:
            read_pending_graphs(self)
            graphs = self.__dict__.get("_graphs")
            if graphs is not None:      # (None: looked up by the read itself, none yet)
                return graphs
        return Module.__getattr__(self, name)

    # ------------------------------------------------------------ creation
    @classmethod
    def _shell(cls, module, qualname):
        tm = cls.__new__(cls)
        Module.__init__(tm)
        d = tm.__dict__
        for k, v in module.__dict__.items():
            if k == PENDING_GRAPHS:
                continue
            if k in ("_parameters", "_buffers", "_modules"):
                d[k].update(v)
            elif k == "_non_persistent_buffers":
                d[k] = set(v)
            else:
                d[k] = v
        d["_orig_name"] = type_name(module)
        # the class that was traced (kept in memory only: an archive stores its name)
        d["_orig_type"] = module.__dict__.get("_orig_type") if isinstance(module, TracedModule) \
            else type(module)
        d["_qualname"] = qualname
        d["_graphs"] = []
        try:
            d["_signature"] = signature_of(module)
        except (ValueError, TypeError, AttributeError):
            d["_signature"] = None
        d["_is_top"] = False
        # the module traced (in memory only, weakly): a submodule never called while
        # tracing is traced from it when an edit first calls it
        d["_orig_module"] = None if isinstance(module, TracedModule) else weakref.ref(module)
        d["watch_points"] = []
        d["end_points"] = []
        d["watch_node_value"] = {}
        d["_points_version"] = 0        # bumped by set_watch_points/set_end_points
        if _is_qat_module(module):
            d["_is_qat"] = True         # a plain attribute: archives keep it
        return tm

    @property
    def is_qat(self):
        """Whether this traced a user's subclass of a QAT module (MegEngine's
        ``is_qat``): :meth:`flatten` keeps such a module whole."""
        return self.__dict__.get("_is_qat", False)

    def _qualname_base(self):
        return self._qualname

    def _get_name(self):
        return self._orig_name

    def _graph_for(self, arg_def):
        for g in self._graphs:
            if g._in_def == arg_def:
                return g
        return None

    # ------------------------------------------------------------- graphs
    @property
    def graph(self):
        """The graph of forward; GraphError if there are several (use
        argdef_graph_map) or none (the module was never called)."""
        if len(self._graphs) != 1:
            raise GraphError(f"{self._qualname} has {len(self._graphs)} graphs (one per call "
                             "signature); pick one from argdef_graph_map")
        return self._graphs[0]

    @property
    def argspec(self):
        """forward's parameters as ``inspect.FullArgSpec`` (``self`` first),
        as MegEngine's TracedModule has them; None when unknown."""
        sig = self._signature
        if sig is None:
            return None
        P = inspect.Parameter
        params = list(sig.parameters.values())
        pos = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        defaults = tuple(p.default for p in pos if p.default is not P.empty)
        kwonly = [p for p in params if p.kind is P.KEYWORD_ONLY]
        kwdefaults = {p.name: p.default for p in kwonly if p.default is not P.empty}
        var = next((p.name for p in params if p.kind is P.VAR_POSITIONAL), None)
        varkw = next((p.name for p in params if p.kind is P.VAR_KEYWORD), None)
        return inspect.FullArgSpec(["self"] + [p.name for p in pos], var, varkw, defaults or None,
                                   [p.name for p in kwonly], kwdefaults or None, {})

    @property
    def argdef_graph_map(self):
        return {g._in_def: g for g in self._graphs}

    @property
    def argdef_outdef_map(self):
        return {g._in_def: g._out_def for g in self._graphs}

    # ------------------------------------------------------------ running
    def forward(self, *args, **kwargs):
        """Run the graph traced for this call signature.

        Args: as the traced module's forward: tensors (of any shape the
        traced ops accept) where tensors were traced, and the very same
        non-tensor values (ints, strings, None, ...) as when traced. A
        NumPy array where a tensor was traced is taken as
        ``mgtrace.tensor(array)`` (its own dtype), as the eager module's
        ops take it.

        Raises:
            TypeError: the arguments bind to forward's parameters in no way
                that a traced call did (the message names the parameter and
                the traced value).
            Exception: whatever an op raises for these inputs (a dtype or a
                shape it cannot take); the message then also says what the
                module was traced with and what this call passed
                (``traced with idx: int32[1, 8]; called with idx: float32[1, 8]``).
        """
        if "_inference_only" in self.__dict__:
            _refuse_if_training(self)   # put in training mode past train(): parent.train()
        graph = self._plain_graph(args) if not kwargs else None
        if graph is not None:
            leaves = args
        else:
            graph, leaves = self._select(args, kwargs)
        run = _running
        outer = not getattr(run, "depth", 0)
        run.depth = 1
        try:
            return self._run(graph, leaves)
        except Exception as e:
            if outer:       # the module the caller called, not a traced submodule
                _say_traced_with(e, self, graph, leaves)
            raise
        finally:
            if outer:
                run.depth = 0

    def _plain_graph(self, args):
        """The fast path of argument matching, for the common call
        ``tm(t1, ..., tn)`` with n tensors and no keywords: when a graph was
        traced with tensors for forward's first n parameters and the
        defaults for all the others, these arguments bind exactly to it
        (what bind and match would find, without their cost). None when no
        such graph exists or an argument is not a tensor."""
        plain = self.__dict__.get("_plain")
        if plain is None or plain[0] is not self._signature or plain[1] != len(self._graphs) \
                or plain[3] is not self._graphs:
            plain = self._plain_table()
        entry = plain[2].get(len(args))
        if entry is None or entry[0]._in_def is not entry[1]:      # edited since: no fast path
            return None
        for a in args:
            if not isinstance(a, Tensor):
                return None
        return entry[0]

    def _plain_table(self):
        """``(signature, number of graphs, {n: (graph, its in_def)}, the graph
        list)``."""
        sig = self._signature
        table = {}
        params = list(sig.parameters.values()) if sig is not None else []
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            for g in self._graphs:
                n = _plain_arity(g._in_def, params)
                if n is not None:
                    table.setdefault(n, (g, g._in_def))
        plain = (sig, len(self._graphs), table, self._graphs)
        self.__dict__["_plain"] = plain
        return plain

    def _select(self, args, kwargs):
        if not self._graphs:
            raise RuntimeError(f"{self._qualname} was never called while tracing, so it has no "
                               "graph to run")
        canon = tree_map(_tensor, bind_arguments(self._signature, args, kwargs, self._orig_name),
                         lambda v: isinstance(v, np.ndarray))
        errors = []
        for g in self._graphs:
            try:
                return g, g._in_def.match(canon, _input_leaf, "forward")
            except TreeMismatch as e:
                errors.append(str(e).replace("forward[", "argument ["))
        names = list(self._signature.parameters)
        msg = "; ".join(_name_args(e, names) for e in errors)
        raise TypeError(f"{self._orig_name}: these arguments match no traced call: {msg}")

    def _run(self, graph, leaves):
        """Run ``graph``'s compiled forward on ``leaves``. Outside tracing,
        with no forward hook on any module and no watch or end points, the
        attribute paths the graph reads from self are looked up once and
        reused until a module's tables change (``STATE_EPOCH``): a
        MobileNetV2 forward reads some 600 attributes, 0.4 ms of lookups."""
        fn = self._function(graph)
        if _hooks.current() is None and not _module_hooks:
            hoisted = graph.__dict__["_fn_cache"][3]
            if hoisted is not None:
                values = hoisted.values_for(self)
                if values is not None:
                    return hoisted.fn(self, values, *leaves)
        return fn(self, *leaves)

    def _function(self, graph):
        """The compiled forward of ``graph`` (with this module's watch and
        end points when it is the top module)."""
        fn = graph.__dict__.get("_fn_cache")
        if fn is None or fn[0] != graph._version or fn[1] != self._points_version:
            fn = self._compile(graph)
        return fn[2]

    def _compile(self, graph):
        watch = [n for n in self.watch_points if n.graph is graph]
        end = [n for n in self.end_points if n.graph is graph]
        fn = codegen.compile_graph(graph, watch, end, self._record_watch)
        hoisted = None if watch or end else _Hoisted(*codegen.compile_hoisted(graph))
        entry = (graph._version, self._points_version, fn, hoisted)
        graph.__dict__["_fn_cache"] = entry
        return entry

    def _record_watch(self, node_id, value):
        for n in self.watch_points:
            if n.id == node_id:
                self.watch_node_value.setdefault(n, []).append(value)

    def set_watch_points(self, nodes):
        """Record the values of ``nodes`` (of the top graph) in
        ``watch_node_value`` on every run, a graph input's as the run starts;
        ``[]`` clears."""
        nodes = _as_nodes(nodes)
        self._check_top_nodes(nodes, "set_watch_points")
        self.watch_points = nodes
        self.watch_node_value = {}
        self._points_version += 1

    def clear_watch_points(self):
        self.set_watch_points([])

    def set_end_points(self, nodes):
        """Make runs stop once ``nodes`` (of the top graph) are computed and
        return their values as a list; ``[]`` clears. A graph input is an
        end point too (its value as passed)."""
        nodes = _as_nodes(nodes)
        self._check_top_nodes(nodes, "set_end_points")
        self.end_points = nodes
        self._points_version += 1

    def clear_end_points(self):
        self.set_end_points([])

    def _check_top_nodes(self, nodes, what):
        if not self._is_top:
            raise GraphError(f"{what} works on the top TracedModule")
        for n in nodes:
            if n.graph not in self._graphs:
                where = n.graph.qualname if n.graph else "no graph"
                raise GraphError(f"{what}: {n!r} is in {where}, not the top graph; flatten() "
                                 "the module first")

    # ------------------------------------------------------------ reading
    @property
    def code(self):
        """Generated Python source of forward (each graph's, separated by a
        blank line when there are several)."""
        return "\n".join(codegen.generate(g)[0] for g in self._graphs)

    def print_readable(self, file=None):
        """Print the generated code of this module and every traced submodule."""
        out = []
        for m in type(self).modules(self):
            if isinstance(m, TracedModule) and m._graphs:
                q = m._qualname if m._qualname.isprintable() else repr(m._qualname)
                out.append(f"# {q} ({m._orig_name})\n{m.code}")
        text = "\n".join(out)
        print(text, file=file)
        return text

    # ---------------------------------------------------------- transforms
    def delete_unused_submodules(self):
        """Delete the submodules no graph uses any more (after replacing or
        cutting out calls), so that state_dict and saved archives drop their
        weights. A traced submodule that is called keeps what its own graphs
        use. Returns the deleted submodules' paths (``["layer4", ...]``).

        >>> # g.reset_outputs(node); g.compile(); tm.delete_unused_submodules()
        """
        deleted = []
        _prune_unused(self, "", *_self_reads(self), "", deleted)
        return deleted

    def flatten(self):
        """A new TracedModule with one flat graph per signature: every call
        of a traced submodule is inlined, builtin modules stay calls, read
        by their full path (``layer1.0.conv1``, once however often they are
        called); node names get the path as a prefix (``layer1_0_relu``).
        Same outputs and state_dict keys; it is a deep copy (parameters are
        copied, not shared with this module), and its graphs pass lint().
        Watch and end points move to their nodes in the flat graph (the
        values recorded so far are not copied)."""
        new = copy.deepcopy(self)
        env = {}
        new._graphs = [_inline_graph(g, new, env) for g in new._graphs]
        for g in new._graphs:
            g.lint()
        # (two points can become one node: a submodule that returns its input)
        new.watch_points = list({id(m): m for m in (_mapped(env, n) for n in new.watch_points)}.values())
        new.end_points = [_mapped(env, n) for n in new.end_points]
        new.watch_node_value = {}
        new._points_version += 1
        reset_ids(new)
        return new

    def train(self, mode=True):
        """Set ``training`` on self and every descendant; returns self.

        Raises:
            InferenceOnlyError: ``mode`` is True and this module is what
                :func:`~mgtrace.traced_module.optimize` made for inference
                from one in eval mode (it folded BatchNorms, dropped
                Dropout...): in training mode it would still compute the
                eval-mode function. The message names each pass and what
                it removed. (``eval()`` and ``train(False)`` always work.)
        """
        if mode is True:
            _refuse_training(self)
        return super().train(mode)

    def to_folder(self, path, module_name="Net"):
        """Write this module as a Python package (see :mod:`mgtrace.traced_module.folder`)."""
        # folder renders TracedModules, so it imports this module: a real cycle
        from mgtrace.traced_module.folder import to_folder
        return to_folder(self, path, module_name)

    def __copy__(self):
        # a lazy load's graphs first: a shallow copy of a module not read yet had its
        # bookkeeping entry but was no module of the load, so its graphs were never read
        read_pending_graphs(self)
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        read_pending_graphs(self)
        new = Module.__deepcopy__(self, memo)
        for g in new._graphs:
            g.__dict__.pop("_fn_cache", None)
        return new


def _refuse_if_training(tm):
    """_refuse_training when ``tm`` is in training mode (a function of its
    own: forward's code must not read ``training``, see tracer._reads_training)."""
    if tm.training:
        _refuse_training(tm)


def _refuse_training(tm):
    """InferenceOnlyError when ``tm`` is what optimize() made for inference
    (its ``_inference_only`` record: ``{pass: {what: count}}``)."""
    record = tm.__dict__.get("_inference_only")
    if not record:
        return
    what = "; ".join(f"{p} removed " + ", ".join(f"{n} {k}{'s' * (n != 1)}" for k, n in gone.items())
                     for p, gone in record.items())
    raise InferenceOnlyError(
        f"{tm._qualname} cannot train: optimize() made it for inference from a module in "
        f"eval mode ({what}), so in training mode it would still compute the eval-mode "
        "function. Call train() before optimize(tm, \"all\") (it then runs only the passes "
        "that keep training behaviour), or train the module before optimizing it.")


class _Hoisted:
    """A graph's forward compiled to read self's attribute ``paths`` from a
    tuple (codegen.compile_hoisted), and ``plan``: ``(epoch, module,
    values)``, the paths' values on the module that last ran it, read when
    STATE_EPOCH was ``epoch`` (one tuple, replaced whole: threads that run
    the module together never see one's epoch with another's values)."""
    __slots__ = ("fn", "paths", "plan")

    def __init__(self, fn, paths):
        self.fn, self.paths, self.plan = fn, paths, (-1, None, None)

    def values_for(self, tm):
        """The paths' values on ``tm`` (None: run the plain function)."""
        epoch = _module_state.STATE_EPOCH        # before reading: a change after it bumps again
        plan = self.plan
        if plan[0] != epoch or plan[1] is not tm:
            plan = (epoch, tm, _resolve_paths(tm, self.paths))
            self.plan = plan
        return plan[2]


def _resolve_paths(tm, paths):
    """The values of ``tm``'s attribute ``paths`` (``"features.0.weight"``),
    or None when one is not a chain of parameters, buffers and children that
    the generated code's own lookups would find in the modules' tables (a
    plain attribute, a structure member, a name a class attribute hides):
    only table changes bump STATE_EPOCH, so only those reads may be reused.
    (A write that goes around the tables' methods, ``dict.__setitem__(
    module._parameters, ...)``, is seen at the next change that does not.)"""
    out = []
    for path in paths:
        obj = tm
        for part in path.split("."):
            if not isinstance(obj, Module):
                return None
            d = obj.__dict__
            if part in d or (hasattr(type(obj), part) and not codegen._class_member(part)):
                return None
            for table in ("_parameters", "_buffers", "_modules"):
                t = d[table]
                if part in t:
                    obj = t[part]
                    break
            else:
                return None
        out.append(obj)
    return tuple(out)


def _held(tm):
    """What a container TracedModule holds, in order: for one made from a
    plain list, tuple or dict (MegEngine's rule), its modules and tensors by
    key; for a Sequential, ModuleList or ModuleDict, its children."""
    if tm.__dict__.get("_orig_name") not in ("list", "tuple", "dict"):
        return tm._modules
    merged = {**tm._modules, **tm._parameters, **tm._buffers}
    if tm._orig_name == "dict":
        return merged
    return dict(sorted(merged.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1))


class TracedSequence(TracedModule):
    """The TracedModule of a Sequential or ModuleList, or of a plain list or
    tuple of modules and tensors held as an attribute: also reads like one
    (``len``, iteration, ``tm[i]``; a slice gives a list of the children)."""

    def __len__(self):
        return len(_held(self))

    def __iter__(self):
        return iter(list(_held(self).values()))

    def __getitem__(self, idx):
        mods = list(_held(self).values())
        if isinstance(idx, slice):
            return mods[idx]
        try:
            return mods[operator.index(idx)]
        except IndexError:
            raise IndexError(f"index {idx} is out of range for {self._qualname} "
                             f"(length {len(mods)})") from None


class TracedDict(TracedModule):
    """The TracedModule of a ModuleDict, or of a plain dict of modules and
    tensors held as an attribute: also reads like one (``tm[key]``, ``in``,
    ``len``, iteration over keys, ``keys/values/items``)."""

    def __len__(self):
        return len(_held(self))

    def __iter__(self):
        return iter(list(_held(self)))

    def __contains__(self, key):
        return key in _held(self)

    def __getitem__(self, key):
        held = _held(self)
        if key not in held:
            raise KeyError(f"{key!r} is not in {self._qualname} (keys: {list(held)})")
        return held[key]

    def keys(self):
        return _held(self).keys()

    def values(self):
        return _held(self).values()

    def items(self):
        return _held(self).items()


def _shell_class(module):
    if isinstance(module, (TracedSequence, TracedDict)):    # re-tracing keeps what reads like one
        return type(module)
    if isinstance(module, (Sequential, ModuleList)):
        return TracedSequence
    if isinstance(module, ModuleDict):
        return TracedDict
    return TracedModule


def _plain_arity(in_def, params):
    """n when ``in_def`` (of forward's bound arguments) is n tensor slots for
    the first n parameters, positional ones, then each other parameter's
    default as a constant; else None."""
    kids = in_def.children
    if in_def.type is not tuple or len(kids) != len(params):
        return None
    n = 0
    while n < len(kids) and isinstance(kids[n], LeafDef) and kids[n].is_slot \
            and params[n].kind in (params[n].POSITIONAL_ONLY, params[n].POSITIONAL_OR_KEYWORD):
        n += 1
    for c, p in zip(kids[n:], params[n:]):
        if p.default is p.empty or not isinstance(c, LeafDef) or c != LeafDef(p.default):
            return None
    return n


_running = threading.local()     # .depth: 1 while a TracedModule call runs in this thread


def _say_traced_with(e, tm, graph, leaves):
    """Add to ``e``'s message what ``graph`` was traced with and what this
    call passed: a loaded model called with a wrong shape or dtype then
    says what it expects. A message kept in ``args`` is extended in place;
    otherwise (e.g. KeyError's quoted key) the text goes into a note."""
    def port(name, v):
        if isinstance(v, (Tensor, TensorNode)) and v.shape is not None:
            return f"{name}: {_dtype_name(v.dtype)}{list(v.shape)}"
        return f"{name}: {type(v).__name__}"
    nodes = graph._inputs[1:]
    traced = ", ".join(port(n.name, n) for n in nodes)
    called = ", ".join(port(n.name, v) for n, v in zip(nodes, leaves))
    if traced == called:        # the same inputs: nothing to tell
        return
    text = f"{tm._orig_name} was traced with {traced}; this call passed {called}"
    if len(e.args) == 1 and isinstance(e.args[0], str) and str(e) == e.args[0]:
        e.args = (f"{e.args[0]} ({text})",)
    else:
        e.add_note(text)


def _dtype_name(dtype):
    return getattr(dtype, "name", None) or str(dtype)


def _name_args(msg, names):
    for i, n in enumerate(names):
        msg = msg.replace(f"argument [{i}]", n)
    return msg


def _as_nodes(nodes):
    if isinstance(nodes, Node):
        return [nodes]
    nodes = list(nodes)
    for n in nodes:
        if not isinstance(n, Node):
            raise TypeError(f"expected graph Nodes, got {type(n).__name__}")
    return nodes


# ------------------------------------------------------------------ trace
def _convert(module, path, root_name, converted):
    """The module tree of the TracedModule: builtins shared, others shells."""
    got = converted.get(id(module))
    if got is not None:
        return got
    if is_builtin(module):
        converted[id(module)] = module
        return module
    tm = _shell_class(module)._shell(module, f"{root_name}.{path}" if path else root_name)
    converted[id(module)] = tm
    for name, child in module._modules.items():
        if child is not None:
            tm._modules[name] = _convert(child, f"{path}.{name}" if path else name,
                                         root_name, converted)
    held = {p.split(".", 1)[0] for p, _ in module._structure_members()}
    for name in [k for k in module.__dict__ if k in held]:
        # a list/tuple/dict of modules or tensors becomes a container module, so that
        # graphs read its members by path (``self.layers.0``) and it saves as one
        tm._modules[name] = _structure_shell(module.__dict__[name],
                                             f"{path}.{name}" if path else name,
                                             root_name, converted)
        del tm.__dict__[name]
    return tm


def _is_qat_module(module):
    from mgtrace.module.qat.module import QATModule
    return isinstance(module, QATModule) or (isinstance(module, TracedModule)
                                             and module.is_qat)


def _plain_quant_children(mod):
    """Before a trace, MegEngine's ``_check_qat_module`` on every QAT module
    of ``mod`` (see mgtrace.module.qat.module.plain_quant_children): the
    changes are made on the caller's modules for the trace only (the
    trace's ModuleState puts them back), or, for a builtin QAT module
    (shared with the TracedModule), on a copy that takes its place."""
    from mgtrace.module.qat.module import QATModule, plain_quant_children
    copies = {}

    def plain(m):
        if id(m) in copies:
            return copies[id(m)]
        changes = plain_quant_children(m)
        target = m
        if changes and is_builtin(m):
            target = type(m).__new__(type(m))
            target.__dict__.update(m.__dict__)
            for table in ("_parameters", "_buffers", "_modules"):
                target.__dict__[table] = dict(m.__dict__[table])
        for k, v in changes.items():
            setattr(target, k, v)
        copies[id(m)] = target
        return target

    if isinstance(mod, QATModule):
        plain(mod)
    for parent in list(type(mod).modules(mod)):
        for name, child in list(parent._modules.items()):
            if isinstance(child, QATModule):
                parent._modules[name] = plain(child)


def _structure_shell(value, path, root_name, converted):
    """A TracedSequence (list, tuple) or TracedDict (dict) holding what
    ``value`` holds: modules converted as children, Parameters as
    parameters, other Tensors as buffers, inner containers as shells."""
    cls = TracedDict if isinstance(value, dict) else TracedSequence
    shell = cls._shell(Module(), f"{root_name}.{path}")
    d = shell.__dict__
    d["_orig_name"] = type(value).__name__ if type(value) in (list, tuple, dict) else \
        ("dict" if isinstance(value, dict) else "tuple")
    d["_orig_type"] = type(value)
    d["_signature"] = None
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        key = str(k)
        if isinstance(v, Module):
            shell._modules[key] = _convert(v, f"{path}.{key}", root_name, converted)
        elif isinstance(v, Tensor):
            table = shell._parameters if type(v).__name__ == "Parameter" else shell._buffers
            table[key] = v
        elif isinstance(v, (list, tuple, dict)) and v and _structure_leaves(key, v):
            shell._modules[key] = _structure_shell(v, f"{path}.{key}", root_name, converted)
    return shell


def trace_module(mod, *args, **kwargs):
    """Trace ``mod(*args, **kwargs)`` into a TracedModule.

    The module is traced in the mode it is in (``train()`` or ``eval()``,
    as MegEngine does): a module traced in training mode keeps training
    semantics (a BatchNorm updates its running statistics on every call of
    the TracedModule). The call runs for real; Python control flow follows
    the path taken (a branch on a tensor's value warns with TraceWarning).
    Non-tensor arguments are fixed by the trace: calling the result with
    other values raises TypeError. Tensors made inside forward
    (``mgtrace.tensor(...)``, ``Tensor(...)``, ``mgtrace.tensor(x.shape)``)
    are recorded, so each call makes them afresh.

    Then, as MegEngine's default checker does, the new TracedModule runs on
    (copies of) the same inputs and its outputs are compared with the eager
    ones (see :mod:`mgtrace.traced_module.checker`:
    ``disable_default_checker()``, ``enable_expr_checker()``). Finally
    ``mod`` is put back exactly as it was before the call: its mode, its
    buffers (a training-mode BatchNorm's statistics), its attributes.

    Args:
        mod: an mgtrace.module.Module that is not itself a builtin leaf.
        *args, **kwargs: forward's arguments: Tensors, and pytrees (tuple,
            list, dict, namedtuple) of Tensors and constants.

    Returns:
        TracedModule: same state_dict as ``mod`` (builtin modules and all
        parameters and buffers are shared with it, not copied).

    Raises:
        TypeError: ``mod`` is not a Module, or is a builtin module.
        TraceCheckError: the TracedModule does not reproduce the eager
            result (the message names the first differing output, or expr).
        The error of forward itself, with a note naming the module path and
        the source line being traced.

    >>> import mgtrace as mt, mgtrace.module as M, mgtrace.functional as F
    >>> class Net(M.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = M.Linear(4, 2)
    ...     def forward(self, x):
    ...         return F.relu(self.fc(x.reshape(x.shape[0], -1)))
    >>> tm = mt.trace_module(Net(), F.ones((1, 2, 2)))      # traced at batch 1
    >>> tm(F.ones((3, 2, 2))).shape                          # runs at batch 3
    (3, 2)
    >>> print(tm.code)
    def forward(self, x):
        x_shape_0, x_shape_1, x_shape_2 = x.shape
        reshape = x.reshape((x_shape_0, -1))
        fc = self.fc
        fc_out = fc(reshape)
        del reshape
        relu = F.relu(fc_out)
        del fc_out
        return relu
    <BLANKLINE>
    """
    if not isinstance(mod, Module):
        raise TypeError(f"trace_module takes an mgtrace.module.Module, not {type(mod).__name__}")
    if is_builtin(mod):
        raise TypeError(f"{type(mod).__name__} is a builtin module (a leaf): put it inside a "
                        "Module of your own (e.g. mgtrace.module.Sequential(m)) to trace it")
    root_name = type_name(mod)
    args, kwargs = _distinct_inputs(mod, args, kwargs)
    canon = bind_arguments(signature_of(mod), args, kwargs, root_name)
    _refuse_arrays(canon, signature_of(mod))
    check = _checker.default_check_on() or _checker.expr_check_on()
    state = _checker.ModuleState(mod)
    inputs = _checker.copy_inputs((args, kwargs)) if check else None
    try:
        _plain_quant_children(mod)
        converted = {}
        root = _convert(mod, "", root_name, converted)
        root._is_top = True
        tracer = Tracer(mod, converted, record_values=_checker.expr_check_on())
        tracer.before_write = state.before_write
        leaves, arg_def = tree_flatten(canon, lambda v: isinstance(v, Tensor))
        with tracer.active():
            out = tracer._trace_into(mod, root, arg_def, leaves, args, kwargs)
        for m in type(root).modules(root):
            if isinstance(m, TracedModule):
                for g in m._graphs:
                    _drop_unused_shapes(g)
        for g in root._graphs:
            g.lint()
        reset_ids(root)
        if check:
            after = _random.get_rng().get_state()
            _check_traced(root, out, inputs, state, tracer.values)
            _random.get_rng().set_state(after)
    finally:
        state.restore(rng=False)
    return root


def _distinct_inputs(mod, args, kwargs):
    """(args, kwargs) with each input that is one of ``mod``'s own tensors
    (a parameter or buffer passed as an argument) replaced by a new view of
    it: the tracer tells tensors apart by identity, and would read every use
    of the module's tensor in forward as the input."""
    own = {id(t) for _, t in mod.named_parameters()} | {id(t) for _, t in mod.named_buffers()}
    leaves, tdef = tree_flatten((args, kwargs), lambda v: isinstance(v, Tensor))
    if not any(isinstance(v, Tensor) and id(v) in own for v in leaves):
        return args, kwargs
    return tdef.unflatten([v.detach() if isinstance(v, Tensor) and id(v) in own else v
                           for v in leaves])


def _check_traced(root, eager_out, inputs, state, values):
    """Run ``root`` on ``inputs`` from the state the trace started in and
    compare its outputs (and, with ``values``, every node) with the trace."""
    want, out_def = tree_flatten(eager_out, lambda v: isinstance(v, (Tensor, int, float)))
    want = [_checker.snapshot(v) if isinstance(v, Tensor) else
            (int(v) if isinstance(v, int) and not isinstance(v, bool) else v) for v in want]
    state.restore()
    args, kwargs = inputs
    if values is None:
        got = root(*args, **kwargs)
    else:
        for n, v in values.values():
            if isinstance(n, TensorNode):
                n._value = Tensor(v) if isinstance(v, np.ndarray) else v
        got = _run_watching_all(root, args, kwargs, _checker.ExprCheck(values))
    _checker.check_outputs(root, got, want, out_def)


def _run_watching_all(root, args, kwargs, check):
    """``root(*args, **kwargs)`` with every graph of the tree compiled to
    report each node's value to ``check``."""
    graphs = [(m, g) for m in type(root).modules(root) if isinstance(m, TracedModule)
              for g in m._graphs]
    for m, g in graphs:
        fn = codegen.compile_graph(g, check.watched(g), (), check.watcher(g))
        g.__dict__["_fn_cache"] = (g._version, m._points_version, fn, None)
    try:
        return root(*args, **kwargs)
    finally:
        for _, g in graphs:
            g.__dict__.pop("_fn_cache", None)


def _self_reads(tm):
    """``(used, targets)``: the attribute paths ``tm``'s graphs read from self
    (targets) and every prefix of them (used)."""
    targets = {e.name for g in tm._graphs for e in g._exprs
               if isinstance(e, GetAttr) and e.args[0] is g._inputs[0]}
    used = set()
    for path in targets:
        parts = path.split(".")
        used.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return used, targets


def _prune_unused(mod, rel, used, targets, prefix, deleted):
    """Delete children of ``mod`` (at path ``rel`` below the graph owner) whose
    paths the owner's graphs never read. A traced child the graphs read as a
    whole (and call) is pruned by its own graphs instead."""
    for name, child in list(mod._modules.items()):
        path = f"{rel}.{name}" if rel else name
        if child is None:
            continue
        if path not in used:
            del mod._modules[name]
            deleted.append(prefix + path)
        elif isinstance(child, TracedModule) and child._graphs and path in targets:
            _prune_unused(child, "", *_self_reads(child), f"{prefix}{path}.", deleted)
        elif isinstance(child, TracedModule):     # only on the way to deeper attributes
            _prune_unused(child, path, used, targets, prefix, deleted)


def _refuse_arrays(canon, sig):
    """A NumPy array among forward's arguments would become a constant of
    the trace (and make later calls fail to match): refuse it up front."""
    for name, value in zip(sig.parameters, canon):
        for leaf in tree_flatten(value, lambda v: isinstance(v, np.ndarray))[0]:
            raise TypeError(f"trace_module: argument {name!r} holds a numpy.ndarray "
                            f"{leaf.shape} {leaf.dtype}; pass mgtrace.tensor(array) so that it "
                            "is an input of the graph, not a constant")


def _drop_unused_shapes(g):
    """Shape reads, and int arithmetic on them, whose results were never used
    leave no trace (walked backwards, so a chain of unused steps goes too)."""
    keep, dropped = [], []
    lost = {}               # id(node) -> how many of its users were dropped so far
    outputs = {id(o) for o in g._outputs}
    for e in reversed(g._exprs):
        unused = e.outputs and not any(len(o.users) > lost.get(id(o), 0) or id(o) in outputs
                                       for o in e.outputs)
        shape_math = (isinstance(e, CallMethod) and e.method == "shape") or (
            isinstance(e, CallFunction) and all(isinstance(o, ValueNode) for o in e.outputs))
        if unused and shape_math:
            dropped.append(e)
            for nid in {id(n) for n in e._inputs}:
                lost[nid] = lost.get(nid, 0) + 1
            for o in e.outputs:
                g._names.pop(o.name, None)
        else:
            keep.append(e)
    unlink_users(dropped)   # once at the end: a node read by thousands of them is walked once
    g._exprs = keep[::-1]


# ---------------------------------------------------------------- flatten
# flatten() copies the module, then rebuilds each top graph by walking it:
# a call of a traced submodule is replaced by the exprs of the callee's graph
# (recursively), with the callee's input nodes mapped to the caller's
# argument nodes. ``env`` maps id(node of a source graph) to its node in the
# flat graph, or to (path, TracedModule) for a traced module node; the key
# ("getattr", path) remembers the flat node of each attribute already read.

def _inline_graph(g, root, env):
    """``g`` (a graph of ``root``) with its traced submodules' calls
    inlined; ``env`` gets each node of ``g`` mapped to its flat copy."""
    flat = InternalGraph(g._name, g._qualname, owner=root)
    self_node = flat._add_node(ModuleNode(name="self", owner=root), "self")
    flat._add_input(self_node)
    env[id(g._inputs[0])] = ("", root)
    for n in g._inputs[1:]:
        env[id(n)] = flat._add_input(flat._add_node(_copy_node(n), n.name))
    _inline_into(g, "", env, flat, self_node, root)
    flat._outputs = [_mapped(env, n) for n in g._outputs]
    flat._in_def, flat._out_def = g._in_def, g._out_def
    return flat


def _mapped(env, n):
    v = env[id(n)]
    if isinstance(v, tuple):
        raise GraphError(f"flatten: {n!r} is a traced module used as a value")
    return v


def _copy_node(n, name=None):
    if isinstance(n, TensorNode):
        return TensorNode(name=name or n.name, shape=n.shape, dtype=n.dtype)
    if isinstance(n, ValueNode):
        return ValueNode(name=name or n.name, value=n.value)
    return ModuleNode(name=name or n.name, owner=n.owner)


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _inline_into(g, prefix, env, flat, self_node, root):
    """Append the exprs of ``g`` (the graph of the module at ``prefix``) to
    ``flat``, inlining the calls of traced submodules."""
    for e in g._exprs:
        if isinstance(e, Input):
            continue
        if isinstance(e, GetAttr) and isinstance(env.get(id(e.args[0])), tuple):
            _inline_getattr(e, env, flat, self_node, root)
            continue
        sub = called_graph(e)
        callee = env.get(id(e.args[0])) if isinstance(e, CallMethod) else None
        if sub is not None and isinstance(callee, tuple) and not callee[1].is_qat:
            path, tm = callee
            args, kwargs = _map_values(e.args[1:], e.kwargs, env)
            canon = bind_arguments(tm._signature, args, kwargs, tm._orig_name)
            leaves = tree_flatten(canon, is_node)[0]
            env[id(sub._inputs[0])] = (path, tm)
            for n, v in zip(sub._inputs[1:], leaves):
                env[id(n)] = v
            _inline_into(sub, path, env, flat, self_node, root)
            for o, so in zip(e.outputs, sub._outputs):
                env[id(o)] = _mapped(env, so)
            continue
        args, kwargs = _map_values(e.args, e.kwargs, env)
        _emit(flat, _clone(e, args, kwargs), e, env, lambda o: _join(prefix, o.name))


def _inline_getattr(e, env, flat, self_node, root):
    """``getattr(module, name)``: a traced module is only remembered (its
    calls get inlined); anything else is read from the root by its full
    path, once (a shared module is one node for all its calls)."""
    path = _join(env[id(e.args[0])][0], e.name)
    out = e.outputs[0]
    target = _getpath(root, path)
    if isinstance(out, ModuleNode) and isinstance(target, TracedModule) and not target.is_qat:
        env[id(out)] = (path, target)
        return
    seen = env.get(("getattr", path))
    if seen is not None:
        env[id(out)] = seen
        return
    _emit(flat, GetAttr(self_node, path), e, env, lambda o: path, owner=target)
    env[("getattr", path)] = env[id(out)]


def _getpath(root, path):
    obj = root
    for p in path.split("."):
        obj = member(obj, p)
    return obj


def _map_values(args, kwargs, env):
    def look(n):
        v = env[id(n)]
        if isinstance(v, tuple):
            raise GraphError(f"flatten: cannot pass traced module {v[1]._qualname} as a value")
        return v
    leaves, tdef = tree_flatten((tuple(args), kwargs), is_node)
    return tdef.unflatten([look(n) for n in leaves])


def _clone(e, args, kwargs):
    if isinstance(e, CallFunction):
        return CallFunction(e.func, args, kwargs)
    if isinstance(e, CallMethod):
        ne = CallMethod(args[0], e.method, args[1:], kwargs)
        ne.arg_def = e.arg_def
        return ne
    if isinstance(e, Apply):
        return Apply(e.op, args, kwargs)
    if isinstance(e, Constant):
        return Constant(e.value, e.name)
    if isinstance(e, GetAttr):
        return GetAttr(args[0], e.name)
    raise GraphError(f"flatten: unexpected expr {e!r}")


def _emit(flat, ne, e, env, name_of, owner=None):
    """Append ``ne`` (the flat copy of ``e``) with copies of e's output
    nodes, named ``name_of(node)`` with dots made underscores
    (``layer1.0.relu`` -> ``layer1_0_relu``)."""
    ne.out_def = e.out_def
    ne.source = e.source
    outs = []
    for o in e.outputs:
        n = _copy_node(o, name_of(o).replace(".", "_"))
        if owner is not None and isinstance(n, ModuleNode):
            n.owner = owner
        flat._add_node(n)
        n.expr = ne
        env[id(o)] = n
        outs.append(n)
    ne.outputs = outs
    flat._append(ne)
